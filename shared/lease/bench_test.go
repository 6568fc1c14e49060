package lease_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/lease"
	"github.com/sockfleet/sockfleet/shared/local/ddbtest"
	"github.com/sockfleet/sockfleet/shared/local/localddb"
	"github.com/sockfleet/sockfleet/shared/registry"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

func benchStore(b *testing.B, e *ddbtest.Env, db lease.DynamoDB) *lease.Store {
	s, err := lease.New(db, lease.Config{Table: e.Table})
	if err != nil {
		b.Fatal(err)
	}
	return s
}

func putN(b *testing.B, e *ddbtest.Env, n int) {
	for i := range n {
		it := codec.EncodeConnection(codec.Connection{ID: fmt.Sprint("b", i), DesiredState: schema.Started, WSURL: "ws://127.0.0.1:1/s"})
		if _, err := e.DB.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: &e.Table, Item: it}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAcquire measures acquires of unowned items, one caller and 16 concurrent.
func BenchmarkAcquire(b *testing.B) {
	for _, par := range []int{1, 16} {
		b.Run(fmt.Sprintf("concurrency-%d", par), func(b *testing.B) {
			e := ddbtest.New(b)
			putN(b, e, b.N)
			s := benchStore(b, e, e.DB)
			var next atomic.Int64
			b.SetParallelism(par)
			b.ResetTimer()
			runPar(b, par, func() {
				i := next.Add(1) - 1
				if _, err := s.Acquire(context.Background(), fmt.Sprint("b", i), "w1"); err != nil {
					b.Error(err)
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "acquires/s")
		})
	}
}

// BenchmarkRenew measures renews (with a checkpoint) of 64 held leases.
func BenchmarkRenew(b *testing.B) {
	for _, par := range []int{1, 16} {
		b.Run(fmt.Sprintf("concurrency-%d", par), func(b *testing.B) {
			e := ddbtest.New(b)
			const n = 64
			putN(b, e, n)
			s := benchStore(b, e, e.DB)
			leases := make([]lease.Lease, n)
			for i := range n {
				l, err := s.Acquire(context.Background(), fmt.Sprint("b", i), "w1")
				if err != nil {
					b.Fatal(err)
				}
				leases[i] = l
			}
			var next atomic.Int64
			b.ResetTimer()
			runPar(b, par, func() {
				i := next.Add(1)
				if _, err := s.Renew(context.Background(), leases[i%n], lease.Progress{LastSeq: i}); err != nil {
					b.Error(err)
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "renews/s")
		})
	}
}

// runPar runs f b.N times on par goroutines.
func runPar(b *testing.B, par int, f func()) {
	var left atomic.Int64
	left.Store(int64(b.N))
	done := make(chan struct{})
	for range par {
		go func() {
			defer func() { done <- struct{}{} }()
			for left.Add(-1) >= 0 {
				f()
			}
		}()
	}
	for range par {
		<-done
	}
}

// BenchmarkWriteUnitsPerConnectionHour replays one connection-hour of heartbeats,
// for sockfleet at its defaults and for the seed's design, against the real engine,
// and reports the write units DynamoDB bills (index writes included), as measured by
// ReturnConsumedCapacity. Not a speed benchmark: the figures are per hour, not per op.
func BenchmarkWriteUnitsPerConnectionHour(b *testing.B) {
	const connsPerWorker = 100 // the worker's default MAX_CONNECTIONS
	renewEvery := 20 * time.Second
	b.Run("sockfleet", func(b *testing.B) {
		e := ddbtest.New(b)
		var m localddb.Meter
		db := e.Client(nil, m.Option)
		putN(b, e, 1)
		s := benchStore(b, e, db)
		reg := registry.Registry{DB: db, Table: e.Table}
		ctx := context.Background()
		ticks := int(time.Hour / renewEvery)
		var leaseUnits, registryUnits float64
		for range b.N {
			m.Reset()
			l, err := s.Acquire(ctx, "b0", "w1")
			if err != nil {
				b.Fatal(err)
			}
			m.Reset() // acquisition is once per ownership, not per hour
			for i := range ticks {
				if _, err := s.Renew(ctx, l, lease.Progress{LastSeq: int64(i)}); err != nil {
					b.Fatal(err)
				}
			}
			_, leaseUnits = m.Units()
			m.Reset()
			for i := range ticks {
				w := codec.Worker{ID: "w1", Addr: "10.0.0.1:8080", Capacity: connsPerWorker, Load: connsPerWorker, HeartbeatExpiresAtMs: int64(i)}
				if err := reg.Put(ctx, w); err != nil {
					b.Fatal(err)
				}
			}
			_, registryUnits = m.Units()
			if err := s.Release(ctx, l, lease.Progress{}); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(leaseUnits, "lease-WCU/conn-h")
		b.ReportMetric(registryUnits/connsPerWorker, "registry-WCU/conn-h")
		b.ReportMetric(leaseUnits+registryUnits/connsPerWorker, "total-WCU/conn-h")
	})
	b.Run("seed", func(b *testing.B) {
		e := ddbtest.New(b)
		ctx := context.Background()
		table := e.Table + "_seed"
		if err := createSeedTable(ctx, e.DB, table); err != nil {
			b.Fatal(err)
		}
		var m localddb.Meter
		db := e.Client(nil, m.Option)
		key := map[string]types.AttributeValue{schema.AttrPK: codec.S("CONN#s")}
		if _, err := e.DB.PutItem(ctx, &dynamodb.PutItemInput{TableName: &table, Item: map[string]types.AttributeValue{
			schema.AttrPK: codec.S("CONN#s"), "desired_state": codec.S("STARTED"), "lease_owner": codec.S("w1"),
			"lease_expires_at_ms": codec.N(1), "ws_url": codec.S("ws://h/s")}}); err != nil {
			b.Fatal(err)
		}
		ticks := int(time.Hour / (5 * time.Second)) // the seed renews every 5 s
		var units float64
		var parts map[string]float64
		for range b.N {
			m.Reset()
			for i := range ticks {
				// The seed's renew_lease, verbatim in effect.
				_, err := db.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: &table, Key: key,
					UpdateExpression:          aws.String("SET lease_expires_at_ms = :e"),
					ConditionExpression:       aws.String("lease_owner = :w"),
					ExpressionAttributeValues: map[string]types.AttributeValue{":e": codec.N(int64(i + 2)), ":w": codec.S("w1")}})
				if err != nil {
					b.Fatal(err)
				}
			}
			_, units = m.Units()
			parts = m.Parts()
		}
		b.ReportMetric(units, "total-WCU/conn-h")
		b.ReportMetric(parts["desired_state-lease_expires_at_ms-index"], "index-WCU/conn-h")
	})
}

// createSeedTable creates the seed's table: the same key, plus its GSI on
// (desired_state, lease_expires_at_ms), which every heartbeat rewrites.
func createSeedTable(ctx context.Context, db *dynamodb.Client, name string) error {
	_, err := db.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:   &name,
		BillingMode: types.BillingModePayPerRequest,
		KeySchema:   []types.KeySchemaElement{{AttributeName: aws.String(schema.AttrPK), KeyType: types.KeyTypeHash}},
		AttributeDefinitions: []types.AttributeDefinition{
			{AttributeName: aws.String(schema.AttrPK), AttributeType: types.ScalarAttributeTypeS},
			{AttributeName: aws.String("desired_state"), AttributeType: types.ScalarAttributeTypeS},
			{AttributeName: aws.String("lease_expires_at_ms"), AttributeType: types.ScalarAttributeTypeN},
		},
		GlobalSecondaryIndexes: []types.GlobalSecondaryIndex{{
			IndexName: aws.String("desired_state-lease_expires_at_ms-index"),
			KeySchema: []types.KeySchemaElement{
				{AttributeName: aws.String("desired_state"), KeyType: types.KeyTypeHash},
				{AttributeName: aws.String("lease_expires_at_ms"), KeyType: types.KeyTypeRange},
			},
			Projection: &types.Projection{ProjectionType: types.ProjectionTypeAll},
		}},
	})
	return err
}
