package fleet_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/sockfleet/sockfleet/shared/lease"
	"github.com/sockfleet/sockfleet/shared/local/ddbtest"
	"github.com/sockfleet/sockfleet/shared/local/fleet"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

func TestMain(m *testing.M) { ddbtest.Main(m) }

// Through a proxy that fails, throttles and drops responses after applying writes,
// every lease operation that reports success really happened, and every acquire's
// reported owner is the owner in the table.
func TestLeaseStoreThroughFaultProxy(t *testing.T) {
	e := ddbtest.New(t)
	ctx := context.Background()
	p, err := fleet.NewFaultProxy(e.Endpoint, 42)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.SetFaults(fleet.Faults{P5xx: 0.15, PThrottle: 0.15, PDrop: 0.2})
	db := dynamodb.NewFromConfig(e.Config(nil), func(o *dynamodb.Options) {
		o.BaseEndpoint = aws.String(p.Endpoint())
		o.RetryMaxAttempts = 2
	})
	s, err := lease.New(db, lease.Config{Table: e.Table})
	if err != nil {
		t.Fatal(err)
	}
	direct, _ := lease.New(e.DB, lease.Config{Table: e.Table})
	for i := range 40 {
		id := fmt.Sprint("c", i)
		if _, err := e.DB.PutItem(ctx, &dynamodb.PutItemInput{TableName: &e.Table, Item: codec.EncodeConnection(
			codec.Connection{ID: id, DesiredState: schema.Started, WSURL: "ws://h/x"})}); err != nil {
			t.Fatal(err)
		}
		l, err := s.Acquire(ctx, id, "w1")
		truth, _ := direct.Get(ctx, id)
		switch {
		case err == nil && truth.LeaseOwner != "w1":
			t.Fatalf("%s: acquire reported success, table says owner %q", id, truth.LeaseOwner)
		case err == nil:
			if _, err := s.Renew(ctx, l, lease.Progress{LastSeq: int64(i)}); err == nil {
				if got, _ := direct.Get(ctx, id); got.LastSeq != int64(i) {
					t.Fatalf("%s: renew reported success, table has last_seq %d", id, got.LastSeq)
				}
			} else if !errors.Is(err, lease.ErrUnavailable) {
				t.Fatalf("%s: renew: %v", id, err)
			}
		case !errors.Is(err, lease.ErrUnavailable):
			t.Fatalf("%s: acquire failed with %v; only ErrUnavailable is acceptable here", id, err)
		case truth.LeaseOwner == "w1":
			// Unavailable, yet applied: allowed only if the read-back also failed.
			// The lease then simply expires; the caller must not stream it.
		}
	}
	if p.Injected.Load() == 0 {
		t.Fatal("the proxy injected no faults")
	}
	p.SetDown(true)
	if _, err := s.Get(ctx, "c0"); !errors.Is(err, lease.ErrUnavailable) {
		t.Fatalf("read during an outage: %v", err)
	}
}

// The proxy's meter counts what the engine bills, index writes and failed
// conditions included, without the client asking for it.
func TestProxyMetersBilledCapacity(t *testing.T) {
	e := ddbtest.New(t)
	ctx := context.Background()
	p, err := fleet.NewFaultProxy(e.Endpoint, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	db := dynamodb.NewFromConfig(e.Config(nil), func(o *dynamodb.Options) { o.BaseEndpoint = aws.String(p.Endpoint()) })
	s, _ := lease.New(db, lease.Config{Table: e.Table})
	if _, err := db.PutItem(ctx, &dynamodb.PutItemInput{TableName: &e.Table, Item: codec.EncodeConnection(
		codec.Connection{ID: "m", DesiredState: schema.Started, WSURL: "ws://h/x"})}); err != nil {
		t.Fatal(err)
	}
	l, err := s.Acquire(ctx, "m", "w1") // 1 table write + 1 lease_owner index write
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Renew(ctx, l, lease.Progress{LastSeq: 1}); err != nil { // 1: heartbeats skip the index
		t.Fatal(err)
	}
	if _, err := s.Acquire(ctx, "m", "w2"); !errors.Is(err, lease.ErrHeld) { // a failed condition: 1
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "m"); err != nil { // a strongly consistent read of a small item: 1
		t.Fatal(err)
	}
	u := p.Meter.Snapshot()
	if u.WriteUnits != 1+2+1+1 || u.ReadUnits != 1 || u.ConditionalCheckFailed != 1 {
		t.Fatalf("metered %+v; want 5 write units (put, acquire+index, renew, failed acquire), 1 read, 1 failed condition", u)
	}
}
