package registry_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/local/ddbtest"
	"github.com/sockfleet/sockfleet/shared/registry"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

const skew = 2 * time.Second

func member(id, inc string, exp time.Time) codec.Worker {
	return codec.Worker{ID: id, Addr: "127.0.0.1:1", Capacity: 10, Incarnation: inc, HeartbeatExpiresAtMs: exp.UnixMilli()}
}

func readWorker(t *testing.T, e *ddbtest.Env, id string) (codec.Worker, bool) {
	t.Helper()
	out, err := e.DB.GetItem(context.Background(), &dynamodb.GetItemInput{TableName: &e.Table, ConsistentRead: aws.Bool(true),
		Key: map[string]types.AttributeValue{schema.AttrPK: codec.S(schema.WorkerKey(id))}})
	if err != nil {
		t.Fatal(err)
	}
	if out.Item == nil {
		return codec.Worker{}, false
	}
	w, err := codec.DecodeWorker(out.Item)
	if err != nil {
		t.Fatal(err)
	}
	return w, true
}

func TestJoinRenewLeave(t *testing.T) {
	e := ddbtest.New(t)
	ctx := context.Background()
	r := registry.Registry{DB: e.DB, Table: e.Table}
	now := time.Now()
	w := member("w1", "inc-a", now.Add(10*time.Second))
	if replaced, err := r.Join(ctx, w, now, skew); err != nil || replaced {
		t.Fatalf("first join: replaced %v, %v", replaced, err)
	}
	// A second incarnation cannot join while the first one's lease holds.
	if _, err := r.Join(ctx, member("w1", "inc-b", now.Add(10*time.Second)), now, skew); !errors.Is(err, registry.ErrInUse) {
		t.Fatalf("join over a live incarnation: %v, want ErrInUse", err)
	}
	w.Load, w.Draining = 3, true
	w.HeartbeatExpiresAtMs = now.Add(20 * time.Second).UnixMilli()
	if err := r.Renew(ctx, w); err != nil {
		t.Fatal(err)
	}
	got, _ := readWorker(t, e, "w1")
	if got.Load != 3 || !got.Draining || got.HeartbeatExpiresAtMs != w.HeartbeatExpiresAtMs || got.Incarnation != "inc-a" ||
		got.TTL <= now.Unix() {
		t.Fatalf("after renew: %+v", got)
	}
	if ws, _, _ := r.List(ctx); len(ws) != 1 || ws[0].ID != "w1" {
		t.Fatalf("listed %+v", ws)
	}
	// Another incarnation's renew is refused and changes nothing.
	other := w
	other.Incarnation, other.Load = "inc-b", 9
	if err := r.Renew(ctx, other); !errors.Is(err, registry.ErrNotMember) {
		t.Fatalf("renew by another incarnation: %v, want ErrNotMember", err)
	}
	// Leave by another incarnation does nothing; by ours, marks the item gone (dead,
	// lapsed now), so whatever still names it can be released at once.
	if err := r.Leave(ctx, "w1", "inc-b", now); err != nil {
		t.Fatal(err)
	}
	if got, _ := readWorker(t, e, "w1"); got.Dead() {
		t.Fatal("another incarnation's leave marked the item")
	}
	if err := r.Leave(ctx, "w1", "inc-a", now); err != nil {
		t.Fatal(err)
	}
	got, ok := readWorker(t, e, "w1")
	if !ok || !got.Dead() || got.Live(now.UnixMilli()) || !registry.Releasable(got, now.Add(skew+time.Millisecond), skew) {
		t.Fatalf("after leave: %+v %v", got, ok)
	}
	if err := r.Renew(ctx, w); !errors.Is(err, registry.ErrNotMember) {
		t.Fatalf("renew after leave: %v, want ErrNotMember", err)
	}
	// A renew of an absent item is refused: it must not recreate it.
	if _, err := e.DB.DeleteItem(ctx, &dynamodb.DeleteItemInput{TableName: &e.Table,
		Key: map[string]types.AttributeValue{schema.AttrPK: codec.S(schema.WorkerKey("w1"))}}); err != nil {
		t.Fatal(err)
	}
	if err := r.Renew(ctx, w); !errors.Is(err, registry.ErrNotMember) {
		t.Fatalf("renew of an absent item: %v, want ErrNotMember", err)
	}
	if _, ok := readWorker(t, e, "w1"); ok {
		t.Fatal("renew recreated the item")
	}
	// A worker whose container exited is marked gone, item or not.
	if err := r.Gone(ctx, "w9", now); err != nil {
		t.Fatal(err)
	}
	if got, ok := readWorker(t, e, "w9"); !ok || !got.Dead() || !registry.Releasable(got, now.Add(skew+time.Millisecond), skew) {
		t.Fatalf("gone: %+v %v", got, ok)
	}
}

func TestJoinReplacesOnlyALapsedItem(t *testing.T) {
	e := ddbtest.New(t)
	ctx := context.Background()
	r := registry.Registry{DB: e.DB, Table: e.Table}
	now := time.Now()
	if _, err := r.Join(ctx, member("w1", "old", now.Add(-skew+time.Second)), now.Add(-time.Minute), skew); err != nil {
		t.Fatal(err)
	}
	// Lapsed, but within the skew margin: its holder may still be streaming.
	if _, err := r.Join(ctx, member("w1", "new", now.Add(10*time.Second)), now, skew); !errors.Is(err, registry.ErrInUse) {
		t.Fatalf("join within the margin: %v, want ErrInUse", err)
	}
	later := now.Add(2 * time.Second)
	replaced, err := r.Join(ctx, member("w1", "new", later.Add(10*time.Second)), later, skew)
	if err != nil || !replaced {
		t.Fatalf("join over a lapsed item: replaced %v, %v", replaced, err)
	}
	if got, _ := readWorker(t, e, "w1"); got.Incarnation != "new" || got.Dead() {
		t.Fatalf("after join: %+v", got)
	}
}

func TestDeclareDead(t *testing.T) {
	e := ddbtest.New(t)
	ctx := context.Background()
	r := registry.Registry{DB: e.DB, Table: e.Table}
	now := time.Now()
	w := member("w1", "inc-a", now.Add(-skew-time.Second))
	if _, err := r.Join(ctx, w, now.Add(-time.Minute), skew); err != nil {
		t.Fatal(err)
	}
	// A listing with the wrong incarnation declares nothing.
	wrong := w
	wrong.Incarnation = "inc-z"
	if ok, err := r.DeclareDead(ctx, wrong, now, skew); err != nil || ok {
		t.Fatalf("declare with another incarnation: %v %v", ok, err)
	}
	// Not lapsed beyond the margin at this clock: nothing.
	if ok, err := r.DeclareDead(ctx, w, now.Add(-time.Second), skew); err != nil || ok {
		t.Fatalf("declare within the margin: %v %v", ok, err)
	}
	if ok, err := r.DeclareDead(ctx, w, now, skew); err != nil || !ok {
		t.Fatalf("declare: %v %v", ok, err)
	}
	if ok, _ := r.DeclareDead(ctx, w, now, skew); ok {
		t.Fatal("declared twice")
	}
	got, _ := readWorker(t, e, "w1")
	if !got.Dead() || got.Live(now.Add(-time.Hour).UnixMilli()) {
		t.Fatalf("after declare: %+v", got)
	}
	// Once dead, the member's renews fail, even with a fresh expiry.
	w.HeartbeatExpiresAtMs = now.Add(time.Minute).UnixMilli()
	if err := r.Renew(ctx, w); !errors.Is(err, registry.ErrNotMember) {
		t.Fatalf("renew after being declared dead: %v, want ErrNotMember", err)
	}
	// A member that renewed after the listing is not declared.
	live := member("w2", "inc-b", now.Add(-skew-time.Second))
	if _, err := r.Join(ctx, live, now.Add(-time.Minute), skew); err != nil {
		t.Fatal(err)
	}
	renewed := live
	renewed.HeartbeatExpiresAtMs = now.Add(10 * time.Second).UnixMilli()
	if err := r.Renew(ctx, renewed); err != nil {
		t.Fatal(err)
	}
	if ok, err := r.DeclareDead(ctx, live, now, skew); err != nil || ok {
		t.Fatalf("declared a member that renewed since the listing: %v %v", ok, err)
	}
}

func TestTombstone(t *testing.T) {
	e := ddbtest.New(t)
	ctx := context.Background()
	r := registry.Registry{DB: e.DB, Table: e.Table}
	now := time.Now()
	if ok, err := r.Tombstone(ctx, "ghost", now); err != nil || !ok {
		t.Fatalf("tombstone: %v %v", ok, err)
	}
	if ok, _ := r.Tombstone(ctx, "ghost", now); ok {
		t.Fatal("tombstone written over an item")
	}
	got, ok := readWorker(t, e, "ghost")
	if !ok || !got.Dead() || got.HeartbeatExpiresAtMs != now.Add(registry.TombstoneLease).UnixMilli() {
		t.Fatalf("tombstone %+v", got)
	}
	if registry.Releasable(got, now.Add(registry.TombstoneLease+skew), skew) {
		t.Fatal("releasable before the tombstone lease lapsed beyond the margin")
	}
	if !registry.Releasable(got, now.Add(registry.TombstoneLease+skew+time.Millisecond), skew) {
		t.Fatal("not releasable after the tombstone lease lapsed beyond the margin")
	}
	// A worker still running under that id learns at its next renew.
	if err := r.Renew(ctx, member("ghost", "inc", now.Add(10*time.Second))); !errors.Is(err, registry.ErrNotMember) {
		t.Fatalf("renew over a tombstone: %v, want ErrNotMember", err)
	}
	// A live member blocks a tombstone.
	if _, err := r.Join(ctx, member("w1", "inc", now.Add(10*time.Second)), now, skew); err != nil {
		t.Fatal(err)
	}
	if ok, _ := r.Tombstone(ctx, "w1", now); ok {
		t.Fatal("tombstone over a live member")
	}
	if ok, err := r.Tombstone(ctx, "a#b", now); ok || !errors.Is(err, schema.ErrInvalid) {
		t.Fatalf("bad id: %v %v", ok, err)
	}
}

func TestMembershipRefusesBadInput(t *testing.T) {
	e := ddbtest.New(t)
	ctx := context.Background()
	r := registry.Registry{DB: e.DB, Table: e.Table}
	now := time.Now()
	for name, w := range map[string]codec.Worker{
		"no incarnation": member("w1", "", now.Add(10*time.Second)),
		"no address":     {ID: "w1", Incarnation: "i", HeartbeatExpiresAtMs: now.Add(10 * time.Second).UnixMilli()},
		"bad id":         member("w#1", "i", now.Add(10*time.Second)),
	} {
		if _, err := r.Join(ctx, w, now, skew); !errors.Is(err, schema.ErrInvalid) {
			t.Errorf("join, %s: %v, want ErrInvalid", name, err)
		}
		if err := r.Renew(ctx, w); !errors.Is(err, schema.ErrInvalid) {
			t.Errorf("renew, %s: %v, want ErrInvalid", name, err)
		}
	}
	if ws, _, _ := r.List(ctx); len(ws) != 0 {
		t.Fatalf("bad input wrote %+v", ws)
	}
}
