package reaper_test

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/sockfleet/sockfleet/functions/reconciler/reaper"
	"github.com/sockfleet/sockfleet/shared/lease"
	"github.com/sockfleet/sockfleet/shared/local/ddbtest"
	"github.com/sockfleet/sockfleet/shared/registry"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

func TestMain(m *testing.M) { ddbtest.Main(m) }

const skew = 2 * time.Second

type fixture struct {
	t     *testing.T
	ctx   context.Context
	e     *ddbtest.Env
	reg   *registry.Registry
	store *lease.Store
	now   time.Time
}

func setup(t *testing.T) *fixture {
	e := ddbtest.New(t)
	s, err := lease.New(e.DB, lease.Config{Table: e.Table, SkewMargin: skew, Membership: true})
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{t: t, ctx: context.Background(), e: e, reg: &registry.Registry{DB: e.DB, Table: e.Table}, store: s, now: time.Now()}
}

func (f *fixture) join(id, inc string, exp time.Time) codec.Worker {
	f.t.Helper()
	w := codec.Worker{ID: id, Addr: "127.0.0.1:1", Capacity: 10, Incarnation: inc, HeartbeatExpiresAtMs: exp.UnixMilli()}
	if _, err := f.reg.Join(f.ctx, w, exp.Add(-time.Hour), skew); err != nil {
		f.t.Fatal(err)
	}
	return w
}

// own creates connection id and acquires it for worker.
func (f *fixture) own(id, worker string) lease.Lease {
	f.t.Helper()
	f.conn(codec.Connection{ID: id, DesiredState: schema.Started, WSURL: "ws://h/" + id})
	l, err := f.store.Acquire(f.ctx, id, worker)
	if err != nil {
		f.t.Fatal(err)
	}
	return l
}

func (f *fixture) conn(c codec.Connection) {
	f.t.Helper()
	if _, err := f.e.DB.PutItem(f.ctx, f.putInput(c)); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) get(id string) codec.Connection {
	f.t.Helper()
	c, err := f.store.Get(f.ctx, id)
	if err != nil {
		f.t.Fatal(err)
	}
	return c
}

func (f *fixture) reaper(leases reaper.Leases) *reaper.Reaper {
	if leases == nil {
		leases = f.store
	}
	return &reaper.Reaper{Registry: f.reg, Leases: leases, Skew: skew}
}

// A member whose lease lapsed beyond the margin is declared dead and its
// connections released, conditioned on owner and version; live members, and one
// lapsed within the margin, are left alone.
func TestLapsedMemberDeclaredDeadAndReleased(t *testing.T) {
	f := setup(t)
	hung := f.join("hung", "i1", f.now.Add(-skew-time.Millisecond))
	f.join("live", "i2", f.now.Add(10*time.Second))
	f.join("late", "i3", f.now.Add(-skew+500*time.Millisecond))
	a, b := f.own("a", "hung"), f.own("b", "hung")
	f.own("c", "live")
	f.own("d", "late")
	rep, ws, err := f.reaper(nil).Reap(f.ctx, f.now)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(rep.Released)
	if !slices.Equal(rep.Declared, []string{"hung"}) || !slices.Equal(rep.Released, []string{"a", "b"}) || len(ws) != 3 {
		t.Fatalf("report %+v (listed %d)", rep, len(ws))
	}
	for _, l := range []lease.Lease{a, b} {
		c := f.get(l.ID)
		if c.Owned() || c.LeaseVersion != l.Version || c.Status != "owner stopped" {
			t.Errorf("%s after reap: %+v", l.ID, c)
		}
	}
	for _, id := range []string{"c", "d"} {
		if c := f.get(id); !c.Owned() {
			t.Errorf("%s released: %+v", id, c)
		}
	}
	// The dead member learns it at its next renew, and must exit.
	hung.HeartbeatExpiresAtMs = f.now.Add(10 * time.Second).UnixMilli()
	if err := f.reg.Renew(f.ctx, hung); !errors.Is(err, registry.ErrNotMember) {
		t.Fatalf("dead member's renew: %v, want ErrNotMember", err)
	}
	// A second pass does nothing new.
	rep, _, err = f.reaper(nil).Reap(f.ctx, f.now)
	if err != nil || len(rep.Declared)+len(rep.Released) != 0 {
		t.Fatalf("second pass: %+v %v", rep, err)
	}
}

// Finding: a connection owned by a worker with no registry item waited out its
// lease (an hour). It is now released once a worker that was still streaming
// without an item must have fenced: a tombstone is written at once, and the
// connection goes when the tombstone's lease lapsed beyond the margin.
func TestAbsentOwnerReleasedAfterTombstoneLapses(t *testing.T) {
	f := setup(t)
	f.join("live", "i", f.now.Add(time.Hour))
	f.conn(codec.Connection{ID: "x", DesiredState: schema.Started, WSURL: "ws://h/x", LeaseOwner: "ghost", LeaseVersion: 4,
		LeaseExpiresAtMs: f.now.Add(time.Hour).UnixMilli()})
	r := f.reaper(nil)
	ws, _, _ := f.reg.List(f.ctx)
	rep, err := r.Owners(f.ctx, f.now, ws, []string{"ghost", "ghost"})
	if err != nil || !slices.Equal(rep.Tombstoned, []string{"ghost"}) || len(rep.Released) != 0 {
		t.Fatalf("first sight: %+v %v", rep, err)
	}
	if !f.get("x").Owned() {
		t.Fatal("released at first sight: the owner may still be streaming until its fence")
	}
	// Just before the tombstone lapses beyond the margin: still held.
	at := f.now.Add(registry.TombstoneLease + skew)
	if rep, _, _ := r.Reap(f.ctx, at); len(rep.Released) != 0 {
		t.Fatalf("released at %s: %+v", at.Sub(f.now), rep)
	}
	// Once it lapsed: the lease is marked, and released a Hold later (a holder that
	// a stale image naming the absent owner displaced takes it back meanwhile).
	at = at.Add(time.Millisecond)
	r.Hold = 300 * time.Millisecond
	if rep, _, err = r.Reap(f.ctx, at); err != nil || len(rep.Released) != 0 {
		t.Fatalf("released before the hold: %+v %v", rep, err)
	}
	time.Sleep(r.Hold)
	rep, _, err = r.Reap(f.ctx, at.Add(r.Hold))
	if err != nil || !slices.Equal(rep.Released, []string{"x"}) {
		t.Fatalf("after the tombstone lapsed: %+v %v", rep, err)
	}
	if c := f.get("x"); c.Owned() || c.LeaseVersion != 4 {
		t.Fatalf("item %+v", c)
	}
	// The live member was never touched.
	ws, _, _ = f.reg.List(f.ctx)
	for _, w := range ws {
		if w.ID == "live" && !w.Live(at.UnixMilli()) {
			t.Fatalf("live member changed: %+v", w)
		}
	}
}

// flaky fails the first n ReleaseAllOwnedBy calls, as during an outage.
type flaky struct {
	lease *lease.Store
	fails atomic.Int32
}

func (f *flaky) ReleaseAllOwnedBy(ctx context.Context, w string) ([]string, error) {
	if f.fails.Add(-1) >= 0 {
		return nil, lease.ErrUnavailable
	}
	return f.lease.ReleaseAllOwnedBy(ctx, w)
}

func (f *flaky) ReleaseAllOwnedByAfter(ctx context.Context, w string, hold time.Duration) ([]string, error) {
	if f.fails.Add(-1) >= 0 {
		return nil, lease.ErrUnavailable
	}
	return f.lease.ReleaseAllOwnedByAfter(ctx, w, hold)
}

// Finding: a failed release was never retried. A dead member's connections are
// retried on later passes while it is within RetryFor of its lapse, and by any pass
// that is shown one of its connections after that.
func TestFailedReleaseIsRetried(t *testing.T) {
	f := setup(t)
	f.join("hung", "i", f.now.Add(-skew-time.Second))
	f.own("a", "hung")
	fl := &flaky{lease: f.store}
	fl.fails.Store(1)
	r := f.reaper(fl)
	rep, _, err := r.Reap(f.ctx, f.now)
	if err == nil || !slices.Equal(rep.Declared, []string{"hung"}) || len(rep.Released) != 0 {
		t.Fatalf("first pass: %+v %v", rep, err)
	}
	if !f.get("a").Owned() {
		t.Fatal("released despite the failure")
	}
	// A retry marks what still names the dead member and releases it once the mark
	// is Hold old (a stale image's holder would have taken it back by then).
	r.Hold = 300 * time.Millisecond
	rep, _, err = r.Reap(f.ctx, f.now.Add(time.Second))
	if err != nil || len(rep.Released) != 0 {
		t.Fatalf("retry released at once: %+v %v", rep, err)
	}
	time.Sleep(r.Hold)
	rep, _, err = r.Reap(f.ctx, f.now.Add(2*time.Second))
	if err != nil || !slices.Equal(rep.Released, []string{"a"}) {
		t.Fatalf("retry: %+v %v", rep, err)
	}
	// Long after, a pass leaves the dead member alone unless one of its connections
	// is seen.
	f.own("b", "hung") // an acquire that landed after the declaration
	late := f.now.Add(reaper.DefaultRetryFor + time.Minute)
	if rep, _, _ := r.Reap(f.ctx, late); len(rep.Released) != 0 {
		t.Fatalf("long-dead member reaped without being seen: %+v", rep)
	}
	ws, _, _ := f.reg.List(f.ctx)
	if rep, err = r.Owners(f.ctx, late, ws, []string{"hung"}); err != nil || len(rep.Released) != 0 {
		t.Fatalf("seen owner released before the hold: %+v %v", rep, err)
	}
	time.Sleep(r.Hold)
	rep, err = r.Owners(f.ctx, late, ws, []string{"hung"})
	if err != nil || !slices.Equal(rep.Released, []string{"b"}) {
		t.Fatalf("seen owner: %+v %v", rep, err)
	}
}

// A registry item without an incarnation (a polling-mode worker, or an older
// version's) is never declared dead: its leases expire on their own.
func TestItemWithoutIncarnationIsNotReaped(t *testing.T) {
	f := setup(t)
	if err := f.reg.Put(f.ctx, codec.Worker{ID: "old", Addr: "127.0.0.1:1", Capacity: 10,
		HeartbeatExpiresAtMs: f.now.Add(-time.Minute).UnixMilli()}); err != nil {
		t.Fatal(err)
	}
	f.own("a", "old")
	rep, _, err := f.reaper(nil).Reap(f.ctx, f.now)
	if err != nil || len(rep.Declared)+len(rep.Released) != 0 {
		t.Fatalf("reaped an item without an incarnation: %+v %v", rep, err)
	}
	if !f.get("a").Owned() {
		t.Fatal("its connection was released")
	}
}

func TestDueAtMostOncePerInterval(t *testing.T) {
	r := &reaper.Reaper{Every: 2 * time.Second}
	t0 := time.Now()
	if !r.Due(t0) || r.Due(t0.Add(time.Second)) || !r.Due(t0.Add(2*time.Second)) || r.Due(t0.Add(3*time.Second)) {
		t.Fatal("Due does not throttle to one per interval")
	}
}

func (f *fixture) putInput(c codec.Connection) *dynamodb.PutItemInput {
	return &dynamodb.PutItemInput{TableName: &f.e.Table, Item: codec.EncodeConnection(c)}
}

// An outage of the table lapses every member at once, and the heartbeats stop. The
// first heartbeat after it must not get the members that have yet to renew expelled:
// declarations wait Grace, then a member still lapsed is declared dead as usual.
func TestQuietSpellDefersDeclarations(t *testing.T) {
	f := setup(t)
	r := f.reaper(nil)
	t0 := f.now.Add(-time.Minute)
	if !r.Due(t0) { // heartbeats before the outage
		t.Fatal("first heartbeat not due")
	}
	f.join("slow", "i1", f.now.Add(-skew-5*time.Second)) // lapsed in the outage, renews a little later
	f.join("first", "i2", f.now.Add(10*time.Second))     // renewed as soon as the table was back
	f.own("a", "slow")
	// The quiet spell ends: this heartbeat claims a reap, which declares nobody.
	if !r.Due(f.now) {
		t.Fatal("heartbeat after the quiet spell not due")
	}
	rep, _, err := r.Reap(f.ctx, f.now)
	if err != nil || len(rep.Declared)+len(rep.Released) != 0 {
		t.Fatalf("within the grace: %+v %v", rep, err)
	}
	if c := f.get("a"); !c.Owned() {
		t.Fatalf("released within the grace: %+v", c)
	}
	// Heartbeats go on; once the grace has passed, a member that is still lapsed is
	// declared dead and its connections released.
	later := f.now.Add(reaper.DefaultGrace)
	if rep, _, _ := r.Reap(f.ctx, later.Add(-time.Millisecond)); len(rep.Declared) != 0 {
		t.Fatalf("declared within the grace: %+v", rep)
	}
	rep, _, err = r.Reap(f.ctx, later)
	if err != nil || !slices.Equal(rep.Declared, []string{"slow"}) || !slices.Equal(rep.Released, []string{"a"}) {
		t.Fatalf("after the grace: %+v %v", rep, err)
	}
}

// Steady heartbeats never open a grace: a hung member is declared dead on the next
// reap, as before.
func TestSteadyHeartbeatsDeclareAtOnce(t *testing.T) {
	f := setup(t)
	r := f.reaper(nil)
	for i := range 5 {
		r.Due(f.now.Add(time.Duration(i-5) * 3 * time.Second))
	}
	f.join("hung", "i1", f.now.Add(-skew-time.Millisecond))
	if !r.Due(f.now) {
		t.Fatal("not due")
	}
	rep, _, err := r.Reap(f.ctx, f.now)
	if err != nil || !slices.Equal(rep.Declared, []string{"hung"}) {
		t.Fatalf("%+v %v", rep, err)
	}
}

// The sweep's reap runs without a heartbeat. One that comes while no heartbeat has
// arrived for longer than the quiet spell (the table just came back, the members
// renew a tick later) gives the same grace a heartbeat that ends the spell would;
// a sweep after the grace, still without heartbeats (the fleet is really gone),
// declares as before.
func TestSweepAfterQuietSpellGivesGrace(t *testing.T) {
	f := setup(t)
	r := f.reaper(nil)
	if !r.Due(f.now.Add(-time.Minute)) { // heartbeats before the outage
		t.Fatal("first heartbeat not due")
	}
	f.join("slow", "i1", f.now.Add(-skew-5*time.Second)) // lapsed in the outage, renews a little later
	f.own("a", "slow")
	rep, _, err := r.Reap(f.ctx, f.now) // the sweep: no heartbeat since the outage
	if err != nil || len(rep.Declared)+len(rep.Released) != 0 {
		t.Fatalf("sweep just after a quiet spell: %+v %v; want nobody declared", rep, err)
	}
	if c := f.get("a"); !c.Owned() {
		t.Fatalf("released within the grace: %+v", c)
	}
	if rep, _, _ := r.Reap(f.ctx, f.now.Add(reaper.DefaultGrace-time.Millisecond)); len(rep.Declared) != 0 {
		t.Fatalf("declared within the grace: %+v", rep)
	}
	rep, _, err = r.Reap(f.ctx, f.now.Add(time.Minute)) // the next sweep, still no heartbeat
	if err != nil || !slices.Equal(rep.Declared, []string{"slow"}) || !slices.Equal(rep.Released, []string{"a"}) {
		t.Fatalf("next sweep: %+v %v; want slow declared and a released", rep, err)
	}
}
