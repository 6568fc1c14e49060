package app

import (
	"context"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/functions/reconciler/handler"
	"github.com/sockfleet/sockfleet/functions/reconciler/sweep"
	"github.com/sockfleet/sockfleet/shared/local/streampoller"
	"github.com/sockfleet/sockfleet/shared/local/tracingtest"
	"github.com/sockfleet/sockfleet/shared/registry"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/shared/tracing"
	"github.com/sockfleet/sockfleet/shared/wakeup"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

const traceCluster = "arn:aws:ecs:us-east-1:000000000000:cluster/trace-test"

// reconciler runs the reconciler's handler in process on e's table, fed by the stream
// poller (the production filters) and waking workers with the real signed client.
func (e *env) reconciler() *handler.Handler {
	e.t.Helper()
	log := slog.New(slog.DiscardHandler)
	reg := &registry.Registry{DB: e.db.DB, Table: e.db.Table}
	sw, err := sweep.New(e.db.DB, e.store, reg, sweep.Config{Table: e.db.Table}, log)
	if err != nil {
		e.t.Fatal(err)
	}
	h, err := handler.New(handler.Config{ClusterARN: traceCluster, WakeupTimeout: 2 * time.Second},
		handler.Deps{Registry: reg, Leases: e.store, Sweeper: sw, Sender: &wakeup.Client{Secret: secret}, Log: log})
	if err != nil {
		e.t.Fatal(err)
	}
	p, err := streampoller.New(e.db.Streams, streampoller.Config{Table: e.db.Table, Log: log})
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = p.Run(ctx, h.HandleStream) }()
	e.t.Cleanup(func() { cancel(); <-done })
	return h
}

// spanIndex is every span started so far (ended or not), by id.
func spanIndex(sr *tracetest.SpanRecorder) map[trace.SpanID]sdktrace.ReadOnlySpan {
	out := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, s := range sr.Started() {
		out[s.SpanContext().SpanID()] = s
	}
	return out
}

// waitSpan waits for an ended span named name about connection conn, by worker (""
// for any), and returns the last one.
func waitSpan(t *testing.T, sr *tracetest.SpanRecorder, name, conn, worker string) sdktrace.ReadOnlySpan {
	t.Helper()
	var found sdktrace.ReadOnlySpan
	waitFor(t, 10*time.Second, name+" of "+conn, func() bool {
		for _, s := range tracingtest.Named(sr.Ended(), name) {
			a := tracingtest.Attrs(s.Attributes())
			if a[tracing.AttrConn] == conn && (worker == "" || a[tracing.AttrWorker] == worker || spanWorker(sr, s) == worker) {
				found = s
			}
		}
		return found != nil
	})
	return found
}

// spanWorker is the worker of s's nearest ancestor that names one.
func spanWorker(sr *tracetest.SpanRecorder, s sdktrace.ReadOnlySpan) string {
	idx := spanIndex(sr)
	for s != nil {
		if w := tracingtest.Attrs(s.Attributes())[tracing.AttrWorker]; w != "" {
			return w
		}
		s = idx[s.Parent().SpanID()]
	}
	return ""
}

// ancestry is the names of s and its ancestors, nearest first, checking that they
// are all one trace.
func ancestry(t *testing.T, idx map[trace.SpanID]sdktrace.ReadOnlySpan, s sdktrace.ReadOnlySpan) ([]string, []sdktrace.ReadOnlySpan) {
	t.Helper()
	var names []string
	var spans []sdktrace.ReadOnlySpan
	for s != nil {
		if len(spans) > 0 && s.SpanContext().TraceID() != spans[0].SpanContext().TraceID() {
			t.Fatalf("%s is in another trace than %s", s.Name(), spans[0].Name())
		}
		names, spans = append(names, s.Name()), append(spans, s)
		s = idx[s.Parent().SpanID()]
	}
	return names, spans
}

func wantChain(t *testing.T, got []string, want ...string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("causal chain (effect first)\n got %s\nwant %s", strings.Join(got, " ← "), strings.Join(want, " ← "))
	}
}

func attr(s sdktrace.ReadOnlySpan, key string) string { return tracingtest.Attrs(s.Attributes())[key] }

// A new item is one trace from the reconciler's record to the worker's first
// delivery, across the real signed HTTP wakeup: record → wakeup.send → wakeup.handle
// → lease.acquire → connection.session → dial, open, first delivery; and the message
// path adds no span.
func TestTraceNewItemToFirstDelivery(t *testing.T) {
	sr := tracingtest.Record(t)
	e := newEnv(t, rate)
	w := e.worker("w1", opts{})
	e.reconciler()
	e.putConn("c1", schema.Started)

	first := waitSpan(t, sr, "sink.first_delivery", "c1", "")
	idx := spanIndex(sr)
	names, chain := ancestry(t, idx, first)
	wantChain(t, names, "sink.first_delivery", "connection.session", "lease.acquire", "wakeup.handle", "wakeup.send",
		"reconcile.record", "reconcile.batch")
	session, acquire, handle, send, record := chain[1], chain[2], chain[3], chain[4], chain[5]
	c := e.get("c1")
	for _, check := range []struct {
		s         sdktrace.ReadOnlySpan
		key, want string
	}{
		{record, tracing.AttrConn, "c1"}, {record, tracing.AttrDecision, "needs_owner"}, {record, tracing.AttrCause, "insert"},
		{send, tracing.AttrWakeupAction, "needs_owner"}, {send, tracing.AttrWakeupResult, "acquired"},
		{handle, tracing.AttrWorker, "w1"}, {handle, tracing.AttrWakeupResult, "acquired"},
		{acquire, tracing.AttrConn, "c1"}, {acquire, tracing.AttrVersion, strconvI(c.LeaseVersion)},
		{session, tracing.AttrWorker, "w1"}, {session, tracing.AttrVersion, strconvI(c.LeaseVersion)},
		{first, tracing.AttrVersion, strconvI(c.LeaseVersion)},
	} {
		if got := attr(check.s, check.key); got != check.want {
			t.Errorf("%s %s = %q, want %q", check.s.Name(), check.key, got, check.want)
		}
	}
	if !handle.Parent().IsRemote() {
		t.Error("wakeup.handle's parent is not the remote wakeup.send")
	}
	var dial, open sdktrace.ReadOnlySpan
	for _, s := range idx {
		if s.Parent().SpanID() == session.SpanContext().SpanID() {
			switch s.Name() {
			case "stream.dial":
				dial = s
			case "stream.open":
				open = s
			}
		}
	}
	if dial == nil || open == nil || dial.EndTime().After(open.StartTime()) || open.EndTime().After(first.StartTime()) {
		t.Fatalf("stream.dial %v, stream.open %v under the session: want dial, then open, then the first delivery", dial, open)
	}
	if !hasEvent(session, "first_delivery") {
		t.Error("the session span has no first_delivery event")
	}

	// Nothing per message: hundreds more messages and checkpoints, no new span.
	n0, d0 := len(sr.Started()), w.sink.count("c1")
	waitFor(t, 5*time.Second, "more messages", func() bool { return w.sink.count("c1") >= d0+100 })
	time.Sleep(2 * checkpointEvery)
	if n := len(sr.Started()); n != n0 {
		var extra []string
		for _, s := range sr.Started()[n0:] {
			extra = append(extra, s.Name())
		}
		t.Fatalf("%d spans while streaming: %v", n-n0, extra)
	}
}

func strconvI(v int64) string { return strconv.FormatInt(v, 10) }

// traceParent is the trace_parent attribute of connection id's item as stored.
func (e *env) traceParent(id string) string {
	e.t.Helper()
	out, err := e.db.DB.GetItem(context.Background(), &dynamodb.GetItemInput{TableName: &e.db.Table,
		Key: map[string]types.AttributeValue{schema.AttrPK: codec.S(schema.ConnKey(id))}, ConsistentRead: aws.Bool(true)})
	if err != nil {
		e.t.Fatal(err)
	}
	v, _ := out.Item[tracing.AttrTraceParent].(*types.AttributeValueMemberS)
	if v == nil {
		return ""
	}
	return v.Value
}

func hasEvent(s sdktrace.ReadOnlySpan, name string) bool {
	for _, ev := range s.Events() {
		if ev.Name == name {
			return true
		}
	}
	return false
}

// A crash is one trace from the task-stopped event to the new owner's first
// delivery: reaper.release (whose release write carries trace_parent) → the
// record it causes → wakeup → acquire → first delivery on the other worker.
func TestTraceTaskStoppedToNewOwner(t *testing.T) {
	sr := tracingtest.Record(t)
	e := newEnv(t, rate)
	w1 := e.worker("w1", opts{noHandoff: true})
	h := e.reconciler()
	e.putConn("c1", schema.Started)
	waitFor(t, 5*time.Second, "w1 streaming", func() bool { return w1.sink.count("c1") > 0 })
	w2 := e.worker("w2", opts{})
	// The crash: w1 can no longer reach the table, so it exits without its release.
	w1.cut.mode.Store(fail)
	_ = w1.stop()
	if c := e.get("c1"); c.LeaseOwner != "w1" {
		t.Fatalf("after w1's exit the item names %q; want w1 still", c.LeaseOwner)
	}
	if err := h.HandleTask(context.Background(), handler.TaskEvent{ClusterARN: traceCluster, WorkerID: "w1",
		TaskARN: "arn:aws:ecs:us-east-1:000000000000:task/trace-test/w1", LastStatus: "STOPPED"}); err != nil {
		t.Fatal(err)
	}
	first := waitSpan(t, sr, "sink.first_delivery", "c1", "w2")
	names, chain := ancestry(t, spanIndex(sr), first)
	wantChain(t, names, "sink.first_delivery", "connection.session", "lease.acquire", "wakeup.handle", "wakeup.send",
		"reconcile.record", "reaper.release", "reconcile.batch")
	reap, record := chain[6], chain[5]
	if attr(reap, tracing.AttrCause) != "task_stopped" || attr(reap, tracing.AttrWorker) != "w1" || !record.Parent().IsRemote() {
		t.Fatalf("reaper.release %v; record's parent remote %v", reap.Attributes(), record.Parent().IsRemote())
	}
	if len(record.Links()) != 1 {
		t.Errorf("reconcile.record links %d; want one, to its batch", len(record.Links()))
	}
	// The release carried the reaper's span in the item: that is how the record found it.
	if tp := e.traceParent("c1"); !strings.Contains(tp, reap.SpanContext().SpanID().String()) {
		t.Fatalf("item trace_parent %q; want the reaper.release span %s", tp, reap.SpanContext().SpanID())
	}
	_ = w2
}

// A drain is one trace from the SIGTERM: worker.drain → handoff.prepare on the
// target and handoff.cut (the transfer write, carrying trace_parent) on the source →
// handoff.commit on the target → its first delivery.
func TestTraceDrainHandoff(t *testing.T) {
	sr := tracingtest.Record(t)
	e := newEnv(t, rate)
	e.putConn("c1", schema.Started)
	w1 := e.worker("w1", opts{})
	e.wake(w1, wakeup.NeedsOwner, 0, "c1")
	waitFor(t, 5*time.Second, "w1 streaming", func() bool { return w1.sink.count("c1") >= 20 })
	w2 := e.worker("w2", opts{})
	waitFor(t, 5*time.Second, "w2 in the registry", func() bool { return e.workerItem("w2").Addr != "" })
	if err := w1.stop(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "w2 streaming", func() bool { return w2.sink.count("c1") > 0 })
	first := waitSpan(t, sr, "sink.first_delivery", "c1", "w2")
	idx := spanIndex(sr)
	names, chain := ancestry(t, idx, first)
	root := chain[len(chain)-1]
	if root.Name() != "worker.drain" || attr(root, tracing.AttrWorker) != "w1" {
		t.Fatalf("causal chain %s: want it rooted at w1's worker.drain", strings.Join(names, " ← "))
	}
	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range idx {
		if s.SpanContext().TraceID() == root.SpanContext().TraceID() {
			byName[s.Name()] = s
		}
	}
	prepare, cut, commit := byName["handoff.prepare"], byName["handoff.cut"], byName["handoff.commit"]
	switch {
	case prepare == nil || cut == nil || commit == nil:
		t.Fatalf("spans of the drain's trace %v: want handoff.prepare, handoff.cut and handoff.commit", names)
	case prepare.Parent().SpanID() != root.SpanContext().SpanID() || !prepare.Parent().IsRemote():
		t.Fatalf("handoff.prepare is not the remote child of worker.drain")
	case cut.Parent().SpanID() != root.SpanContext().SpanID():
		t.Fatalf("handoff.cut is not the child of worker.drain")
	case commit.Parent().SpanID() != cut.SpanContext().SpanID():
		t.Fatalf("handoff.commit is not the child of handoff.cut")
	case attr(prepare, tracing.AttrHandoffPhase) != "prepare" || attr(cut, tracing.AttrHandoffPhase) != "cut" ||
		attr(commit, tracing.AttrHandoffPhase) != "commit" || attr(cut, tracing.AttrConn) != "c1":
		t.Fatalf("phases: prepare %v, cut %v, commit %v", prepare.Attributes(), cut.Attributes(), commit.Attributes())
	case !cut.EndTime().After(commit.StartTime()) || commit.StartTime().Before(cut.StartTime()):
		t.Fatalf("commit does not follow the cut")
	}
	if tp := e.traceParent("c1"); !strings.Contains(tp, cut.SpanContext().SpanID().String()) {
		t.Fatalf("item trace_parent %q; want the handoff.cut span %s", tp, cut.SpanContext().SpanID())
	}
	if _, ok := byName["handoff.fallback_release"]; ok {
		t.Fatal("a fallback release in a drain that handed off")
	}
}

// sendHandoff sends a rebalance move of id to worker to, under a span standing for the
// reconciler's rebalance.round, and returns that span.
func (e *env) sendHandoff(w *worker, id, to string) trace.Span {
	e.t.Helper()
	ctx, round := otel.Tracer("test").Start(context.Background(), "rebalance.round")
	defer round.End()
	req := wakeup.Request{Conns: []wakeup.Conn{{ID: id, LeaseVersion: e.get(id).LeaseVersion, Reason: wakeup.Handoff, To: to}}}
	resp, err := (&wakeup.Client{Secret: secret}).Send(ctx, w.Addr(), req)
	if err != nil || resp.Results[0].Result != wakeup.HandingOff {
		e.t.Fatalf("handoff wakeup: %+v %v", resp, err)
	}
	return round
}

// A rebalance move is one trace from the round: wakeup.send → wakeup.handle on the
// owner → handoff.prepare on the target and handoff.cut on the owner → handoff.commit
// → the target's first delivery.
func TestTraceRebalanceMove(t *testing.T) {
	sr := tracingtest.Record(t)
	e := newEnv(t, rate)
	e.putConn("c1", schema.Started)
	w1 := e.worker("w1", opts{})
	w2 := e.worker("w2", opts{})
	e.wake(w1, wakeup.NeedsOwner, 0, "c1")
	waitFor(t, 5*time.Second, "w1 streaming", func() bool { return w1.sink.count("c1") >= 20 })
	round := e.sendHandoff(w1, "c1", "w2")
	waitFor(t, 5*time.Second, "w2 streaming", func() bool { return w2.sink.count("c1") > 0 })
	first := waitSpan(t, sr, "sink.first_delivery", "c1", "w2")
	idx := spanIndex(sr)
	names, chain := ancestry(t, idx, first)
	if root := chain[len(chain)-1]; root.SpanContext().SpanID() != round.SpanContext().SpanID() {
		t.Fatalf("causal chain %s: want it rooted at the round", strings.Join(names, " ← "))
	}
	var handle, cut sdktrace.ReadOnlySpan
	for _, s := range idx {
		switch {
		case s.Name() == "wakeup.handle" && attr(s, tracing.AttrWakeupAction) == "handoff":
			handle = s
		case s.Name() == "handoff.cut":
			cut = s
		}
	}
	if handle == nil || cut == nil || cut.Parent().SpanID() != handle.SpanContext().SpanID() ||
		attr(handle, tracing.AttrWakeupResult) != "handing_off" || attr(handle, tracing.AttrWorker) != "w1" {
		t.Fatalf("wakeup.handle %v, handoff.cut %v: want the cut under w1's handling of the move", handle, cut)
	}
	if !slices.Contains(names, "handoff.commit") && !slices.Contains(names, "handoff.prepare") {
		t.Fatalf("first delivery chain %s: want it through the commit or the standby's prepare", strings.Join(names, " ← "))
	}
}

// A handoff that cannot be done falls back to a release, marked: handoff.fallback_release
// (fallback=true) under the move's handling, and the release under it, whose write
// carries it in trace_parent for the record of the next owner's trace.
func TestTraceHandoffFallbackIsMarked(t *testing.T) {
	sr := tracingtest.Record(t)
	e := newEnv(t, rate)
	e.putConn("c1", schema.Started)
	w1 := e.worker("w1", opts{resume: "none"})
	e.worker("w2", opts{resume: "none"})
	e.wake(w1, wakeup.NeedsOwner, 0, "c1")
	waitFor(t, 5*time.Second, "w1 streaming", func() bool { return w1.sink.count("c1") >= 20 })
	round := e.sendHandoff(w1, "c1", "w2")
	waitFor(t, 5*time.Second, "released", func() bool { return !e.get("c1").Owned() })
	rel := waitSpan(t, sr, "lease.release", "c1", "w1")
	names, chain := ancestry(t, spanIndex(sr), rel)
	wantChain(t, names, "lease.release", "handoff.fallback_release", "wakeup.handle", "wakeup.send", "rebalance.round")
	fb := chain[1]
	if attr(fb, tracing.AttrHandoffFallback) != "true" || attr(fb, tracing.AttrHandoffPhase) != "fallback" ||
		chain[4].SpanContext().SpanID() != round.SpanContext().SpanID() {
		t.Fatalf("fallback span attributes %v", fb.Attributes())
	}
	if tp := e.traceParent("c1"); !strings.Contains(tp, rel.SpanContext().SpanID().String()) {
		t.Fatalf("item trace_parent %q; want the lease.release span %s", tp, rel.SpanContext().SpanID())
	}
}
