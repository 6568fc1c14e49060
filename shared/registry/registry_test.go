package registry_test

import (
	"context"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/sockfleet/sockfleet/shared/local/ddbtest"
	"github.com/sockfleet/sockfleet/shared/registry"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

func TestMain(m *testing.M) { ddbtest.Main(m) }

func TestPutListDelete(t *testing.T) {
	e := ddbtest.New(t)
	ctx := context.Background()
	r := registry.Registry{DB: e.DB, Table: e.Table}
	now := time.Now()
	live := codec.Worker{ID: "w1", Addr: "127.0.0.1:1", Capacity: 10, Load: 2, HeartbeatExpiresAtMs: now.Add(time.Minute).UnixMilli()}
	dead := codec.Worker{ID: "w2", Addr: "127.0.0.1:2", Capacity: 10, HeartbeatExpiresAtMs: now.Add(-time.Minute).UnixMilli()}
	for _, w := range []codec.Worker{live, dead} {
		if err := r.Put(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	// A connection item and a malformed worker item must not break the listing.
	if _, err := e.DB.PutItem(ctx, &dynamodb.PutItemInput{TableName: &e.Table, Item: codec.EncodeConnection(codec.Connection{ID: "c", DesiredState: schema.Started, WSURL: "ws://h/x"})}); err != nil {
		t.Fatal(err)
	}
	bad := codec.EncodeWorker(codec.Worker{ID: "w3", Addr: "x", Capacity: 1})
	bad[schema.AttrCapacity] = codec.S("lots")
	if _, err := e.DB.PutItem(ctx, &dynamodb.PutItemInput{TableName: &e.Table, Item: bad}); err != nil {
		t.Fatal(err)
	}
	all, badItems, err := r.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 2 || len(badItems) != 1 {
		t.Fatalf("listed %+v, bad %v; want 2 workers and 1 bad item", all, badItems)
	}
	got := registry.Live(all, now)
	if len(got) != 1 || got[0].ID != "w1" || got[0].Load != 2 || got[0].TTL <= now.Unix() {
		t.Fatalf("live = %+v, want w1 with a TTL", got)
	}
	if err := r.Delete(ctx, "w1"); err != nil {
		t.Fatal(err)
	}
	all, _, _ = r.List(ctx)
	if len(all) != 1 || all[0].ID != "w2" {
		t.Fatalf("after delete: %+v", all)
	}
}
