package sweep_test

import (
	"context"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/functions/reconciler/sweep"
	"github.com/sockfleet/sockfleet/shared/lease"
	"github.com/sockfleet/sockfleet/shared/local/ddbtest"
	"github.com/sockfleet/sockfleet/shared/registry"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

func TestMain(m *testing.M) { ddbtest.Main(m) }

type fixture struct {
	e     *ddbtest.Env
	store *lease.Store
	reg   *registry.Registry
	now   time.Time
}

func setup(t *testing.T) *fixture {
	t.Helper()
	e := ddbtest.New(t)
	store, err := lease.New(e.DB, lease.Config{Table: e.Table})
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{e: e, store: store, reg: &registry.Registry{DB: e.DB, Table: e.Table}, now: time.Now()}
}

func (f *fixture) put(t *testing.T, it codec.Item) {
	t.Helper()
	if _, err := f.e.DB.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: &f.e.Table, Item: it}); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) conn(t *testing.T, c codec.Connection) {
	t.Helper()
	if c.WSURL == "" {
		c.WSURL = "ws://127.0.0.1:1/feed"
	}
	f.put(t, codec.EncodeConnection(c))
}

func (f *fixture) get(t *testing.T, id string) codec.Item {
	t.Helper()
	out, err := f.e.DB.GetItem(context.Background(), &dynamodb.GetItemInput{TableName: &f.e.Table, ConsistentRead: aws.Bool(true),
		Key: map[string]types.AttributeValue{schema.AttrPK: codec.S(id)}})
	if err != nil {
		t.Fatal(err)
	}
	return out.Item
}

func (f *fixture) sweeper(t *testing.T, cfg sweep.Config) *sweep.Sweeper {
	t.Helper()
	cfg.Table = f.e.Table
	s, err := sweep.New(f.e.DB, f.store, f.reg, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func ms(t time.Time) int64 { return t.UnixMilli() }

// seen marks ids as an earlier pass at at found them unowned (unheld_since_ms).
func (f *fixture) seen(t *testing.T, at time.Time, ids ...string) {
	t.Helper()
	for _, id := range ids {
		_, err := f.e.DB.UpdateItem(context.Background(), &dynamodb.UpdateItemInput{TableName: &f.e.Table,
			Key:                       map[string]types.AttributeValue{schema.AttrPK: codec.S(schema.ConnKey(id))},
			UpdateExpression:          aws.String("SET " + schema.AttrUnheldSince + " = :t"),
			ExpressionAttributeValues: map[string]types.AttributeValue{":t": codec.N(ms(at))}})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// An unowned item is nudged only once a pass saw it unowned NudgeAfter ago, whatever
// its own timestamps say: a stale whole-item image brings back old ones while its
// holder, woken by the stream record, takes the lease back.
func TestSweepNudgesOnlyWhatItSawUnownedBefore(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	now := f.now
	f.conn(t, codec.Connection{ID: "stale", DesiredState: schema.Started, LeaseVersion: 3, Status: "released",
		StatusAtMs: ms(now.Add(-time.Hour))})
	s := f.sweeper(t, sweep.Config{})
	for _, step := range []struct {
		at    time.Duration
		nudge bool
	}{{0, false}, {time.Minute, false}, {sweep.DefaultNudgeAfter, true}} {
		r, err := s.Run(ctx, now.Add(step.at))
		if err != nil {
			t.Fatal(err)
		}
		if (r.Nudged == 1) != step.nudge {
			t.Fatalf("at +%s: %+v, want nudged %v", step.at, r, step.nudge)
		}
	}
}

func TestSweep(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	now := f.now
	started := func(id string) codec.Connection { return codec.Connection{ID: id, DesiredState: schema.Started} }
	with := func(c codec.Connection, fn func(*codec.Connection)) codec.Connection { fn(&c); return c }

	f.conn(t, with(started("expired"), func(c *codec.Connection) {
		c.LeaseOwner, c.LeaseExpiresAtMs, c.LeaseVersion = "w-dead", ms(now.Add(-time.Minute)), 2
	}))
	f.conn(t, with(started("within-margin"), func(c *codec.Connection) {
		c.LeaseOwner, c.LeaseExpiresAtMs, c.LeaseVersion = "w-live", ms(now.Add(-2*time.Second)), 1
	}))
	f.conn(t, with(started("healthy"), func(c *codec.Connection) {
		c.LeaseOwner, c.LeaseExpiresAtMs, c.LeaseVersion = "w-live", ms(now.Add(time.Minute)), 1
	}))
	f.conn(t, with(started("owner-gone"), func(c *codec.Connection) {
		c.LeaseOwner, c.LeaseExpiresAtMs, c.LeaseVersion = "w-gone", ms(now.Add(time.Minute)), 1
	}))
	f.conn(t, started("never-owned"))
	f.conn(t, with(started("released-long-ago"), func(c *codec.Connection) {
		c.LeaseVersion, c.Status, c.StatusAtMs = 4, "released", ms(now.Add(-10*time.Minute))
	}))
	f.conn(t, with(started("released-just-now"), func(c *codec.Connection) {
		c.LeaseVersion, c.Status, c.StatusAtMs = 4, "released", ms(now.Add(-10*time.Second))
	}))
	f.conn(t, codec.Connection{ID: "stopped-expired", DesiredState: schema.Stopped, LeaseOwner: "w-dead",
		LeaseExpiresAtMs: ms(now.Add(-time.Minute)), LeaseVersion: 5})
	f.conn(t, codec.Connection{ID: "stopped", DesiredState: schema.Stopped})
	f.conn(t, codec.Connection{ID: "invalid", DesiredState: schema.Started, WSURL: "http://not-a-websocket"})
	for _, w := range []codec.Worker{
		{ID: "w-live", Addr: "127.0.0.1:1", Capacity: 10, HeartbeatExpiresAtMs: ms(now.Add(30 * time.Second))},
		{ID: "w-lapsed", Addr: "127.0.0.1:2", Capacity: 10, HeartbeatExpiresAtMs: ms(now.Add(-time.Minute))},
		{ID: "w-long-gone", Addr: "127.0.0.1:3", Capacity: 10, HeartbeatExpiresAtMs: ms(now.Add(-2 * time.Hour))},
	} {
		if err := f.reg.Put(ctx, w); err != nil {
			t.Fatal(err)
		}
	}

	// A host's connect-quota item, counted and held: scanned, and left alone.
	// (Its shape: worker/internal/connquota, docs/CONNECTIONS.md.)
	if _, err := f.e.DB.PutItem(ctx, &dynamodb.PutItemInput{TableName: &f.e.Table, Item: map[string]types.AttributeValue{
		schema.AttrPK:           codec.S(schema.QuotaKey("stream.example.com")),
		schema.AttrQuotaWindow:  codec.N(now.Truncate(time.Minute).UnixMilli()),
		schema.AttrQuotaDials:   codec.N(3),
		schema.AttrBlockedUntil: codec.N(now.Add(time.Hour).UnixMilli()),
		schema.AttrTTL:          codec.N(now.Add(3 * time.Hour).Unix()),
	}}); err != nil {
		t.Fatal(err)
	}
	quotaItem := f.get(t, schema.QuotaKey("stream.example.com"))

	f.seen(t, now.Add(-sweep.DefaultNudgeAfter), "never-owned", "released-long-ago")
	r, err := f.sweeper(t, sweep.Config{PageSize: 3}).Run(ctx, now)
	if err != nil {
		t.Fatal(err)
	}
	if got := f.get(t, schema.QuotaKey("stream.example.com")); !reflect.DeepEqual(got, quotaItem) {
		t.Errorf("the sweep changed a quota item:\n got %v\nwant %v", got, quotaItem)
	}
	// "invalid" (a ws_url that is not ws://) counts as an orphan and gets its problem
	// written on it.
	want := sweep.Report{Segment: 0, Segments: 1, Pages: 5, Scanned: 14, Complete: true, Released: 2, Nudged: 2,
		WorkersCleared: 1, Orphaned: 7, Unusable: 1, Reported: 1, OldestOrphan: 10 * time.Minute}
	if r.Pages < 4 { // the engine may end on an empty last page or not
		t.Errorf("pages %d, want paginated", r.Pages)
	}
	r.Pages = want.Pages
	if !slices.Equal(r.NotLiveOwners, []string{"w-gone"}) {
		t.Errorf("owners not live %v, want [w-gone] (the expired leases were released)", r.NotLiveOwners)
	}
	r.NotLiveOwners = nil
	if !reflect.DeepEqual(r, want) {
		t.Errorf("report\n got %+v\nwant %+v", r, want)
	}

	for _, id := range []string{"expired", "stopped-expired"} {
		c, _ := codec.DecodeConnection(f.get(t, schema.ConnKey(id)))
		if c.LeaseOwner != "" || c.LeaseExpiresAtMs != 0 {
			t.Errorf("%s not released: %+v", id, c)
		}
	}
	for _, id := range []string{"within-margin", "healthy", "owner-gone"} {
		c, _ := codec.DecodeConnection(f.get(t, schema.ConnKey(id)))
		if c.LeaseOwner == "" {
			t.Errorf("%s released, should be left alone: %+v", id, c)
		}
	}
	for id, nudged := range map[string]bool{"never-owned": true, "released-long-ago": true, "released-just-now": false, "invalid": false, "stopped": false} {
		c, _ := codec.DecodeConnection(f.get(t, schema.ConnKey(id)))
		if got := c.NudgedAtMs == ms(now); got != nudged {
			t.Errorf("%s nudged %v, want %v (%+v)", id, got, nudged, c)
		}
		if nudged && c.LeaseExpiresAtMs != 0 {
			t.Errorf("%s: nudge must leave lease_expires_at_ms = 0", id)
		}
	}
	if f.get(t, schema.WorkerKey("w-long-gone")) != nil || f.get(t, schema.WorkerKey("w-live")) == nil ||
		f.get(t, schema.WorkerKey("w-lapsed")) == nil {
		t.Error("want the worker lapsed for hours cleared, the one lapsed a minute ago and the live one kept")
	}
	inv, _ := codec.DecodeConnection(f.get(t, schema.ConnKey("invalid")))
	if inv.Status != "invalid" || inv.StatusError != `invalid ws_url "http://not-a-websocket": scheme must be ws or wss` {
		t.Errorf("invalid item: status %q, status_error %q", inv.Status, inv.StatusError)
	}

	// A second run right after finds nothing new to do: the nudges are recent.
	r, err = f.sweeper(t, sweep.Config{}).Run(ctx, now.Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if r.Released != 0 || r.Nudged != 0 || r.WorkersCleared != 0 || r.Reported != 0 || r.Unusable != 1 {
		t.Errorf("second run acted again: %+v", r)
	}
	// Nudges do not reset the orphan age: much later, the never-owned item's age
	// counts from its first nudge, and the released one's from its release.
	later := now.Add(time.Hour)
	if _, err := f.sweeper(t, sweep.Config{}).Run(ctx, later.Add(-sweep.DefaultNudgeAfter)); err != nil {
		t.Fatal(err) // the pass that first sees the released ones unowned
	}
	r, err = f.sweeper(t, sweep.Config{}).Run(ctx, later)
	if err != nil {
		t.Fatal(err)
	}
	if r.OldestOrphan != time.Hour+10*time.Minute || r.Nudged != 4 {
		t.Errorf("an hour later: %+v, want the oldest orphan at 1h10m and 4 nudges", r)
	}
	c, _ := codec.DecodeConnection(f.get(t, schema.ConnKey("never-owned")))
	if c.StatusAtMs != ms(now) || c.NudgedAtMs != ms(later) {
		t.Errorf("never-owned: status_at %d (want the first nudge %d), nudged_at %d", c.StatusAtMs, ms(now), c.NudgedAtMs)
	}
}

// After an outage of the table longer than a heartbeat, every worker item has lapsed.
// The sweep must not delete them: the workers' first heartbeats after the outage bring
// them back, and the wakeups that follow need them. Only items that stayed lapsed for
// WorkerClearAfter while other workers were live go.
func TestSweepKeepsWorkersThatLapsedInAnOutage(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	now := f.now
	for _, w := range []codec.Worker{
		{ID: "a", Addr: "127.0.0.1:1", Capacity: 10, HeartbeatExpiresAtMs: ms(now.Add(-3 * time.Hour))},
		{ID: "b", Addr: "127.0.0.1:2", Capacity: 10, HeartbeatExpiresAtMs: ms(now.Add(-90 * time.Second))},
	} {
		if err := f.reg.Put(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	// The engine is back and the sweep runs before any worker heartbeats: none is live.
	r, err := f.sweeper(t, sweep.Config{}).Run(ctx, now)
	if err != nil || r.WorkersCleared != 0 || f.get(t, schema.WorkerKey("a")) == nil || f.get(t, schema.WorkerKey("b")) == nil {
		t.Fatalf("with no live worker: %+v, %v; want every worker item kept", r, err)
	}
	// b heartbeats again; a (lapsed for hours, while b is live) is cleared.
	if err := f.reg.Put(ctx, codec.Worker{ID: "b", Addr: "127.0.0.1:2", Capacity: 10, HeartbeatExpiresAtMs: ms(now.Add(time.Minute))}); err != nil {
		t.Fatal(err)
	}
	r, err = f.sweeper(t, sweep.Config{}).Run(ctx, now)
	if err != nil || r.WorkersCleared != 1 || f.get(t, schema.WorkerKey("a")) != nil || f.get(t, schema.WorkerKey("b")) == nil {
		t.Fatalf("with b live: %+v, %v; want a cleared, b kept", r, err)
	}
}

func TestSweepBudgetAndSegments(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	for i := range 20 {
		f.conn(t, codec.Connection{ID: "c" + string(rune('a'+i)), DesiredState: schema.Stopped})
	}
	r, err := f.sweeper(t, sweep.Config{PageSize: 4, MaxItems: 6}).Run(ctx, f.now)
	if err != nil {
		t.Fatal(err)
	}
	if r.Scanned != 6 || r.Complete {
		t.Errorf("budget: %+v, want 6 items read and the run incomplete", r)
	}
	// Two segments, one per period: two consecutive periods read every item once.
	period := time.Minute
	total := 0
	segs := map[int]bool{}
	for k := range 2 {
		at := time.Unix(0, 0).Add(time.Duration(k) * period)
		r, err := f.sweeper(t, sweep.Config{Segments: 2, Period: period}).Run(ctx, at)
		if err != nil {
			t.Fatal(err)
		}
		if !r.Complete {
			t.Errorf("segment %d incomplete", r.Segment)
		}
		total += r.Scanned
		segs[r.Segment] = true
	}
	if total != 20 || len(segs) != 2 {
		t.Errorf("two segments read %d items in segments %v, want 20 in both", total, segs)
	}
}

func TestNudgeConditions(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	f.conn(t, codec.Connection{ID: "unowned", DesiredState: schema.Started})
	f.conn(t, codec.Connection{ID: "owned", DesiredState: schema.Started, LeaseOwner: "w", LeaseExpiresAtMs: ms(f.now.Add(time.Minute)), LeaseVersion: 1})
	f.conn(t, codec.Connection{ID: "stopped", DesiredState: schema.Stopped})
	// An owner removed by hand, its expiry left behind.
	f.conn(t, codec.Connection{ID: "hand-edited", DesiredState: schema.Started, LeaseExpiresAtMs: ms(f.now.Add(time.Minute)), LeaseVersion: 1})
	for id, want := range map[string]bool{"unowned": true, "owned": false, "stopped": false, "missing": false, "hand-edited": true} {
		got, err := sweep.Nudge(ctx, f.e.DB, f.e.Table, id, f.now)
		if err != nil || got != want {
			t.Errorf("Nudge(%s) = %v, %v; want %v", id, got, err, want)
		}
	}
	if f.get(t, schema.ConnKey("missing")) != nil {
		t.Error("a nudge created an item")
	}
	if _, err := sweep.Nudge(ctx, f.e.DB, f.e.Table, "CONN#x", f.now); err == nil {
		t.Error("a key passed as an id was accepted")
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []sweep.Config{
		{},
		{Table: "t", NudgeAfter: time.Second, SkewMargin: 5 * time.Second},
		{Table: "t", Segments: -1},
		{Table: "t", MaxItems: -5},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v validated", c)
		}
	}
}

// Operator edits the sweep meets: a lease_version deleted from an expired lease is
// released (it used to read back version 0 and be "held" on every run), an unowned
// item with a string lease_version is still nudged (the acquire repairs it), and a
// lowercase "started" counts as an unusable orphan with its problem on the item.
func TestSweepOperatorEdits(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	now := f.now
	expired := codec.EncodeConnection(codec.Connection{ID: "expired", DesiredState: schema.Started, WSURL: "ws://127.0.0.1:1/x",
		LeaseOwner: "w-dead", LeaseExpiresAtMs: ms(now.Add(-time.Minute))})
	delete(expired, schema.AttrLeaseVersion)
	f.put(t, expired)
	strVersion := codec.EncodeConnection(codec.Connection{ID: "str-version", DesiredState: schema.Started, WSURL: "ws://127.0.0.1:1/x"})
	strVersion[schema.AttrLeaseVersion] = codec.S("seven")
	f.put(t, strVersion)
	typo := codec.EncodeConnection(codec.Connection{ID: "typo", DesiredState: "started", WSURL: "ws://127.0.0.1:1/x"})
	f.put(t, typo)
	if err := f.reg.Put(ctx, codec.Worker{ID: "w-live", Addr: "127.0.0.1:1", Capacity: 10, HeartbeatExpiresAtMs: ms(now.Add(time.Minute))}); err != nil {
		t.Fatal(err)
	}
	f.seen(t, now.Add(-sweep.DefaultNudgeAfter), "str-version")
	for run := range 2 {
		r, err := f.sweeper(t, sweep.Config{}).Run(ctx, now.Add(time.Duration(run)*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if run == 0 && (r.Released != 1 || r.Nudged != 1 || r.Unusable != 1 || r.Reported != 1) {
			t.Errorf("first run %+v: want 1 released, 1 nudged, 1 unusable reported", r)
		}
		if run == 1 && (r.Released != 0 || r.Reported != 0 || r.Errors != 0 || r.Unusable != 1) {
			t.Errorf("second run %+v: want nothing more to do, the typo still counted", r)
		}
	}
	c, _ := codec.DecodeConnection(f.get(t, schema.ConnKey("expired")))
	if c.Owned() || c.LeaseVersion == 0 || c.Status != "expired" {
		t.Errorf("expired: %+v", c)
	}
	c, _ = codec.DecodeConnection(f.get(t, schema.ConnKey("typo")))
	if c.Status != "invalid" || c.StatusError != `invalid desired_state "started": want STARTED or STOPPED` {
		t.Errorf("typo: status %q, status_error %q", c.Status, c.StatusError)
	}
}
