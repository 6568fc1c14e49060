package fleet_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/local/fleet"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

var (
	chaosSeed     = flag.Uint64("chaos.seed", 0, "TestChaos: seed of the fault schedule (0: from the time)")
	chaosDuration = flag.Duration("chaos.duration", 25*time.Second, "TestChaos: how long faults are injected (at least 10s)")
	chaosWorkers  = flag.Int("chaos.workers", 4, "TestChaos: worker processes")
	chaosConns    = flag.Int("chaos.conns", 24, "TestChaos: connections")
)

const (
	chaosRate          = 15.0      // upstream messages per second per stream
	chaosClientTimeout = testRenew // the upstream drops a client that answers no ping this long

	// chaosFence is when a worker stops streaming a lease it could not renew: the
	// owner's FenceAfter(lease, renew deadline, margin), the renew deadline being
	// lease − renew as startFleetWith sets it.
	chaosFence = testLease - testRenew

	// chaosOverlapBound is how long two upstream clients of one connection may
	// coexist, as the upstream sees it.
	//
	// The lease design allows no overlap at all: a worker that cannot renew stops at
	// its fence (lease − renew after its last renew began, on its monotonic clock),
	// while another worker acquires only once the lease expired more than the skew
	// margin ago on its own clock — at least lease + margin − |clock offset| after
	// that renew began, later than the fence. The only other ways to lose a lease are
	// explicit releases: the owner's own (after it closed its socket), the
	// reconciler's for a task that stopped (the owner is dead), and the sweep's
	// (expired leases only, as above).
	//
	// What the upstream records can still lag the truth, and the bound allows for it:
	//   - A worker that learns of a lost lease does so at its next renew, at most one
	//     renew interval later (the bound).
	//   - A frozen worker (SIGSTOP) cannot close its socket; the upstream drops it only
	//     after ClientTimeout without a pong. The frozen worker sends nothing while
	//     paused, but its socket counts as a client until then.
	// Hence renew interval + ClientTimeout. Runs so far measured no overlap at all;
	// with self-fencing disabled in the worker they measured up to 3.2 s.
	chaosOverlapBound = testRenew + chaosClientTimeout

	// chaosHandoffOverlapBound is how long a planned handoff may keep two sockets
	// open, one of them a standby that does not deliver (docs/HANDOFF.md, "Who
	// delivers"): the worker's standby timeout (its defaults: prepare 10 s + 10 s)
	// plus the cut (the last sink write and the close handshake), with a margin.
	chaosHandoffOverlapBound = 25 * time.Second

	// chaosRecoveryBound is how long after the faults stop (proxies clean, every worker
	// continued) every STARTED connection must stream again. The slowest path: a
	// lease renewed just before the end by a worker that then lost it without a
	// release reaching the table (fenced during an outage, killed with its leases
	// half-released) expires at most one lease later; the sweep releases it once it
	// expired by the margin, at most one sweep period after that; the release flows
	// through the stream to the reconciler, which wakes a worker. If that wakeup is
	// refused or lost (a worker restarting), the sweep nudges the item after
	// NudgeAfter, at most one more sweep period later. A few seconds on top cover the
	// stream poller, a worker's restart delay (1 s) and start-up, the dial and a
	// loaded machine.
	chaosRecoveryBound = testLease + testMargin + 2*testSweep + testNudge + 4*time.Second
)

// chaosAction is one step of a chaos schedule.
type chaosAction struct {
	at     time.Duration // after the fault window opens
	kind   string        // kill, term, stop, cont, faults, down, up, cut, heal, stopconn, startconn, snap, restore
	slot   int           // kill, term, stop, cont, cut, heal
	conn   string        // stopconn, startconn, snap, restore, edit
	faults fleet.Faults  // faults
	edit   string        // edit: the update expression
}

func (a chaosAction) String() string {
	switch a.kind {
	case "kill", "term", "stop", "cont", "cut", "heal":
		return fmt.Sprintf("%s slot %d", a.kind, a.slot)
	case "stopconn", "startconn", "snap", "restore":
		return a.kind + " " + a.conn
	case "edit":
		return fmt.Sprintf("edit %s: %s", a.conn, a.edit)
	case "faults":
		f := a.faults
		return fmt.Sprintf("faults latency<%s 5xx=%.3f throttle=%.3f drop=%.3f", f.MaxLatency, f.P5xx, f.PThrottle, f.PDrop)
	}
	return a.kind
}

// chaosPlan draws a whole fault schedule from rng before anything runs, so a seed
// always yields the same schedule whatever happens while it runs.
func chaosPlan(rng *rand.Rand, window time.Duration, workers int, conns []string) []chaosAction {
	var plan []chaosAction
	add := func(a chaosAction) { plan = append(plan, a) }
	between := func(lo, hi time.Duration) time.Duration {
		if hi <= lo {
			return lo
		}
		return lo + time.Duration(rng.Int64N(int64(hi-lo)))
	}

	// Outages longer than a lease: one per 30 s of window, at least one, each in a
	// segment of its own.
	n := max(1, int(window/(30*time.Second)))
	seg := window / time.Duration(n)
	for i := range n {
		d := between(testLease+500*time.Millisecond, testLease+2500*time.Millisecond)
		lo := time.Duration(i)*seg + time.Second
		at := between(lo, max(lo, time.Duration(i+1)*seg-d-time.Second))
		add(chaosAction{at: at, kind: "down"})
		add(chaosAction{at: at + d, kind: "up"})
	}

	// Partitions: one worker loses the table while the rest keep it, briefly (it
	// keeps its leases) or past the lease and margin (it must fence itself before the
	// others take over).
	cutUntil := make([]time.Duration, workers)
	for at := between(2*time.Second, 6*time.Second); at < window; at += between(4*time.Second, 8*time.Second) {
		slot := rng.IntN(workers)
		if at < cutUntil[slot] {
			continue
		}
		d := between(300*time.Millisecond, chaosFence)
		if rng.IntN(2) == 0 {
			d = between(testLease+testMargin, 2*testLease)
		}
		cutUntil[slot] = min(at+d, window)
		add(chaosAction{at: at, kind: "cut", slot: slot})
		add(chaosAction{at: cutUntil[slot], kind: "heal", slot: slot})
	}

	// The proxies' fault mix changes every few seconds; some phases are clean.
	for at := time.Duration(0); at < window; at += between(2*time.Second, 5*time.Second) {
		var f fleet.Faults
		if rng.Float64() >= 0.25 {
			f = fleet.Faults{
				MaxLatency: between(0, 250*time.Millisecond),
				P5xx:       0.06 * rng.Float64(),
				PThrottle:  0.06 * rng.Float64(),
				PDrop:      0.06 * rng.Float64(),
			}
		}
		add(chaosAction{at: at, kind: "faults", faults: f})
	}

	// Worker processes: SIGKILL, SIGTERM, or SIGSTOP then SIGCONT after a pause that
	// is short (the worker keeps its leases), past the fence (it must stop), or past
	// the lease and margin (others take over).
	pausedUntil := make([]time.Duration, workers)
	for at := between(time.Second, 2*time.Second); at < window; at += between(500*time.Millisecond, 2500*time.Millisecond) {
		slot := rng.IntN(workers)
		r := rng.Float64()
		switch {
		case r < 0.35:
			add(chaosAction{at: at, kind: "kill", slot: slot})
		case r < 0.6 || at < pausedUntil[slot]:
			add(chaosAction{at: at, kind: "term", slot: slot})
		default:
			var pause time.Duration
			switch p := rng.Float64(); {
			case p < 0.4:
				pause = between(200*time.Millisecond, 2*time.Second)
			case p < 0.7:
				pause = between(chaosFence, testLease+testMargin)
			default:
				pause = between(testLease+testMargin, 2*testLease)
			}
			pausedUntil[slot] = min(at+pause, window)
			add(chaosAction{at: at, kind: "stop", slot: slot})
			add(chaosAction{at: pausedUntil[slot], kind: "cont", slot: slot})
		}
	}

	// At least one member declared dead that comes back: SIGSTOP long enough for its
	// membership lease to lapse beyond the margin and the reconciler to act on the
	// next heartbeat, then SIGCONT. It must stop without delivering and exit.
	{
		slot, at := rng.IntN(workers), between(window/4, window/2)
		add(chaosAction{at: at, kind: "stop", slot: slot})
		add(chaosAction{at: min(at+2*testLease+time.Second, window), kind: "cont", slot: slot})
	}

	// The operator stops a connection now and then, and starts it again.
	stoppedUntil := map[string]time.Duration{}
	stops := map[string][][2]time.Duration{}
	for at := between(2*time.Second, 5*time.Second); at < window-2*time.Second; at += between(3*time.Second, 6*time.Second) {
		c := conns[rng.IntN(len(conns))]
		if at < stoppedUntil[c] {
			continue
		}
		stoppedUntil[c] = min(at+between(time.Second, 4*time.Second), window-time.Second)
		stops[c] = append(stops[c], [2]time.Duration{at, stoppedUntil[c]})
		add(chaosAction{at: at, kind: "stopconn", conn: c})
		add(chaosAction{at: stoppedUntil[c], kind: "startconn", conn: c})
	}

	// A console user saves a stale image: the whole item as it was read a while ago
	// (snap), written back with PutItem (restore), rolling back lease_owner,
	// lease_version, the expiry and last_seq. Only while the connection is STARTED
	// at both moments, so the operator's desired_state is not rolled back too.
	restoring := map[string]time.Duration{}
	for at := between(2*time.Second, 4*time.Second); at < window-3*time.Second; at += between(1500*time.Millisecond, 4*time.Second) {
		c := conns[rng.IntN(len(conns))]
		back := min(at+between(500*time.Millisecond, 2*testLease), window-time.Second)
		clash := at < restoring[c]
		for _, st := range stops[c] {
			clash = clash || (st[0] < back+time.Second && at < st[1]+time.Second)
		}
		if clash {
			continue
		}
		restoring[c] = back
		add(chaosAction{at: at, kind: "snap", conn: c})
		add(chaosAction{at: back, kind: "restore", conn: c})
	}

	// A console user deletes or zeroes a lease field of a STARTED connection by hand
	// (docs/MEMBERSHIP.md, "Operator edits").
	edits := []string{"REMOVE lease_expires_at_ms", "SET lease_expires_at_ms = :zero", "REMOVE lease_owner"}
	for at := between(2*time.Second, 4*time.Second); at < window-3*time.Second; at += between(2*time.Second, 5*time.Second) {
		c := conns[rng.IntN(len(conns))]
		clash := false
		for _, st := range stops[c] {
			clash = clash || (st[0] < at+time.Second && at < st[1]+time.Second)
		}
		if clash {
			continue
		}
		add(chaosAction{at: at, kind: "edit", conn: c, edit: edits[rng.IntN(len(edits))]})
	}

	sort.SliceStable(plan, func(i, j int) bool { return plan[i].at < plan[j].at })
	return plan
}

// TestChaos runs a fleet through a seeded schedule of faults — SIGKILL, SIGTERM and
// SIGSTOP/SIGCONT of workers, one worker's clock offset within the skew margin,
// DynamoDB proxies between the workers and the engine that add latency, fail,
// throttle, drop responses to applied writes, cut one worker off (sometimes for
// longer than a lease) and go down for all of them for longer than a lease,
// operator stops and starts, console-style saves of stale whole-item images that
// roll the lease and checkpoint back, and lease fields deleted or zeroed by hand —
// then checks that every STARTED connection
// streams again within a bound, and over the whole run: at most one streaming
// client per connection apart from a bounded overlap, and no sequence gap at the
// sinks.
//
// Replay: every random choice (the schedule, which worker, which signal, when, the
// clock offset, the proxies' fault draws) comes from the seed, so a failing seed
// replays the same schedule. Timing does not replay: which requests the proxies'
// draws land on, where a signal catches a worker, and the workers' own backoff
// jitter vary from run to run, so a rare interleaving may need several replays.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos run")
	}
	seed := *chaosSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	replay := fmt.Sprintf("go test ./shared/local/fleet -run TestChaos -chaos.seed=%d", seed)
	if *chaosDuration != 25*time.Second {
		replay += " -chaos.duration=" + chaosDuration.String()
	}
	if *chaosWorkers != 4 {
		replay += fmt.Sprint(" -chaos.workers=", *chaosWorkers)
	}
	if *chaosConns != 24 {
		replay += fmt.Sprint(" -chaos.conns=", *chaosConns)
	}
	t.Logf("chaos seed %d (replay: %s)", seed, replay)
	t.Cleanup(func() { // registered first, so it runs last, after the fleet's logs
		if t.Failed() {
			t.Logf("chaos seed %d FAILED (replay: %s)", seed, replay)
		}
	})
	rng := rand.New(rand.NewPCG(seed, seed^0xc4a05))
	window := max(*chaosDuration, 10*time.Second)
	workers := max(*chaosWorkers, 2)

	ids := make([]string, max(*chaosConns, 1))
	for i := range ids {
		ids[i] = fmt.Sprintf("k%02d", i)
	}
	offsetSlot := rng.IntN(workers)
	offset := testMargin - 100*time.Millisecond
	if rng.IntN(2) == 0 {
		offset = -offset
	}
	plan := chaosPlan(rng, window, workers, ids)
	t.Logf("%d workers, %d connections, %s of faults, %d actions; slot %d's clock is off by %s",
		workers, len(ids), window, len(plan), offsetSlot, offset)

	// One fault proxy per worker slot, all with the same fault mix, so that one
	// worker can be cut off alone (a partition) as well as all at once (an outage).
	// The reconciler reaches the engine without faults (through the IAM proxy, as its role).
	proxies := make([]*fleet.FaultProxy, workers)
	col, err := fleet.NewCollector()
	if err != nil {
		t.Fatal(err)
	}
	defer col.Close()
	f := startFleetWith(t, fleetOptions{
		Collector:     col,
		Workers:       workers,
		Rate:          chaosRate,
		ClientTimeout: chaosClientTimeout,
		WorkerEndpoint: func(engine string) string {
			for slot := range proxies {
				p, err := fleet.NewFaultProxy(engine, seed+uint64(slot))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { p.Close() })
				proxies[slot] = p
			}
			return proxies[0].Endpoint()
		},
		SlotEndpoint: func(slot int) string { return proxies[slot].Endpoint() },
		WorkerEnv: func(slot int) []string {
			if slot == offsetSlot {
				return []string{schema.EnvClockOffset + "=" + offset.String()}
			}
			return nil
		},
	})
	for _, id := range ids {
		f.add(id)
	}
	waitFor(t, 20*time.Second, "every connection streaming before the faults", func() (bool, string) {
		return f.streamingElsewhere(ids, "")
	})

	// The fault window.
	start := time.Now()
	counts := map[string]int{}
	images := map[string]codec.Item{}
	outage, cut := false, make([]bool, workers)
	setDown := func() {
		for slot, p := range proxies {
			p.SetDown(outage || cut[slot])
		}
	}
	for _, a := range plan {
		time.Sleep(time.Until(start.Add(a.at)))
		counts[a.kind]++
		note := ""
		switch a.kind {
		case "kill", "term", "stop", "cont":
			sig := map[string]syscall.Signal{"kill": syscall.SIGKILL, "term": syscall.SIGTERM, "stop": syscall.SIGSTOP, "cont": syscall.SIGCONT}[a.kind]
			if p := f.stack.Sup.Get(a.slot); p != nil {
				note = p.ID
			}
			if err := f.stack.Sup.Signal(a.slot, sig); err != nil {
				note += fmt.Sprintf(" (%v)", err) // between a worker's exit and its restart
			}
		case "faults":
			for _, p := range proxies {
				p.SetFaults(a.faults)
			}
		case "down", "up":
			outage = a.kind == "down"
			setDown()
		case "cut", "heal":
			cut[a.slot] = a.kind == "cut"
			setDown()
		case "stopconn":
			f.setState(a.conn, schema.Stopped)
		case "startconn":
			f.setState(a.conn, schema.Started)
		case "snap":
			images[a.conn] = f.rawConn(a.conn)
			note = describeLease(images[a.conn])
		case "restore":
			note = describeLease(f.rawConn(a.conn)) + " ← " + describeLease(images[a.conn])
			f.putRaw(images[a.conn])
		case "edit":
			note = describeLease(f.rawConn(a.conn))
			in := &dynamodb.UpdateItemInput{TableName: &f.env.Table, UpdateExpression: aws.String(a.edit),
				Key: map[string]types.AttributeValue{schema.AttrPK: codec.S(schema.ConnKey(a.conn))}}
			if strings.Contains(a.edit, ":zero") {
				in.ExpressionAttributeValues = map[string]types.AttributeValue{":zero": codec.N(0)}
			}
			if _, err := f.env.DB.UpdateItem(context.Background(), in); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("%6.2fs (planned %6.2fs) %s %s", time.Since(start).Seconds(), a.at.Seconds(), a, note)
	}
	time.Sleep(time.Until(start.Add(window)))
	var injected int64
	for _, p := range proxies {
		p.SetFaults(fleet.Faults{})
		p.SetDown(false)
		injected += p.Injected.Load()
	}
	for slot, p := range proxies {
		if len(p.Meter.Snapshot().Calls) == 0 {
			t.Errorf("slot %d's workers never called through their proxy", slot)
		}
	}
	for slot := range workers {
		_ = f.stack.Sup.Signal(slot, syscall.SIGCONT)
	}
	end := time.Now()
	t.Logf("faults over after %s: %v; the proxies injected %d faults; task-stopped events: %d",
		end.Sub(start).Round(time.Millisecond), counts, injected, f.stack.InvokeCount("task-stopped"))

	// Every STARTED connection streams again: one upstream client, and an unexpired
	// lease held by a worker that is running now.
	settled := func() (bool, string) {
		live := map[string]bool{}
		for slot := range workers {
			if p := f.stack.Sup.Get(slot); p != nil {
				select {
				case <-p.Done():
				default:
					live[p.ID] = true
				}
			}
		}
		cs := f.conns()
		now := time.Now().UnixMilli()
		var bad []string
		for _, id := range ids {
			c := cs[id]
			switch st := f.up.Stats(id); {
			case c.DesiredState != schema.Started:
				bad = append(bad, fmt.Sprintf("%s: desired_state %q", id, c.DesiredState))
			case st.Clients != 1:
				bad = append(bad, fmt.Sprintf("%s: %d upstream clients (owner %q)", id, st.Clients, c.LeaseOwner))
			case !c.Owned() || c.LeaseExpiresAtMs < now:
				bad = append(bad, fmt.Sprintf("%s: no unexpired lease (owner %q, expires %d, now %d)", id, c.LeaseOwner, c.LeaseExpiresAtMs, now))
			case !live[c.LeaseOwner]:
				bad = append(bad, fmt.Sprintf("%s: owner %q is not running", id, c.LeaseOwner))
			}
		}
		return len(bad) == 0, strings.Join(bad, "; ")
	}
	d := waitFor(t, chaosRecoveryBound, "every STARTED connection streaming after the faults", settled)
	t.Logf("every connection streaming %s after the faults stopped (bound %s)", d.Round(time.Millisecond), chaosRecoveryBound)
	// Then it stays so: no resumed worker takes anything back.
	time.Sleep(2 * testRenew)
	if ok, why := settled(); !ok {
		t.Errorf("%s after recovery: %s", 2*testRenew, why)
	}

	// At the sink: no sequence gap, never two workers delivering at once (who
	// delivered each message, and when, is recorded), and every connection delivered
	// up to about now.
	// Connections whose item the schedule rewrote (a stale image, a deleted lease field).
	edited := map[string]bool{}
	for _, a := range plan {
		if a.kind == "restore" || a.kind == "edit" {
			edited[a.conn] = true
		}
	}
	dups, oneDeliverer := 0, map[string]bool{}
	for _, id := range ids {
		arr := col.Arrivals(id)
		if len(arr) == 0 {
			t.Errorf("%s: nothing delivered", id)
			continue
		}
		err := fleet.CheckOneDeliverer(arr)
		oneDeliverer[id] = err == nil
		if two := fleet.TwoDeliverers(arr, 400*time.Millisecond); two > 0 {
			if !edited[id] {
				t.Errorf("%s: two workers delivered at once for %s", id, two)
			} else {
				// Issue 21, still open: a stale image or a deleted lease field written by
				// the schedule can still, rarely, make two deliverers (docs/MEMBERSHIP.md,
				// "Non-guarantees"). Reported, with the seed, until it is 0.
				t.Logf("%s: two workers delivered at once for %s after the schedule edited it (issue 21, open; seed %d)", id, two, seed)
			}
		}
		if err != nil && edited[id] {
			t.Logf("%s (edited by the schedule; issue 21, open): %v", id, err)
			err = nil
		}
		if err != nil {
			t.Errorf("%s: %v", id, err)
			for _, s := range fleet.Stints(arr) {
				t.Logf("  %s: %s %d..%d, %s .. %s", id, s.Worker, s.First, s.Last, s.From.Format("15:04:05.000"), s.To.Format("15:04:05.000"))
			}
		}
		seen, top := map[int64]bool{}, int64(0)
		for _, a := range arr {
			if seen[a.Seq] {
				dups++
			}
			seen[a.Seq], top = true, max(top, a.Seq)
		}
		if head := f.up.Stats(id).Head; head-top > int64(3*chaosRate) {
			t.Errorf("%s: sinks hold up to %d, the upstream is at %d", id, top, head)
		}
	}
	t.Logf("sinks: %d duplicates over %d connections; worker logs: %s", dups, len(ids), workerLogCounts(f.dir))

	// At most one streaming client per connection, over the whole run. Two sockets
	// with one delivering are allowed longer: a planned handoff's standby reads but
	// does not deliver until its commit, and lives at most the standby timeout plus
	// the cut (docs/HANDOFF.md); a frozen worker's socket delivers nothing. So an
	// overlap past chaosOverlapBound on a connection whose deliveries passed the
	// one-deliverer check above is reported, and failed only past
	// chaosHandoffOverlapBound. With two deliverers it failed above already.
	var worst time.Duration
	for id, o := range fleet.Overlaps(f.up.Events()) {
		if o.Longest <= chaosOverlapBound {
			worst = max(worst, o.Longest)
			continue
		}
		switch {
		case oneDeliverer[id] && o.Longest <= chaosHandoffOverlapBound:
			t.Logf("%s: %d clients at once for %s (total %s), more than %s: two sockets, one delivering", id, o.MaxClients, o.Longest, o.Total, chaosOverlapBound)
		case edited[id] && !oneDeliverer[id]:
			t.Logf("%s: %d clients at once for %s (total %s) after the schedule edited it (issue 21, open)", id, o.MaxClients, o.Longest, o.Total)
		default:
			worst = max(worst, o.Longest)
			t.Errorf("%s: %d clients at once for %s (total %s), more than %s", id, o.MaxClients, o.Longest, o.Total, chaosOverlapBound)
		}
	}
	t.Logf("longest overlap of two clients on one connection, standbys aside: %s (bound %s)", worst, chaosOverlapBound)
}

// rawConn reads connection id's item as it is (strongly consistent).
func (f *testFleet) rawConn(id string) codec.Item {
	f.t.Helper()
	out, err := f.env.DB.GetItem(context.Background(), &dynamodb.GetItemInput{TableName: &f.env.Table, ConsistentRead: aws.Bool(true),
		Key: map[string]types.AttributeValue{schema.AttrPK: codec.S(schema.ConnKey(id))}})
	if err != nil {
		f.t.Fatal(err)
	}
	return out.Item
}

// putRaw writes a whole item, as the console's save does.
func (f *testFleet) putRaw(it codec.Item) {
	f.t.Helper()
	if _, err := f.env.DB.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: &f.env.Table, Item: it}); err != nil {
		f.t.Fatal(err)
	}
}

func describeLease(it codec.Item) string {
	c, _ := codec.DecodeConnection(it)
	exp := "released"
	if c.LeaseExpiresAtMs != 0 {
		exp = fmt.Sprintf("exp%+ds", (c.LeaseExpiresAtMs-time.Now().UnixMilli())/1000)
	}
	return fmt.Sprintf("%q v%d %s seq %d", c.LeaseOwner, c.LeaseVersion, exp, c.LastSeq)
}

// workerLogCounts counts, over every worker's log, the lines that show the fleet
// defending itself.
func workerLogCounts(dir string) string {
	files, _ := filepath.Glob(filepath.Join(dir, "logs", "w*.log"))
	marks := []string{"self-fencing", "lease lost", "renew failed", "release failed", "no longer a member", "acquired"}
	n := make([]int, len(marks))
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			continue
		}
		for i, m := range marks {
			n[i] += bytes.Count(b, []byte(m))
		}
	}
	out := make([]string, len(marks))
	for i, m := range marks {
		out[i] = fmt.Sprintf("%q %d", m, n[i])
	}
	return fmt.Sprintf("%d processes, %s", len(files), strings.Join(out, ", "))
}
