package registry_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/local/ddbtest"
	"github.com/sockfleet/sockfleet/shared/local/localddb"
	"github.com/sockfleet/sockfleet/shared/registry"
	"github.com/sockfleet/sockfleet/shared/schema"
)

// A renew writes only the worker item: the registry index is KEYS_ONLY and keyed on
// an attribute a renew does not change. Measured as DynamoDB bills it, with the
// longest id a worker may have, so the item stays within one 1 KB write unit.
func TestRenewCostsOneWriteUnit(t *testing.T) {
	e := ddbtest.New(t)
	ctx := context.Background()
	var m localddb.Meter
	r := registry.Registry{DB: e.Client(nil, m.Option), Table: e.Table}
	now := time.Now()
	w := member(strings.Repeat("w", schema.MaxIDLen), "0123456789abcdef0123456789abcdef", now.Add(10*time.Second))
	w.Addr = "[2001:db8:ffff:ffff:ffff:ffff:ffff:ffff]:65535"
	w.Capacity, w.Load = 100000, 100000
	if _, err := r.Join(ctx, w, now, skew); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		m.Reset()
		w.HeartbeatExpiresAtMs = now.Add(time.Duration(13+3*i) * time.Second).UnixMilli()
		w.Load, w.Draining = i, i == 2
		if err := r.Renew(ctx, w); err != nil {
			t.Fatal(err)
		}
		_, write := m.Units()
		parts := m.Parts()
		if write != 1 || parts["table"] != 1 || len(parts) != 1 {
			t.Fatalf("renew %d billed %v write units, by part %v; want 1, the item only", i, write, parts)
		}
	}
	// The listing still sees the renewed item in full.
	ws, bad, err := r.List(ctx)
	if err != nil || len(bad) != 0 || len(ws) != 1 || ws[0].Load != 2 || !ws[0].Draining || ws[0].Incarnation != w.Incarnation {
		t.Fatalf("listed %+v, bad %v, %v", ws, bad, err)
	}
}

// List pages through the index and reads the items 100 keys a request.
func TestListReadsEveryItemInBatches(t *testing.T) {
	e := ddbtest.New(t)
	ctx := context.Background()
	db := &countingDB{DB: e.DB}
	r := registry.Registry{DB: db, Table: e.Table}
	now := time.Now()
	const n = 230
	for i := range n {
		w := member(fmt.Sprintf("w%03d", n-1-i), "inc", now.Add(time.Minute))
		w.Load = n - 1 - i
		if err := r.Put(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	ws, bad, err := r.List(ctx)
	if err != nil || len(bad) != 0 {
		t.Fatalf("list: bad %v, %v", bad, err)
	}
	if len(ws) != n {
		t.Fatalf("listed %d workers, want %d", len(ws), n)
	}
	for i, w := range ws {
		if want := fmt.Sprintf("w%03d", i); w.ID != want || w.Load != i || w.Addr == "" {
			t.Fatalf("worker %d = %+v, want %s with its load and address (sorted by id, whole items)", i, w, want)
		}
	}
	if got := db.batches.Load(); got != 3 {
		t.Fatalf("%d BatchGetItem requests for %d workers, want 3", got, n)
	}
}

// Keys BatchGetItem leaves unprocessed are asked for again, with backoff, until none
// is left; a listing that never completes is an error, not a short listing.
func TestListRetriesUnprocessedKeys(t *testing.T) {
	e := ddbtest.New(t)
	ctx := context.Background()
	now := time.Now()
	base := registry.Registry{DB: e.DB, Table: e.Table}
	for i := range 10 {
		if err := base.Put(ctx, member(fmt.Sprintf("w%d", i), "inc", now.Add(time.Minute))); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("processed_later", func(t *testing.T) {
		db := &countingDB{DB: e.DB, holdBack: 3, heldRounds: 2}
		ws, _, err := (&registry.Registry{DB: db, Table: e.Table}).List(ctx)
		if err != nil || len(ws) != 10 {
			t.Fatalf("listed %d, %v; want all 10", len(ws), err)
		}
		if got := db.batches.Load(); got != 3 {
			t.Fatalf("%d requests, want 3 (two of them with keys held back)", got)
		}
	})
	t.Run("never_processed", func(t *testing.T) {
		db := &countingDB{DB: e.DB, holdBack: 1, heldRounds: 1000}
		ws, _, err := (&registry.Registry{DB: db, Table: e.Table}).List(ctx)
		if err == nil || ws != nil || !strings.Contains(err.Error(), "unprocessed") {
			t.Fatalf("listed %d, %v; want an error naming the unprocessed items", len(ws), err)
		}
		if got := db.batches.Load(); got != registry.BatchGetAttempts {
			t.Fatalf("%d requests, want %d", got, registry.BatchGetAttempts)
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		db := &countingDB{DB: e.DB, holdBack: 1, heldRounds: 1000}
		cctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
		defer cancel()
		if _, _, err := (&registry.Registry{DB: db, Table: e.Table}).List(cctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("list under a cancelled context: %v", err)
		}
	})
}

// A table deployed by an earlier version has only the legacy ALL index until the
// new one is active: List reads that instead.
func TestListFallsBackToTheLegacyIndex(t *testing.T) {
	e := ddbtest.New(t) // only for the engine
	ctx := context.Background()
	table := e.Table + "_legacy"
	in := localddb.CreateTableInput(table)
	ix := schema.LegacyRegistryIndex
	in.GlobalSecondaryIndexes = []types.GlobalSecondaryIndex{{
		IndexName:  aws.String(ix.Name),
		KeySchema:  []types.KeySchemaElement{{AttributeName: aws.String(ix.PartitionKey), KeyType: types.KeyTypeHash}},
		Projection: &types.Projection{ProjectionType: types.ProjectionType(ix.Projection)},
	}}
	in.AttributeDefinitions = []types.AttributeDefinition{
		{AttributeName: aws.String(schema.AttrPK), AttributeType: types.ScalarAttributeTypeS},
		{AttributeName: aws.String(ix.PartitionKey), AttributeType: types.ScalarAttributeTypeS},
	}
	if _, err := e.DB.CreateTable(ctx, in); err != nil {
		t.Fatal(err)
	}
	db := &countingDB{DB: e.DB}
	r := registry.Registry{DB: db, Table: table}
	now := time.Now()
	for _, id := range []string{"w2", "w1"} {
		if err := r.Put(ctx, member(id, "inc", now.Add(time.Minute))); err != nil {
			t.Fatal(err)
		}
	}
	ws, bad, err := r.List(ctx)
	if err != nil || len(bad) != 0 || len(ws) != 2 || ws[0].ID != "w1" || ws[1].ID != "w2" || ws[0].Addr == "" {
		t.Fatalf("listed %+v, bad %v, %v", ws, bad, err)
	}
	if db.batches.Load() != 0 {
		t.Fatal("the legacy index holds whole items: no BatchGetItem needed")
	}
	// Any other failure is reported, not papered over by the fallback.
	r.Table = table + "_absent"
	if _, _, err := r.List(ctx); err == nil {
		t.Fatal("listing a missing table succeeded")
	}
}

// countingDB is the engine's client, counting BatchGetItem requests; with holdBack
// set it plays DynamoDB under throttling, returning that many of the keys of each of
// the first heldRounds requests as unprocessed, unread.
type countingDB struct {
	registry.DynamoDB
	DB                   *dynamodb.Client
	holdBack, heldRounds int
	batches              atomic.Int64
}

func (c *countingDB) PutItem(ctx context.Context, in *dynamodb.PutItemInput, o ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error) {
	return c.DB.PutItem(ctx, in, o...)
}

func (c *countingDB) Query(ctx context.Context, in *dynamodb.QueryInput, o ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error) {
	return c.DB.Query(ctx, in, o...)
}

func (c *countingDB) BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, o ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error) {
	round := int(c.batches.Add(1))
	if c.holdBack == 0 || round > c.heldRounds {
		return c.DB.BatchGetItem(ctx, in, o...)
	}
	held := map[string]types.KeysAndAttributes{}
	ask := map[string]types.KeysAndAttributes{}
	for table, ka := range in.RequestItems {
		k := min(c.holdBack, len(ka.Keys))
		h, a := ka, ka
		h.Keys, a.Keys = ka.Keys[:k], ka.Keys[k:]
		held[table] = h
		if len(a.Keys) > 0 {
			ask[table] = a
		}
	}
	out := &dynamodb.BatchGetItemOutput{Responses: map[string][]map[string]types.AttributeValue{}}
	if len(ask) > 0 {
		var err error
		if out, err = c.DB.BatchGetItem(ctx, &dynamodb.BatchGetItemInput{RequestItems: ask}, o...); err != nil {
			return nil, err
		}
	}
	out.UnprocessedKeys = held
	return out, nil
}
