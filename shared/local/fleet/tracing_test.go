package fleet_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sockfleet/sockfleet/shared/local/fleet"
	"github.com/sockfleet/sockfleet/shared/local/jaeger"
	"github.com/sockfleet/sockfleet/shared/registry"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/sinkrecord"
)

const (
	rec = fleet.ReconcilerService
	wrk = fleet.WorkerService
)

// instrumented reports whether this tree has the tracing setup the workers and the
// reconciler export spans with (package shared/tracing).
func instrumented() bool {
	dir, err := os.Getwd()
	for err == nil {
		if _, serr := os.Stat(filepath.Join(dir, "shared", "tracing")); serr == nil {
			return true
		}
		if _, serr := os.Stat(filepath.Join(dir, "go.mod")); serr == nil {
			return false
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return false
		}
		dir = parent
	}
	return false
}

// TestOwnershipTracesInJaeger runs a desired-state flip, a SIGKILL failover and a
// drain on a two-worker fleet exporting spans to a local Jaeger, then reads the
// traces back from Jaeger's query API and checks that each ownership path is one
// causal chain (parents and links) across the reconciler and the workers, with the
// spans of the tracing contract, in the order they must happen:
//
//   - flip: reconcile.batch → reconcile.record → wakeup.send → wakeup.handle (its
//     child, across the signed call) → lease.acquire → stream.dial → sink.first_delivery;
//   - SIGKILL: reaper.release (task_stopped) → each released connection's
//     reconcile.record → wakeup.send → wakeup.handle → lease.acquire on another
//     worker → sink.first_delivery;
//   - SIGTERM: worker.drain → each moved connection's handoff.prepare (target) →
//     handoff.cut (source) → handoff.commit → sink.first_delivery.
func TestOwnershipTracesInJaeger(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end fleet test")
	}
	if !instrumented() {
		t.Skip("no shared/tracing in this tree: the processes export no spans yet, so there is no chain to check " +
			"(the harness itself is tested in shared/local/jaeger)")
	}
	j, err := jaeger.Start(jaeger.Options{Log: t.Output()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(j.Stop)
	// No rebalancing: a round moving a connection while the test drains its owner
	// would start that connection's move from rebalance.round, not worker.drain.
	f := startFleetWith(t, fleetOptions{Workers: 2, OTLPEndpoint: j.OTLPEndpoint,
		ReconcilerEnv: []string{schema.EnvRebalance + "=off"}})
	ids := []string{"t0", "t1", "t2", "t3"}
	for _, id := range ids {
		f.add(id)
	}
	waitFor(t, 15*time.Second, "all connections streaming", func() (bool, string) { return f.streamingElsewhere(ids, "") })

	// inJaeger checks chains against what Jaeger has, polling while the processes'
	// batches arrive, and fails the test with what is missing. A span reaches Jaeger
	// when it ends, and a connection.session (the parent of a session's dial and
	// first delivery) ends with the session: a chain is checked once its sessions
	// have ended, and before a SIGKILL could lose them (a killed worker exports
	// nothing more).
	c := j.Client()
	since, checked := time.Now().Add(-time.Minute), 0
	inJaeger := func(chains ...func(*spanGraph) error) {
		t.Helper()
		var errs []string
		var traces []jaeger.Trace
		deadline := time.Now().Add(15 * time.Second)
		for {
			traces = traces[:0]
			for _, svc := range []string{rec, wrk} {
				tr, err := c.Traces(context.Background(), jaeger.Query{Service: svc, Since: since, Limit: 2000})
				if err != nil {
					t.Fatal(err)
				}
				traces = append(traces, tr...)
			}
			g := newSpanGraph(traces)
			errs = errs[:0]
			for _, check := range chains {
				if err := check(g); err != nil {
					errs = append(errs, err.Error())
				}
			}
			if len(errs) == 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		for _, e := range errs {
			t.Error(e)
		}
		if len(errs) > 0 {
			keepTraces(t, f.dir, traces)
		}
		checked += len(chains)
	}
	// owner returns the slot, process and connections of the worker that owns most.
	owner := func() (int, *fleet.Proc, []string) {
		waitFor(t, 15*time.Second, "all connections streaming", func() (bool, string) { return f.streamingElsewhere(ids, "") })
		slot, p, mine := -1, (*fleet.Proc)(nil), []string(nil)
		for s := range 2 {
			if q := f.stack.Sup.Get(s); q != nil {
				if o := f.ownedBy(q.ID); len(o) > len(mine) {
					slot, p, mine = s, q, o
				}
			}
		}
		if slot < 0 {
			t.Fatal("no worker owns a connection")
		}
		return slot, p, mine
	}

	// A desired-state flip: STOPPED, then STARTED again.
	f.setState("t0", schema.Stopped)
	waitFor(t, 5*time.Second, "t0 released", func() (bool, string) {
		c := f.conns()["t0"]
		return !c.Owned() && f.up.Stats("t0").Clients == 0, fmt.Sprintf("%+v", c)
	})
	flipAt := time.Now()
	f.setState("t0", schema.Started)
	waitFor(t, 5*time.Second, "t0 streaming again", func() (bool, string) { return f.streamingElsewhere([]string{"t0"}, "") })
	// Stopped again, its session ends and is exported; then it is back for the rest.
	f.setState("t0", schema.Stopped)
	waitFor(t, 5*time.Second, "t0 released again", func() (bool, string) {
		c := f.conns()["t0"]
		return !c.Owned() && f.up.Stats("t0").Clients == 0, fmt.Sprintf("%+v", c)
	})
	inJaeger(func(g *spanGraph) error {
		conn := aboutConn("t0")
		_, err := g.chain([]step{
			{Name: "reconcile.batch", Service: rec, Match: startedBy(flipAt, nil)},
			{Name: "reconcile.record", Service: rec, Match: tagIs("sockfleet.conn", "t0"), ChildOfPrev: true},
			{Name: "wakeup.send", Service: rec, Match: conn},
			{Name: "wakeup.handle", Service: wrk, Match: conn, ChildOfPrev: true},
			{Name: "lease.acquire", Service: wrk, Match: tagIs("sockfleet.conn", "t0")},
			{Name: "stream.dial", Service: wrk, Match: tagIs("sockfleet.conn", "t0")},
			{Name: "sink.first_delivery", Service: wrk, Match: tagIs("sockfleet.conn", "t0"), Sibling: true},
		})
		return prefix("flip of t0", err)
	})
	f.setState("t0", schema.Started)

	// A crash: SIGKILL the worker that owns most; the supervisor reports the task
	// stopped, as ECS would. Its connections may be woken up one per call or several
	// in one call (a wakeup.send linked to the records it carries beyond its parent).
	slot, victim, moved := owner()
	killAt := time.Now()
	if err := f.stack.Sup.Signal(slot, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the killed worker's connections streaming elsewhere", func() (bool, string) {
		return f.streamingElsewhere(moved, victim.ID)
	})
	var chains []func(*spanGraph) error
	for _, id := range moved {
		chains = append(chains, func(g *spanGraph) error {
			conn := aboutConn(id)
			_, err := g.chain([]step{
				{Name: "reaper.release", Service: rec, Match: startedBy(killAt, tagIs("sockfleet.cause", "task_stopped"))},
				{Name: "reconcile.record", Service: rec, Match: tagIs("sockfleet.conn", id)},
				{Name: "wakeup.send", Service: rec, Match: conn},
				{Name: "wakeup.handle", Service: wrk, Match: conn, ChildOfPrev: true},
				{Name: "lease.acquire", Service: wrk, Match: both(tagIs("sockfleet.conn", id), notWorker(victim.ID))},
				{Name: "sink.first_delivery", Service: wrk, Match: tagIs("sockfleet.conn", id)},
			})
			return prefix(fmt.Sprintf("SIGKILL of %s, %s", victim.ID, id), err)
		})
	}

	// A drain: SIGTERM the worker that owns most, once the killed one's replacement
	// is a live member it can hand its connections to (before that, a drain has no
	// target and releases them, as it must).
	waitFor(t, 15*time.Second, "the killed worker's replacement, a live member", func() (bool, string) {
		q := f.stack.Sup.Get(slot)
		if q == nil || q.ID == victim.ID {
			return false, "not started"
		}
		ws, _, err := (&registry.Registry{DB: f.env.DB, Table: f.env.Table}).List(context.Background())
		if err != nil {
			return false, err.Error()
		}
		for _, w := range registry.Live(ws, time.Now()) {
			if w.ID == q.ID && !w.Draining {
				return true, ""
			}
		}
		return false, q.ID + " not a live member yet"
	})
	slot, drained, handed := owner()
	drainAt := time.Now()
	if err := f.stack.Sup.Signal(slot, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the drained worker's connections streaming elsewhere", func() (bool, string) {
		return f.streamingElsewhere(handed, drained.ID)
	})
	// A target's first delivery may come with the next upstream message after the
	// commit: wait for it before ending the target's sessions.
	waitFor(t, 10*time.Second, "a delivery of each drained connection by its new owner", func() (bool, string) {
		cs := f.conns()
		for _, id := range handed {
			if ok, why := f.deliveredBy(cs[id].LeaseOwner, id); !ok {
				return false, why
			}
		}
		return true, ""
	})
	for _, id := range handed {
		chains = append(chains, func(g *spanGraph) error {
			spans, err := g.chain([]step{
				{Name: "worker.drain", Service: wrk, Match: startedBy(drainAt, tagIfSet("sockfleet.worker", drained.ID))},
				{Name: "handoff.prepare", Service: wrk, Match: both(tagIs("sockfleet.conn", id), notWorker(drained.ID))},
				{Name: "handoff.cut", Service: wrk, Match: both(tagIs("sockfleet.conn", id), tagIs("sockfleet.worker", drained.ID)), Sibling: true},
				{Name: "handoff.commit", Service: wrk, Match: tagIs("sockfleet.conn", id)},
				// At the commit (held messages) or in the standby session (prepare's).
				{Name: "sink.first_delivery", Service: wrk, Match: both(tagIs("sockfleet.conn", id), notWorker(drained.ID)), Sibling: true},
			})
			if err == nil {
				for _, s := range spans {
					if v, ok := s.Tag("sockfleet.handoff.fallback"); ok && v == "true" {
						err = fmt.Errorf("%s is marked a fallback to release on a healthy fleet", s.OperationName)
					}
				}
			}
			return prefix(fmt.Sprintf("drain of %s, %s", drained.ID, id), err)
		})
	}
	// The sessions of both chains end: the drained worker's (the new owner after the
	// SIGKILL) at its exit, the targets' when the other worker is drained too.
	for _, p := range []*fleet.Proc{drained, f.stack.Sup.Get(1 - slot)} {
		if p == nil {
			t.Fatal("a worker slot is empty")
		}
		if p != drained {
			if err := f.stack.Sup.Signal(1-slot, syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
		}
		select {
		case <-p.Done():
		case <-time.After(10 * time.Second):
			t.Fatalf("%s did not exit within 10s of SIGTERM", p.ID)
		}
	}
	inJaeger(chains...)
	t.Logf("%d ownership chains checked in Jaeger (UI %s)", checked, j.UI)
}

// deliveredBy reports whether worker's sink holds a message of connection id.
func (f *testFleet) deliveredBy(worker, id string) (bool, string) {
	b, err := os.ReadFile(filepath.Join(f.dir, "sinks", worker+".jsonl"))
	if err != nil {
		return false, err.Error()
	}
	for line := range bytes.Lines(b) {
		if r, err := sinkrecord.Parse(line); err == nil && !r.Bad && r.Conn == id {
			return true, ""
		}
	}
	return false, worker + " has delivered nothing of " + id
}

// keepTraces writes what Jaeger returned to traces.json among the fleet's logs, which
// a failed test keeps.
func keepTraces(t *testing.T, dir string, traces []jaeger.Trace) {
	b, err := json.Marshal(traces)
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "logs", "traces.json"), b, 0o644)
	}
	if err != nil {
		t.Logf("keeping the traces: %v", err)
	}
}

// notWorker matches a span that is not about worker id (sockfleet.worker unset or another).
func notWorker(id string) func(jaeger.Span) bool {
	return func(s jaeger.Span) bool { v, ok := s.Tag("sockfleet.worker"); return !ok || v != id }
}

func prefix(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", what, err)
}

// The chain check itself, on spans made up here: causes are followed through
// parents and links across traces, each step from the one before it (a sibling
// from the first), order is by start time, and a hop that must be a parent is one.
func TestSpanChain(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	sp := func(id, name string, at time.Duration, refs ...string) jaeger.Span {
		s := jaeger.Span{SpanID: id, OperationName: name, StartTime: t0.Add(at).UnixMicro(), ProcessID: "p1"}
		for i, r := range refs {
			kind := "CHILD_OF"
			if i > 0 || strings.HasPrefix(r, "link:") {
				kind, r = "FOLLOWS_FROM", strings.TrimPrefix(r, "link:")
			}
			s.References = append(s.References, jaeger.Reference{RefType: kind, SpanID: r})
		}
		return s
	}
	trace := func(service string, spans ...jaeger.Span) jaeger.Trace {
		return jaeger.Trace{Spans: spans, Processes: map[string]jaeger.Process{"p1": {ServiceName: service}}}
	}
	// The reconciler releases (r1), a record linked to the release (r2) sends (r3);
	// the worker handles it (w1, child of r3), acquires (w2) and, in a session of
	// its own linked to the acquire (w3), delivers (w4). x1 is unrelated.
	traces := []jaeger.Trace{
		trace(rec, sp("r1", "reaper.release", 0), sp("r2", "reconcile.record", 10*time.Millisecond, "link:r1"),
			sp("r3", "wakeup.send", 11*time.Millisecond, "r2")),
		trace(wrk, sp("w1", "wakeup.handle", 12*time.Millisecond, "r3"), sp("w2", "lease.acquire", 13*time.Millisecond, "w1"),
			sp("w3", "connection.session", 14*time.Millisecond, "link:w2"), sp("w5", "stream.dial", 15*time.Millisecond, "w3"),
			sp("w4", "sink.first_delivery", 20*time.Millisecond, "w3"),
			sp("x1", "sink.first_delivery", 30*time.Millisecond)),
	}
	g := newSpanGraph(traces)
	ok := []step{
		{Name: "reaper.release", Service: rec}, {Name: "reconcile.record", Service: rec},
		{Name: "wakeup.send", Service: rec}, {Name: "wakeup.handle", Service: wrk, ChildOfPrev: true},
		{Name: "lease.acquire", Service: wrk}, {Name: "sink.first_delivery", Service: wrk},
	}
	got, err := g.chain(ok)
	if err != nil {
		t.Fatal(err)
	}
	if got[len(got)-1].SpanID != "w4" {
		t.Errorf("delivery %s, want w4 (x1 was not caused by the release)", got[len(got)-1].SpanID)
	}
	// The dial and the delivery are the session's children: the dial did not cause
	// the delivery, so the delivery follows it only as a Sibling.
	siblings := []step{{Name: "lease.acquire", Service: wrk}, {Name: "stream.dial", Service: wrk},
		{Name: "sink.first_delivery", Service: wrk, Sibling: true}}
	if _, err := g.chain(siblings); err != nil {
		t.Errorf("siblings: %v", err)
	}
	for name, steps := range map[string][]step{
		"wrong order":   {{Name: "lease.acquire", Service: wrk}, {Name: "wakeup.handle", Service: wrk}},
		"wrong service": {{Name: "reaper.release", Service: wrk}},
		"not a cause": {{Name: "sink.first_delivery", Service: wrk, Match: func(s jaeger.Span) bool { return s.SpanID == "x1" }},
			{Name: "lease.acquire", Service: wrk}},
		"a sibling is not a cause": append(siblings[:2:2], step{Name: "sink.first_delivery", Service: wrk}),
		"a link is not a parent":   {{Name: "reaper.release", Service: rec}, {Name: "reconcile.record", Service: rec, ChildOfPrev: true}},
		"missing span":             append(ok[:2:2], step{Name: "handoff.cut", Service: wrk}),
	} {
		if _, err := g.chain(steps); err == nil {
			t.Errorf("%s: a chain was found", name)
		} else if name == "missing span" && !strings.Contains(err.Error(), "no handoff.cut span") {
			t.Errorf("%s: %v, want it to name the missing span", name, err)
		}
	}
}

// One wakeup carrying two released connections: its wakeup.send is the child of the
// first record (c1) and linked to the second (c2), and names each in a wakeup.conn
// event, as does the worker's wakeup.handle. Each connection's chain runs through
// it, the second's by the link; a connection it does not carry has none.
func TestSpanChainBatchedWakeup(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	sp := func(id, name string, at time.Duration, tags map[string]string, events []string, refs ...jaeger.Reference) jaeger.Span {
		s := jaeger.Span{SpanID: id, OperationName: name, StartTime: t0.Add(at).UnixMicro(), ProcessID: "p1", References: refs}
		for k, v := range tags {
			s.Tags = append(s.Tags, jaeger.KeyValue{Key: k, Type: "string", Value: v})
		}
		for _, c := range events {
			s.Logs = append(s.Logs, jaeger.Log{Fields: []jaeger.KeyValue{{Key: "event", Value: "wakeup.conn"}, {Key: "sockfleet.conn", Value: c}}})
		}
		return s
	}
	parent := func(id string) jaeger.Reference { return jaeger.Reference{RefType: "CHILD_OF", SpanID: id} }
	link := func(id string) jaeger.Reference { return jaeger.Reference{RefType: "FOLLOWS_FROM", SpanID: id} }
	conn := func(id string) map[string]string { return map[string]string{"sockfleet.conn": id} }
	ms := time.Millisecond
	traces := []jaeger.Trace{
		{Processes: map[string]jaeger.Process{"p1": {ServiceName: rec}}, Spans: []jaeger.Span{
			sp("r1", "reaper.release", 0, nil, nil),
			sp("r2", "reconcile.record", 10*ms, conn("c1"), nil, parent("r1")),
			sp("r3", "reconcile.record", 10*ms, conn("c2"), nil, parent("r1")),
			sp("r4", "reconcile.record", 10*ms, conn("c3"), nil, parent("r1")),
			sp("r5", "wakeup.send", 11*ms, nil, []string{"c1", "c2"}, parent("r2"), link("r3")),
		}},
		{Processes: map[string]jaeger.Process{"p1": {ServiceName: wrk}}, Spans: []jaeger.Span{
			sp("w1", "wakeup.handle", 12*ms, nil, []string{"c1", "c2"}, parent("r5")),
			sp("w2", "lease.acquire", 13*ms, conn("c1"), nil, parent("w1")),
			sp("w3", "lease.acquire", 13*ms, conn("c2"), nil, parent("w1")),
		}},
	}
	g := newSpanGraph(traces)
	steps := func(id string) []step {
		return []step{
			{Name: "reaper.release", Service: rec},
			{Name: "reconcile.record", Service: rec, Match: tagIs("sockfleet.conn", id), ChildOfPrev: true},
			{Name: "wakeup.send", Service: rec, Match: aboutConn(id)},
			{Name: "wakeup.handle", Service: wrk, Match: aboutConn(id), ChildOfPrev: true},
			{Name: "lease.acquire", Service: wrk, Match: tagIs("sockfleet.conn", id)},
		}
	}
	for _, id := range []string{"c1", "c2"} {
		got, err := g.chain(steps(id))
		if err != nil {
			t.Errorf("%s: %v", id, err)
			continue
		}
		if got[2].SpanID != "r5" {
			t.Errorf("%s: wakeup.send %s, want r5", id, got[2].SpanID)
		}
	}
	if _, err := g.chain(steps("c3")); err == nil || !strings.Contains(err.Error(), "no wakeup.send span") {
		t.Errorf("c3, not carried by the wakeup: %v, want no wakeup.send found", err)
	}
	// Without the link, the second record's chain stops at its record.
	traces[0].Spans[4].References = traces[0].Spans[4].References[:1]
	if _, err := newSpanGraph(traces).chain(steps("c2")); err == nil {
		t.Error("c2: a chain was found through a wakeup neither child of nor linked to its record")
	}
}

// With an OTLP endpoint, every worker gets the OpenTelemetry settings, its id as
// service.instance.id, and the test's extra settings, which -worker-env beats;
// without one, no OTEL_* setting at all (tracing off).
func TestTracingEnv(t *testing.T) {
	cfg := fleet.Config{Dir: "/d", Endpoint: "http://127.0.0.1:1", Table: "tbl", Secret: "s3cret-s3cret-s3cret",
		OTLPEndpoint: "http://127.0.0.1:4318", TraceEnv: []string{"OTEL_BSP_SCHEDULE_DELAY=100"},
		WorkerEnv: func(int, string) []string { return []string{"OTEL_TRACES_SAMPLER=always_off"} }}
	env := cfg.WorkerEnviron(0, "w0-x-1", 8123)
	for name, want := range map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318",
		"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
		"OTEL_SERVICE_NAME":           "sockfleet-worker",
		"OTEL_RESOURCE_ATTRIBUTES":    "service.instance.id=w0-x-1",
		"OTEL_BSP_SCHEDULE_DELAY":     "100",
		"OTEL_TRACES_SAMPLER":         "always_off",
	} {
		if got, _ := effective(env, name); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	cfg.OTLPEndpoint = ""
	for _, kv := range cfg.WorkerEnviron(0, "w0-x-1", 8123) {
		if strings.HasPrefix(kv, "OTEL_") && !strings.HasPrefix(kv, "OTEL_TRACES_SAMPLER=") {
			t.Errorf("tracing off, yet %s", kv)
		}
	}
	if got := fleet.TracingEnv("http://h:1", "sockfleet-reconciler", ""); len(got) != 3 {
		t.Errorf("reconciler settings %v: want endpoint, protocol and service, no instance", got)
	}
}
