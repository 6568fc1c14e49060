package app

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/shared/wakeup"
	"github.com/sockfleet/sockfleet/worker/internal/owner"
)

func (e *env) workerItem(id string) codec.Worker {
	e.t.Helper()
	out, err := e.db.DB.GetItem(context.Background(), &dynamodb.GetItemInput{TableName: &e.db.Table, ConsistentRead: aws.Bool(true),
		Key: map[string]types.AttributeValue{schema.AttrPK: codec.S(schema.WorkerKey(id))}})
	if err != nil || out.Item == nil {
		e.t.Fatalf("worker item %s: %v %v", id, out.Item, err)
	}
	w, err := codec.DecodeWorker(out.Item)
	if err != nil {
		e.t.Fatal(err)
	}
	return w
}

// A worker that learns it was declared dead stops every connection at once and
// exits, so that the supervisor starts a fresh incarnation.
func TestDeclaredDeadStopsEverythingAndExits(t *testing.T) {
	e := newEnv(t, rate)
	e.putConn("c1", schema.Started)
	e.putConn("c2", schema.Started)
	w := e.worker("w1", opts{})
	e.wake(w, wakeup.NeedsOwner, 0, "c1", "c2")
	waitFor(t, 5*time.Second, "streaming", func() bool { return w.sink.count("c1") >= 10 && w.sink.count("c2") >= 10 })
	inc := e.workerItem("w1").Incarnation
	if inc == "" {
		t.Fatal("worker item has no incarnation")
	}
	_, err := e.db.DB.UpdateItem(context.Background(), &dynamodb.UpdateItemInput{TableName: &e.db.Table,
		Key:                       map[string]types.AttributeValue{schema.AttrPK: codec.S(schema.WorkerKey("w1"))},
		UpdateExpression:          aws.String("SET #d = :now"),
		ExpressionAttributeNames:  map[string]string{"#d": schema.AttrDeadAt},
		ExpressionAttributeValues: map[string]types.AttributeValue{":now": codec.N(time.Now().UnixMilli())}})
	if err != nil {
		t.Fatal(err)
	}
	took := waitFor(t, 5*time.Second, "sockets closed", func() bool {
		return e.up.Stats("c1").Clients == 0 && e.up.Stats("c2").Clients == 0
	})
	if took > interval+time.Second {
		t.Fatalf("stopped %s after the declaration; renew interval %s", took, interval)
	}
	n1, n2 := w.sink.count("c1"), w.sink.count("c2")
	if err := w.stop(); !errors.Is(err, owner.ErrExpelled) {
		t.Fatalf("Run returned %v, want ErrExpelled", err)
	}
	if w.sink.count("c1") != n1 || w.sink.count("c2") != n2 {
		t.Fatal("delivered after being declared dead")
	}
	// It gave its leases back with the last checkpoint (the reconciler would too).
	for _, id := range []string{"c1", "c2"} {
		if c := e.get(id); c.Owned() || c.Status != "expelled" || c.LastSeq != w.sink.last(id) {
			t.Errorf("%s: %+v, sink last %d", id, c, w.sink.last(id))
		}
	}
	// The dead item stays for the reconciler: the worker never deletes or revives it.
	if it := e.workerItem("w1"); !it.Dead() || it.Incarnation != inc {
		t.Fatalf("worker item after exit: %+v", it)
	}
}

// Idle connections cost no writes; a STOPPED whose wakeup was lost is caught by the
// backstop's eventually consistent read, confirmed by a conditional write.
func TestIdleWritesNothingAndBackstopCatchesLostStop(t *testing.T) {
	e := newEnv(t, 0) // the upstream never sends
	e.putConn("c1", schema.Started)
	e.putConn("c2", schema.Started)
	w := e.worker("w1", opts{backstop: 2 * interval})
	e.wake(w, wakeup.NeedsOwner, 0, "c1", "c2")
	waitFor(t, 5*time.Second, "connected", func() bool { return e.up.Stats("c1").Clients == 1 && e.up.Stats("c2").Clients == 1 })
	// The one status change (acquired → streaming) is written once per connection;
	// after that an idle connection writes nothing.
	waitFor(t, 5*time.Second, "status written", func() bool { return e.get("c1").Status == "streaming" && e.get("c2").Status == "streaming" })
	time.Sleep(2 * interval)
	n0, before := w.Metrics.Checkpoints.Load(), e.get("c1")
	if n0 > 2 {
		t.Fatalf("%d checkpoints for two status changes", n0)
	}
	time.Sleep(5 * interval)
	if n := w.Metrics.Checkpoints.Load(); n != n0 {
		t.Fatalf("%d checkpoints of idle connections", n-n0)
	}
	if after := e.get("c1"); after.StatusAtMs != before.StatusAtMs || after.LastSeq != before.LastSeq {
		t.Fatalf("idle item rewritten: %+v then %+v", before, after)
	}
	if w.Metrics.BackstopReads.Load() == 0 || w.Metrics.BackstopReadUnits.Load() == 0 {
		t.Fatalf("backstop reads %d, units %d", w.Metrics.BackstopReads.Load(), w.Metrics.BackstopReadUnits.Load())
	}
	// A STOPPED and a ws_url change that no wakeup reports.
	e.update("c1", "SET #d = :s", map[string]types.AttributeValue{":s": codec.S(string(schema.Stopped))},
		map[string]string{"#d": schema.AttrDesiredState})
	moved := e.up.URL("c2") + "&moved=1"
	e.update("c2", "SET #u = :u", map[string]types.AttributeValue{":u": codec.S(moved)}, map[string]string{"#u": schema.AttrWSURL})
	took := waitFor(t, 5*time.Second, "released by the backstop", func() bool { return e.get("c1").LeaseExpiresAtMs == 0 })
	if took > 2*interval+time.Second {
		t.Fatalf("lost STOPPED caught after %s; backstop every %s", took, 2*interval)
	}
	if c := e.get("c1"); c.Status != "stopped" {
		t.Fatalf("item %+v", c)
	}
	if c := e.get("c2"); !c.Owned() || c.LeaseOwner != "w1" {
		t.Fatalf("c2 lost on a URL change: %+v", c)
	}
	t.Logf("backstop: %d reads, %.1f read units", w.Metrics.BackstopReads.Load(), float64(w.Metrics.BackstopReadUnits.Load())/1000)
}

// Checkpoints of a busy connection are written at most once per interval, and the
// release still carries the final one.
func TestCheckpointAtMostOncePerInterval(t *testing.T) {
	e := newEnv(t, rate)
	e.putConn("c1", schema.Started)
	w := e.worker("w1", opts{checkpoint: time.Second})
	e.wake(w, wakeup.NeedsOwner, 0, "c1")
	waitFor(t, 5*time.Second, "first checkpoint", func() bool { return e.get("c1").LastSeq > 0 })
	n0, t0 := w.Metrics.Checkpoints.Load(), time.Now()
	time.Sleep(3 * time.Second)
	n, took := w.Metrics.Checkpoints.Load()-n0, time.Since(t0)
	if limit := int64(took/time.Second) + 1; n > limit || n < 1 {
		t.Fatalf("%d checkpoints in %s with a 1s interval (want 1 to %d)", n, took, limit)
	}
	if err := w.stop(); err != nil {
		t.Fatal(err)
	}
	if c := e.get("c1"); c.LastSeq != w.sink.last("c1") || c.Owned() {
		t.Fatalf("release: %+v, sink last %d", c, w.sink.last("c1"))
	}
}

// Finding: a needs-owner wakeup for a lease the worker thinks it holds was answered
// from memory. After a console write that released the lease at the current
// version, or a delete and re-create, it is verified against the table and the
// connection taken again, resuming after its checkpoint.
func TestNeedsOwnerForAHeldLeaseIsVerified(t *testing.T) {
	e := newEnv(t, rate)
	e.putConn("c1", schema.Started)
	w := e.worker("w1", opts{})
	e.wake(w, wakeup.NeedsOwner, 0, "c1")
	waitFor(t, 5*time.Second, "streaming", func() bool { return w.sink.count("c1") >= 20 && e.get("c1").LastSeq > 0 })
	v := e.get("c1").LeaseVersion
	// A stale console image: released at the current version.
	e.update("c1", "SET #e = :z REMOVE #o", map[string]types.AttributeValue{":z": codec.N(0)},
		map[string]string{"#e": schema.AttrLeaseExpires, "#o": schema.AttrLeaseOwner})
	if r := e.wake(w, wakeup.NeedsOwner, v, "c1"); r[0].Result != wakeup.Acquired {
		t.Fatalf("needs-owner after a console release: %+v", r)
	}
	if c := e.get("c1"); c.LeaseOwner != "w1" || c.LeaseVersion <= v {
		t.Fatalf("item %+v, want w1 at a version above %d", c, v)
	}
	n := w.sink.count("c1")
	waitFor(t, 5*time.Second, "streaming again", func() bool { return w.sink.count("c1") >= n+20 })
	// Deleted and re-created within one batch: a new item, never owned.
	if _, err := e.db.DB.DeleteItem(context.Background(), &dynamodb.DeleteItemInput{TableName: &e.db.Table,
		Key: map[string]types.AttributeValue{schema.AttrPK: codec.S(schema.ConnKey("c1"))}}); err != nil {
		t.Fatal(err)
	}
	e.putConn("c1", schema.Started)
	if r := e.wake(w, wakeup.NeedsOwner, 0, "c1"); r[0].Result != wakeup.Acquired {
		t.Fatalf("needs-owner after delete and re-create: %+v", r)
	}
	c := e.get("c1")
	if c.LeaseOwner != "w1" || c.LeaseVersion <= v {
		t.Fatalf("re-created item %+v", c)
	}
	// Still held and unchanged: answered AlreadyOwned, after the check.
	if r := e.wake(w, wakeup.NeedsOwner, c.LeaseVersion, "c1"); r[0].Result != wakeup.AlreadyOwned {
		t.Fatalf("needs-owner for a lease still held: %+v", r)
	}
	if m := e.up.Stats("c1").MaxClients; m != 1 {
		t.Fatalf("%d upstream clients at once", m)
	}
}

// A worker that joins over a lapsed item of its own id (a reused id) releases the
// connections still named after it: nobody else would.
func TestJoinOverALapsedItemReleasesLeftovers(t *testing.T) {
	e := newEnv(t, rate)
	old := codec.EncodeWorker(codec.Worker{ID: "w1", Addr: "127.0.0.1:1", Incarnation: "old",
		HeartbeatExpiresAtMs: time.Now().Add(-time.Minute).UnixMilli()})
	if _, err := e.db.DB.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: &e.db.Table, Item: old}); err != nil {
		t.Fatal(err)
	}
	e.up.Touch("c1")
	_, err := e.db.DB.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: &e.db.Table,
		Item: codec.EncodeConnection(codec.Connection{ID: "c1", DesiredState: schema.Started, WSURL: e.up.URL("c1"),
			LeaseOwner: "w1", LeaseVersion: 3, LeaseExpiresAtMs: schema.LeaseHeldByMember, LastSeq: 5})})
	if err != nil {
		t.Fatal(err)
	}
	w := e.worker("w1", opts{})
	waitFor(t, 5*time.Second, "leftover released", func() bool { return !e.get("c1").Owned() })
	if c := e.get("c1"); c.LastSeq != 5 || c.LeaseVersion != 3 {
		t.Fatalf("leftover %+v", c)
	}
	if it := e.workerItem("w1"); it.Incarnation == "old" || it.Dead() {
		t.Fatalf("worker item %+v", it)
	}
	_ = w
}
