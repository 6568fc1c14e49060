package app

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/shared/wakeup"
	"github.com/sockfleet/sockfleet/worker/internal/sink"
)

// ledger records every acknowledged message of every worker in one order, so a test
// can see who delivered what, and whether two workers ever delivered the same
// connection in interleaved stretches.
type ledger struct {
	mu   sync.Mutex
	rows map[string][]delivery
}

type delivery struct {
	worker  string
	seq     int64
	version int64 // the fencing token the message carried
	at      time.Time
}

type ledgerSink struct {
	l      *ledger
	worker string
	delay  time.Duration
}

func (s ledgerSink) Write(_ context.Context, b []sink.Message) error {
	time.Sleep(s.delay)
	s.l.mu.Lock()
	defer s.l.mu.Unlock()
	if s.l.rows == nil {
		s.l.rows = map[string][]delivery{}
	}
	now := time.Now()
	for _, m := range b {
		s.l.rows[m.Conn] = append(s.l.rows[m.Conn], delivery{worker: s.worker, seq: m.Seq, version: m.Version, at: now})
	}
	return nil
}

func (ledgerSink) Close() error { return nil }

func (l *ledger) get(id string) []delivery {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]delivery(nil), l.rows[id]...)
}

func (l *ledger) count(id, worker string) int {
	n := 0
	for _, d := range l.get(id) {
		if d.worker == worker {
			n++
		}
	}
	return n
}

// check asserts that id's deliveries, in the one order of the ledger across workers,
// are contiguous from their first: no missing, no duplicate, and so never two owners
// delivering at once (they would repeat each other's sequences). It returns the
// workers of the stretches in order and the gaps between them.
func (l *ledger) check(t *testing.T, id string) ([]string, []time.Duration) {
	t.Helper()
	rows := l.get(id)
	if len(rows) == 0 {
		t.Fatalf("%s: nothing delivered", id)
	}
	var owners []string
	var gaps []time.Duration
	for i, d := range rows {
		if i > 0 && d.seq != rows[i-1].seq+1 {
			t.Fatalf("%s: %s delivered %d after %s delivered %d: a gap or a duplicate", id, d.worker, d.seq, rows[i-1].worker, rows[i-1].seq)
		}
		if i == 0 || d.worker != rows[i-1].worker {
			owners = append(owners, d.worker)
			if i > 0 {
				gaps = append(gaps, d.at.Sub(rows[i-1].at))
			}
		}
	}
	return owners, gaps
}

func (e *env) handoffWorker(id string, l *ledger, o opts) *worker {
	o.sink = ledgerSink{l: l, worker: id, delay: o.sinkDelay}
	return e.worker(id, o)
}

func (e *env) wakeHandoff(w *worker, id, to string) wakeup.ConnResult {
	e.t.Helper()
	req := wakeup.Request{Conns: []wakeup.Conn{{ID: id, LeaseVersion: e.get(id).LeaseVersion, Reason: wakeup.Handoff, To: to}}}
	resp, err := (&wakeup.Client{Secret: secret}).Send(context.Background(), w.Addr(), req)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp.Results[0]
}

// A handoff wakeup moves a streaming connection to the named worker make-before-
// break: no missing and no duplicate sequence at the sink, the two workers'
// deliveries never interleave, the table names the new owner at a higher version
// with moved_at_ms, and the gap is far below a dial.
func TestHandoffMovesWithoutGap(t *testing.T) {
	e := newEnv(t, rate)
	e.putConn("c1", schema.Started)
	var l ledger
	w1 := e.handoffWorker("w1", &l, opts{})
	w2 := e.handoffWorker("w2", &l, opts{})
	e.wake(w1, wakeup.NeedsOwner, 0, "c1")
	waitFor(t, 5*time.Second, "w1 streaming", func() bool { return l.count("c1", "w1") >= 50 })
	before := e.get("c1")
	e.up.ResetMax("c1")
	if r := e.wakeHandoff(w1, "c1", "w2"); r.Result != wakeup.HandingOff {
		t.Fatalf("handoff wakeup: %+v", r)
	}
	waitFor(t, 5*time.Second, "w2 streaming", func() bool { return l.count("c1", "w2") >= 50 })
	owners, gaps := l.check(t, "c1")
	if len(owners) != 2 || owners[0] != "w1" || owners[1] != "w2" {
		t.Fatalf("deliverers %v, want w1 then w2", owners)
	}
	c := e.get("c1")
	if c.LeaseOwner != "w2" || c.LeaseVersion <= before.LeaseVersion || c.MovedAtMs == 0 {
		t.Fatalf("item after the handoff: %+v (before %+v)", c, before)
	}
	// The fencing token: w1 delivered under the version it held, w2 (its standby's
	// held messages included) under the version of the transfer, and never lower.
	for _, d := range l.get("c1") {
		if want := map[string]int64{"w1": before.LeaseVersion, "w2": c.LeaseVersion}[d.worker]; d.version != want {
			t.Fatalf("%s delivered seq %d under version %d, want %d", d.worker, d.seq, d.version, want)
		}
	}
	if st := e.up.Stats("c1"); st.Clients != 1 || st.MaxClients > 2 {
		t.Fatalf("upstream clients now %d, at most %d: want 1 now and at most 2 during the overlap", st.Clients, st.MaxClients)
	}
	if w1.Metrics.Handoffs.Load() != 1 || w2.Metrics.HandoffsTaken.Load() != 1 {
		t.Fatalf("handoffs %d, taken %d", w1.Metrics.Handoffs.Load(), w2.Metrics.HandoffsTaken.Load())
	}
	t.Logf("gap between the last delivery of w1 and the first of w2: %s (upstream interval %s)", gaps[0], time.Second/rate)
	// The new owner is an owner like any other: its drain hands the connection on, to
	// the one live worker left.
	if err := w2.stop(); err != nil {
		t.Fatal(err)
	}
	n := l.count("c1", "w1")
	waitFor(t, 5*time.Second, "w1 streaming again", func() bool { return l.count("c1", "w1") >= n+20 })
	if c := e.get("c1"); c.LeaseOwner != "w1" || c.Status != "handed_off" {
		t.Fatalf("after w2's drain: %+v", c)
	}
	owners, _ = l.check(t, "c1")
	if len(owners) != 3 {
		t.Fatalf("deliverers %v, want w1, w2, w1", owners)
	}
	rows, v3 := l.get("c1"), e.get("c1").LeaseVersion
	if last := rows[len(rows)-1]; last.worker != "w1" || last.version != v3 || v3 <= c.LeaseVersion {
		t.Fatalf("w1 again delivers under version %d; the table says %d (w2 held %d): want the newest", last.version, v3, c.LeaseVersion)
	}
	for i := 1; i < len(rows); i++ {
		if rows[i].version < rows[i-1].version {
			t.Fatalf("seq %d delivered under version %d after seq %d under %d", rows[i].seq, rows[i].version, rows[i-1].seq, rows[i-1].version)
		}
	}
}

// A handoff wakeup is refused for a target that is not a live, non-draining worker
// with room, for itself, and for a lease version that is not the one held.
func TestHandoffWakeupRefusals(t *testing.T) {
	e := newEnv(t, rate)
	e.putConn("c1", schema.Started)
	var l ledger
	w1 := e.handoffWorker("w1", &l, opts{})
	e.wake(w1, wakeup.NeedsOwner, 0, "c1")
	waitFor(t, 5*time.Second, "w1 streaming", func() bool { return l.count("c1", "w1") >= 10 })
	v := e.get("c1").LeaseVersion
	send := func(c wakeup.Conn) wakeup.ConnResult {
		resp, err := (&wakeup.Client{Secret: secret}).Send(context.Background(), w1.Addr(), wakeup.Request{Conns: []wakeup.Conn{c}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Results[0]
	}
	e.putWorker(codec.Worker{ID: "wd", Addr: "127.0.0.1:1", Capacity: 10, Draining: true, HeartbeatExpiresAtMs: time.Now().Add(time.Minute).UnixMilli()})
	e.putWorker(codec.Worker{ID: "wf", Addr: "127.0.0.1:1", Capacity: 10, Load: 10, HeartbeatExpiresAtMs: time.Now().Add(time.Minute).UnixMilli()})
	e.putWorker(codec.Worker{ID: "wx", Addr: "127.0.0.1:1", Capacity: 10, HeartbeatExpiresAtMs: time.Now().Add(-time.Minute).UnixMilli()})
	for _, tc := range []struct {
		name string
		c    wakeup.Conn
		want wakeup.Result
	}{
		{"itself", wakeup.Conn{ID: "c1", LeaseVersion: v, Reason: wakeup.Handoff, To: "w1"}, wakeup.TargetUnavailable},
		{"unknown", wakeup.Conn{ID: "c1", LeaseVersion: v, Reason: wakeup.Handoff, To: "nobody"}, wakeup.TargetUnavailable},
		{"draining", wakeup.Conn{ID: "c1", LeaseVersion: v, Reason: wakeup.Handoff, To: "wd"}, wakeup.TargetUnavailable},
		{"full", wakeup.Conn{ID: "c1", LeaseVersion: v, Reason: wakeup.Handoff, To: "wf"}, wakeup.TargetUnavailable},
		{"lapsed", wakeup.Conn{ID: "c1", LeaseVersion: v, Reason: wakeup.Handoff, To: "wx"}, wakeup.TargetUnavailable},
		{"stale version", wakeup.Conn{ID: "c1", LeaseVersion: v - 1, Reason: wakeup.Handoff, To: "wd"}, wakeup.Stale},
		{"not held", wakeup.Conn{ID: "c9", LeaseVersion: v, Reason: wakeup.Handoff, To: "wd"}, wakeup.LostRace},
	} {
		if r := send(tc.c); r.Result != tc.want {
			t.Errorf("%s: %+v, want %s", tc.name, r, tc.want)
		}
	}
	if c := e.get("c1"); c.LeaseOwner != "w1" || c.LeaseVersion != v {
		t.Fatalf("a refused handoff changed the item: %+v", c)
	}
	n := l.count("c1", "w1")
	waitFor(t, 5*time.Second, "w1 still streaming", func() bool { return l.count("c1", "w1") > n+10 })
}

func (e *env) putWorker(w codec.Worker) {
	e.t.Helper()
	if _, err := e.db.DB.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: &e.db.Table, Item: codec.EncodeWorker(w)}); err != nil {
		e.t.Fatal(err)
	}
}

// commitProxy sits in front of a worker's listener and can fail its handoff commits
// (calling onCommit first), as when the old owner dies between transfer and commit.
type commitProxy struct {
	srv      *httptest.Server
	mu       sync.Mutex
	target   string
	onCommit func() // nil: pass commits through
	slow     bool   // pass the commit on after onCommit instead of failing it
}

func newCommitProxy(t *testing.T) *commitProxy {
	p := &commitProxy{}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		p.mu.Lock()
		target, hook := p.target, p.onCommit
		p.mu.Unlock()
		if hook != nil && bytes.Contains(body, []byte(`"op":"commit"`)) {
			hook()
			if !p.slow {
				http.Error(w, "commit lost by test", http.StatusBadGateway)
				return
			}
		}
		u, _ := url.Parse("http://" + target)
		r.Body = io.NopCloser(bytes.NewReader(body))
		httputil.NewSingleHostReverseProxy(u).ServeHTTP(w, r)
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *commitProxy) addr() string { return strings.TrimPrefix(p.srv.URL, "http://") }

func (p *commitProxy) advertise(real string) string {
	p.mu.Lock()
	p.target = real
	p.mu.Unlock()
	return p.addr()
}

// Every way a handoff can fail ends with the connection streaming and no sequence
// lost: the old owner releases (the next owner resumes from its checkpoint), or the
// target takes the lease up from the table.
func TestHandoffFallbacks(t *testing.T) {
	for _, tc := range []struct {
		name string
		w1   opts // the old owner's options
		// setup returns the target's id; after runs once the handoff was asked for.
		setup func(e *env, l *ledger) (to string, target *worker)
		after func(e *env, l *ledger, target *worker)
		// wantStatus: the status_error left by a fallback release ("": none).
		wantStatus string
	}{
		{
			name: "target unreachable",
			setup: func(e *env, l *ledger) (string, *worker) {
				e.putWorker(codec.Worker{ID: "w9", Addr: "127.0.0.1:1", Capacity: 10, HeartbeatExpiresAtMs: time.Now().Add(time.Minute).UnixMilli()})
				return "w9", nil
			},
			wantStatus: "handoff: prepare at w9",
		},
		{
			// The old owner's slow sink makes its cut outlast the standby's room.
			name: "standby overflow",
			w1:   opts{sinkDelay: 30 * time.Millisecond},
			setup: func(e *env, l *ledger) (string, *worker) {
				return "w2", e.handoffWorker("w2", l, opts{standbyMax: 1})
			},
			after: func(e *env, l *ledger, w2 *worker) {
				if w2.Metrics.StandbyOverflows.Load() == 0 {
					e.t.Fatal("the standby never overflowed")
				}
			},
		},
		{
			// The commit comes late: the standby overflowed after ready, so the target
			// takes the lease up from the commit and dials afresh from the cut.
			name: "standby overflow after ready",
			setup: func(e *env, l *ledger) (string, *worker) {
				p := newCommitProxy(e.t)
				p.onCommit, p.slow = func() { time.Sleep(300 * time.Millisecond) }, true
				return "w2", e.handoffWorker("w2", l, opts{standbyMax: 10, advertise: p.advertise})
			},
			after: func(e *env, l *ledger, w2 *worker) {
				waitFor(e.t, 5*time.Second, "adopted", func() bool { return w2.Metrics.HandoffsAdopted.Load() == 1 })
				if w2.Metrics.StandbyOverflows.Load() != 1 || w2.Metrics.HandoffsTaken.Load() != 0 {
					e.t.Fatalf("overflows %d, taken %d", w2.Metrics.StandbyOverflows.Load(), w2.Metrics.HandoffsTaken.Load())
				}
			},
		},
		{
			name: "old owner gone between transfer and commit",
			setup: func(e *env, l *ledger) (string, *worker) {
				p := newCommitProxy(e.t)
				p.onCommit = func() {}
				return "w2", e.handoffWorker("w2", l, opts{advertise: p.advertise})
			},
		},
		{
			name: "target killed after prepare",
			setup: func(e *env, l *ledger) (string, *worker) {
				p := newCommitProxy(e.t)
				var w2 *worker
				p.onCommit = func() {
					w2.cut.mode.Store(fail) // it dies without a word to the table
					go w2.stop()
				}
				w2 = e.handoffWorker("w2", l, opts{advertise: p.advertise})
				return "w2", w2
			},
			after: func(e *env, l *ledger, w2 *worker) {
				waitFor(e.t, 5*time.Second, "w2 gone", func() bool { return w2.Manager.Draining() })
				w2.stop()
				// Its membership lapses; the reaper releases what the table says it holds.
				if _, err := e.store.ReleaseAllOwnedBy(context.Background(), "w2"); err != nil {
					e.t.Fatal(err)
				}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, rate)
			e.putConn("c1", schema.Started)
			var l ledger
			w1 := e.handoffWorker("w1", &l, tc.w1)
			to, target := tc.setup(e, &l)
			e.wake(w1, wakeup.NeedsOwner, 0, "c1")
			waitFor(t, 5*time.Second, "w1 streaming", func() bool { return l.count("c1", "w1") >= 50 })
			if r := e.wakeHandoff(w1, "c1", to); r.Result != wakeup.HandingOff {
				t.Fatalf("handoff wakeup: %+v", r)
			}
			waitFor(t, 10*time.Second, "the handoff to end", func() bool {
				c := e.get("c1")
				return !c.Owned() || c.LeaseOwner == to
			})
			if tc.after != nil {
				tc.after(e, &l, target)
			}
			if c := e.get("c1"); tc.wantStatus != "" && !strings.Contains(c.StatusError, tc.wantStatus) {
				t.Fatalf("status_error %q, want it to say %q", c.StatusError, tc.wantStatus)
			}
			// Released: the reconciler would wake a worker; wake w1.
			if c := e.get("c1"); !c.Owned() {
				if r := e.wake(w1, wakeup.NeedsOwner, c.LeaseVersion, "c1"); r[0].Result != wakeup.Acquired {
					t.Fatalf("re-acquire after the fallback: %+v", r)
				}
			}
			n := len(l.get("c1"))
			waitFor(t, 10*time.Second, "streaming again", func() bool { return len(l.get("c1")) >= n+50 })
			owners, gaps := l.check(t, "c1")
			c := e.get("c1")
			t.Logf("deliverers %v, gaps %v; item owner %s status %q %q", owners, gaps, c.LeaseOwner, c.Status, c.StatusError)
		})
	}
}

// With resume none the upstream cannot be resumed: the old owner does not prepare a
// standby and releases, saying that the handoff was a release-then-acquire.
func TestHandoffResumeNoneIsReleaseThenAcquire(t *testing.T) {
	e := newEnv(t, rate)
	e.putConn("c1", schema.Started)
	var l ledger
	w1 := e.handoffWorker("w1", &l, opts{resume: "none"})
	w2 := e.handoffWorker("w2", &l, opts{resume: "none"})
	e.wake(w1, wakeup.NeedsOwner, 0, "c1")
	waitFor(t, 5*time.Second, "w1 streaming", func() bool { return l.count("c1", "w1") >= 20 })
	if r := e.wakeHandoff(w1, "c1", "w2"); r.Result != wakeup.HandingOff {
		t.Fatalf("handoff wakeup: %+v", r)
	}
	waitFor(t, 5*time.Second, "released", func() bool { return !e.get("c1").Owned() })
	c := e.get("c1")
	if !strings.Contains(c.StatusError, "release-then-acquire") || c.Status != "released" {
		t.Fatalf("status %q %q: want it to say release-then-acquire", c.Status, c.StatusError)
	}
	if w1.Metrics.HandoffFallbacks.Load() != 1 || w2.Metrics.HandoffsTaken.Load() != 0 {
		t.Fatalf("fallbacks %d, taken %d", w1.Metrics.HandoffFallbacks.Load(), w2.Metrics.HandoffsTaken.Load())
	}
	if r := e.wake(w2, wakeup.NeedsOwner, c.LeaseVersion, "c1"); r[0].Result != wakeup.Acquired {
		t.Fatalf("acquire by w2: %+v", r)
	}
	waitFor(t, 5*time.Second, "w2 streaming", func() bool { return l.count("c1", "w2") >= 20 })
}

// A drain hands every connection to the live workers, spread by load, make-before-
// break; with handoffs off it releases them as before.
func TestDrainByHandoff(t *testing.T) {
	e := newEnv(t, rate)
	ids := []string{"c1", "c2", "c3", "c4", "c5", "c6"}
	for _, id := range ids {
		e.putConn(id, schema.Started)
	}
	var l ledger
	w1 := e.handoffWorker("w1", &l, opts{})
	e.wake(w1, wakeup.NeedsOwner, 0, ids...)
	waitFor(t, 5*time.Second, "w1 streaming", func() bool {
		for _, id := range ids {
			if l.count(id, "w1") < 20 {
				return false
			}
		}
		return true
	})
	w2 := e.handoffWorker("w2", &l, opts{})
	w3 := e.handoffWorker("w3", &l, opts{})
	if err := w1.stop(); err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, id := range ids {
		c := e.get(id)
		// handed_off is the transfer's status; the new owner's next checkpoint says
		// streaming, which on a loaded machine may already have landed.
		if c.LeaseOwner != "w2" && c.LeaseOwner != "w3" || c.Status != "handed_off" && c.Status != "streaming" {
			t.Fatalf("%s after the drain: %+v", id, c)
		}
		got[c.LeaseOwner]++
	}
	if got["w2"] != 3 || got["w3"] != 3 {
		t.Fatalf("spread %v, want 3 each", got)
	}
	waitFor(t, 5*time.Second, "streaming at the new owners", func() bool {
		for _, id := range ids {
			if l.count(id, e.get(id).LeaseOwner) < 20 {
				return false
			}
		}
		return true
	})
	for _, id := range ids {
		owners, gaps := l.check(t, id)
		if len(owners) != 2 {
			t.Fatalf("%s: deliverers %v", id, owners)
		}
		t.Logf("%s: %v, gap %s", id, owners, gaps[0])
	}
	if n := w2.Metrics.HandoffsTaken.Load() + w3.Metrics.HandoffsTaken.Load(); n != int64(len(ids)) {
		t.Fatalf("%d taken over from standbys, want %d", n, len(ids))
	}
	// Handoffs off: the drain releases, as before, even with a live worker to hand to.
	for _, w := range []*worker{w2, w3} {
		if err := w.stop(); err != nil {
			t.Fatal(err)
		}
	}
	w4 := e.handoffWorker("w4", &l, opts{noHandoff: true})
	for _, id := range ids {
		if r := e.wake(w4, wakeup.NeedsOwner, 0, id); r[0].Result != wakeup.Acquired {
			t.Fatalf("w4 wake %s: %+v (%+v)", id, r, e.get(id))
		}
	}
	e.handoffWorker("w5", &l, opts{})
	waitFor(t, 5*time.Second, "w4 streaming", func() bool { return l.count("c1", "w4") >= 20 })
	if err := w4.stop(); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if c := e.get(id); c.Owned() || c.Status != "released" {
			t.Fatalf("%s after a drain with handoffs off: %+v", id, c)
		}
	}
}

// A worker the table names after a handoff whose commit it never heard takes the
// lease up at once on a check wakeup (the reconciler's, for the transfer's record),
// without waiting for its standby timeout, and resumes after the transferred
// checkpoint.
func TestCheckWakeupAdoptsAHandedOffLease(t *testing.T) {
	e := newEnv(t, rate)
	e.putConn("c1", schema.Started)
	var l ledger
	w1 := e.handoffWorker("w1", &l, opts{})
	p := newCommitProxy(t)
	p.onCommit = func() {} // the commit is lost
	w2 := e.handoffWorker("w2", &l, opts{advertise: p.advertise})
	e.wake(w1, wakeup.NeedsOwner, 0, "c1")
	waitFor(t, 5*time.Second, "w1 streaming", func() bool { return l.count("c1", "w1") >= 50 })
	if r := e.wakeHandoff(w1, "c1", "w2"); r.Result != wakeup.HandingOff {
		t.Fatalf("handoff wakeup: %+v", r)
	}
	waitFor(t, 2*time.Second, "transferred", func() bool { return e.get("c1").LeaseOwner == "w2" })
	start := time.Now()
	if r := e.wake(w2, wakeup.Check, e.get("c1").LeaseVersion, "c1"); r[0].Result != wakeup.AlreadyOwned {
		t.Fatalf("check wakeup at the new owner: %+v", r)
	}
	waitFor(t, 2*time.Second, "w2 streaming", func() bool { return l.count("c1", "w2") >= 20 })
	if took := time.Since(start); took > time.Second {
		t.Fatalf("took %s: the standby timeout (3s) did it, not the wakeup", took)
	}
	if w2.Metrics.HandoffsAdopted.Load()+w2.Metrics.HandoffsTaken.Load() == 0 {
		t.Fatal("neither adopted nor taken over")
	}
	owners, _ := l.check(t, "c1")
	if len(owners) != 2 {
		t.Fatalf("deliverers %v", owners)
	}
	// A check for a lease this worker does not hold and the table does not name it for
	// is still lost_race.
	e.putConn("c2", schema.Started)
	if r := e.wake(w2, wakeup.Check, 0, "c2"); r[0].Result != wakeup.LostRace {
		t.Fatalf("check of an unheld, unnamed lease: %+v", r)
	}
}

// A drain whose only target never answers gives up each prepare in time and
// releases, well within the drain timeout.
func TestDrainWithAHungTargetReleasesInTime(t *testing.T) {
	e := newEnv(t, rate)
	ids := []string{"c1", "c2", "c3"}
	for _, id := range ids {
		e.putConn(id, schema.Started)
	}
	hung, err := net.Listen("tcp", "127.0.0.1:0") // accepts, never answers
	if err != nil {
		t.Fatal(err)
	}
	defer hung.Close()
	var l ledger
	w1 := e.handoffWorker("w1", &l, opts{})
	e.wake(w1, wakeup.NeedsOwner, 0, ids...)
	waitFor(t, 5*time.Second, "w1 streaming", func() bool { return l.count("c3", "w1") >= 20 })
	e.putWorker(codec.Worker{ID: "wh", Addr: hung.Addr().String(), Capacity: 10, HeartbeatExpiresAtMs: time.Now().Add(time.Minute).UnixMilli()})
	start := time.Now()
	if err := w1.stop(); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if took > 3500*time.Millisecond { // prepare timeout 2s, abort 0.5s, drain timeout 10s
		t.Fatalf("drain took %s", took)
	}
	for _, id := range ids {
		c := e.get(id)
		if c.Owned() || !strings.Contains(c.StatusError, "prepare at wh") {
			t.Fatalf("%s after the drain: %+v", id, c)
		}
		rows := l.get(id)
		if c.LastSeq != rows[len(rows)-1].seq {
			t.Fatalf("%s: released at %d, last delivered %d", id, c.LastSeq, rows[len(rows)-1].seq)
		}
	}
	t.Logf("drain with a hung target: %s", took)
}
