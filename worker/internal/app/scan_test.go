package app

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/local/ddbtest"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/worker/internal/owner"
)

// The start-up pass lists what an acquire would take: STARTED connections whose
// lease is free by lease.FreeCondition (the scan's filter) — and nothing else on the
// table, such as worker items or stopped connections.
func TestStartupScanListsFreeStartedConnections(t *testing.T) {
	e := ddbtest.New(t)
	ctx := context.Background()
	now := time.Now()
	margin := schema.DefaultSkewMargin
	conn := func(id string, st schema.State, owner string, exp int64) {
		t.Helper()
		c := codec.Connection{ID: id, DesiredState: st, WSURL: "ws://up/" + id, LeaseOwner: owner, LeaseExpiresAtMs: exp}
		if _, err := e.DB.PutItem(ctx, &dynamodb.PutItemInput{TableName: &e.Table, Item: codec.EncodeConnection(c)}); err != nil {
			t.Fatal(err)
		}
	}
	conn("never-owned", schema.Started, "", 0)
	conn("released", schema.Started, "", 0) // a release removes the owner and writes 0
	// An owner whose expiry was zeroed by hand may still stream it (issue 21): not free.
	conn("zeroed", schema.Started, "w1", 0)
	conn("expired", schema.Started, "w1", now.Add(-margin-time.Second).UnixMilli())
	conn("within-margin", schema.Started, "w1", now.Add(-margin/2).UnixMilli())
	conn("live", schema.Started, "w1", now.Add(time.Minute).UnixMilli())
	conn("member", schema.Started, "w1", schema.LeaseHeldByMember)
	conn("stopped", schema.Stopped, "", 0)
	w := codec.EncodeWorker(codec.Worker{ID: "w1", Addr: "127.0.0.1:1", HeartbeatExpiresAtMs: now.Add(time.Minute).UnixMilli()})
	if _, err := e.DB.PutItem(ctx, &dynamodb.PutItemInput{TableName: &e.Table, Item: w}); err != nil {
		t.Fatal(err)
	}
	ids, err := owner.ScanCandidates(ctx, e.DB, e.Table, now, margin, 100, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(ids)
	if want := []string{"expired", "never-owned", "released"}; !slices.Equal(ids, want) {
		t.Errorf("candidates %v, want %v", ids, want)
	}
	// Stream mode: only free items that carried the unheld mark since the given time.
	mark := func(id string, v types.AttributeValue) {
		t.Helper()
		it := codec.EncodeConnection(codec.Connection{ID: id, DesiredState: schema.Started, WSURL: "ws://up/" + id})
		it[schema.AttrUnheldSince] = v
		if _, err := e.DB.PutItem(ctx, &dynamodb.PutItemInput{TableName: &e.Table, Item: it}); err != nil {
			t.Fatal(err)
		}
	}
	mark("marked-old", codec.N(now.Add(-time.Hour).UnixMilli()))
	mark("marked-young", codec.N(now.UnixMilli()))
	mark("marked-string", codec.S("1"))
	ids, err = owner.ScanCandidates(ctx, e.DB, e.Table, now, margin, 100, now.Add(-time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"marked-old"}; !slices.Equal(ids, want) {
		t.Errorf("stream-mode candidates %v, want %v", ids, want)
	}
}
