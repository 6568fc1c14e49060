package owner

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sockfleet/sockfleet/shared/lease"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/shared/wakeup"
	"github.com/sockfleet/sockfleet/worker/internal/stream"
)

// fakeStore is a strict fake: every call must be expected by the test's hooks.
type fakeStore struct {
	t        *testing.T
	mu       sync.Mutex
	acquire  func(id string) (lease.Lease, error)
	renew    func(ctx context.Context, l lease.Lease, p lease.Progress) (codec.Connection, error)
	renews   []lease.Progress
	releases map[string]lease.Progress
}

func (f *fakeStore) Acquire(_ context.Context, id, worker string) (lease.Lease, error) {
	if f.acquire == nil {
		f.t.Errorf("unexpected Acquire(%s)", id)
		return lease.Lease{}, errors.New("unexpected")
	}
	return f.acquire(id)
}

func (f *fakeStore) Renew(ctx context.Context, l lease.Lease, p lease.Progress) (codec.Connection, error) {
	f.mu.Lock()
	f.renews = append(f.renews, p)
	h := f.renew
	f.mu.Unlock()
	if h == nil {
		f.t.Errorf("unexpected Renew(%s)", l.ID)
		return codec.Connection{}, errors.New("unexpected")
	}
	return h(ctx, l, p)
}

func (f *fakeStore) Release(_ context.Context, l lease.Lease, p lease.Progress) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.releases == nil {
		f.releases = map[string]lease.Progress{}
	}
	if _, dup := f.releases[l.ID]; dup {
		f.t.Errorf("released %s twice", l.ID)
	}
	f.releases[l.ID] = p
	return nil
}

func (f *fakeStore) released(id string) (lease.Progress, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.releases[id]
	return p, ok
}

type fakeRegistry struct {
	mu      sync.Mutex
	puts    []codec.Worker
	deleted bool
}

func (r *fakeRegistry) Put(_ context.Context, w codec.Worker) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.puts = append(r.puts, w)
	return nil
}

func (r *fakeRegistry) Delete(_ context.Context, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.deleted = true
	return nil
}

// fakeStream "streams" until cancelled; its LastSeq is set by the test.
type fakeStream struct {
	seq     atomic.Int64
	url     atomic.Pointer[string]
	running atomic.Bool
	cause   atomic.Pointer[error]
}

func (s *fakeStream) Run(ctx context.Context) {
	s.running.Store(true)
	<-ctx.Done()
	c := context.Cause(ctx)
	s.cause.Store(&c)
	s.running.Store(false)
}
func (s *fakeStream) LastSeq() int64        { return s.seq.Load() }
func (s *fakeStream) Status() stream.Status { return stream.Status{State: "streaming"} }
func (s *fakeStream) SetURL(u string)       { s.url.Store(&u) }
func (s *fakeStream) URL() string           { return *s.url.Load() }

type rig struct {
	m       *Manager
	store   *fakeStore
	reg     *fakeRegistry
	mu      sync.Mutex
	streams map[string]*fakeStream
}

func (r *rig) stream(id string) *fakeStream {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.streams[id]
}

const url0 = "ws://up/x"

func started(id string) codec.Connection {
	return codec.Connection{ID: id, DesiredState: schema.Started, WSURL: url0}
}

// newRig builds a manager with lease 10s, renew deadline 6s, interval 2s, margin 1s.
func newRig(t *testing.T, max int) *rig {
	r := &rig{store: &fakeStore{t: t}, reg: &fakeRegistry{}, streams: map[string]*fakeStream{}}
	r.store.acquire = func(id string) (lease.Lease, error) {
		return lease.Lease{ID: id, Owner: "w", Version: 3, WSURL: url0, LastSeq: 10}, nil
	}
	r.store.renew = func(_ context.Context, l lease.Lease, _ lease.Progress) (codec.Connection, error) {
		return started(l.ID), nil
	}
	m, err := New(Config{
		WorkerID: "w", Addr: "127.0.0.1:1", MaxConnections: max,
		Lease: 10 * time.Second, RenewDeadline: 6 * time.Second, RenewInterval: 2 * time.Second,
		SkewMargin: time.Second, DrainTimeout: 5 * time.Second,
		Store: r.store, Registry: r.reg,
		NewStream: func(l lease.Lease, _ func() bool) Stream {
			id, u, seq := l.ID, l.WSURL, l.LastSeq
			s := &fakeStream{}
			s.url.Store(&u)
			s.seq.Store(seq)
			r.mu.Lock()
			r.streams[id] = s
			r.mu.Unlock()
			return s
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	r.m = m
	return r
}

// start runs the manager in the bubble; the returned func stops (drains) it.
func (r *rig) start(t *testing.T) func() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.m.Run(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
}

func (r *rig) wake(t *testing.T, c wakeup.Conn) wakeup.Result {
	t.Helper()
	out := r.m.Wake(context.Background(), []wakeup.Conn{c})
	return out[0].Result
}

func TestSelfFenceWhenRenewsFail(t *testing.T) {
	for _, mode := range []string{"error", "hang"} {
		t.Run(mode, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := newRig(t, 5)
				r.store.renew = func(ctx context.Context, l lease.Lease, _ lease.Progress) (codec.Connection, error) {
					if mode == "hang" {
						<-ctx.Done() // an unreachable table: the call times out
					}
					return codec.Connection{}, fmt.Errorf("renew: %w", lease.ErrUnavailable)
				}
				stop := r.start(t)
				t0 := time.Now()
				if got := r.wake(t, wakeup.Conn{ID: "a", Reason: wakeup.NeedsOwner}); got != wakeup.Acquired {
					t.Fatalf("wake: %s", got)
				}
				s := r.stream("a")
				synctest.Wait()
				time.Sleep(6*time.Second - time.Millisecond)
				synctest.Wait()
				if !s.running.Load() {
					t.Fatal("fenced before the renew deadline")
				}
				time.Sleep(time.Millisecond)
				synctest.Wait()
				if s.running.Load() {
					t.Fatal("still streaming at the renew deadline")
				}
				if el := time.Since(t0); el != 6*time.Second {
					t.Fatalf("fenced after %s, want 6s", el)
				}
				if r.m.cfg.Metrics.SelfFences.Load() != 1 || r.m.cfg.Metrics.RenewFailures.Load() < 2 {
					t.Fatalf("self-fences %d, renew failures %d", r.m.cfg.Metrics.SelfFences.Load(), r.m.cfg.Metrics.RenewFailures.Load())
				}
				if p, ok := r.store.released("a"); !ok || p.Status != "fenced" || p.LastSeq != 10 {
					t.Fatalf("release %+v %v, want a best-effort fenced release at 10", p, ok)
				}
				stop()
			})
		})
	}
}

func TestRenewsKeepStreamingAndCarryLastSeq(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, 5)
		stop := r.start(t)
		r.wake(t, wakeup.Conn{ID: "a", Reason: wakeup.NeedsOwner})
		s := r.stream("a")
		s.seq.Store(42)
		time.Sleep(30 * time.Second)
		synctest.Wait()
		if !s.running.Load() {
			t.Fatal("stopped although renews succeed")
		}
		r.store.mu.Lock()
		n, last := len(r.store.renews), r.store.renews[len(r.store.renews)-1]
		r.store.mu.Unlock()
		if n != 15 || last.LastSeq != 42 {
			t.Fatalf("%d renews (want 15 in 30s), last %+v", n, last)
		}
		stop()
		if p, _ := r.store.released("a"); p.LastSeq != 42 || p.Status != "" {
			t.Fatalf("drain release %+v, want last_seq 42 and the default status", p)
		}
		r.reg.mu.Lock()
		defer r.reg.mu.Unlock()
		if !r.reg.deleted || !r.reg.puts[len(r.reg.puts)-1].Draining {
			t.Fatal("registry not marked draining then deleted")
		}
	})
}

func TestRenewOutcomes(t *testing.T) {
	cases := []struct {
		name      string
		item      codec.Connection
		err       error
		released  bool
		status    string
		stillRuns bool
		newURL    string
	}{
		{name: "stopped", item: codec.Connection{DesiredState: schema.Stopped, WSURL: url0}, released: true, status: "stopped"},
		// An operator's unknown value stops it too, and says so (issue 12: not a plain "stopped").
		{name: "invalid state", item: codec.Connection{DesiredState: "started", WSURL: url0}, released: true, status: "invalid"},
		{name: "missing state", item: codec.Connection{DesiredState: "", WSURL: url0}, released: true, status: "invalid"},
		{name: "bad url", item: codec.Connection{DesiredState: schema.Started, WSURL: "http://nope"}, released: true, status: "invalid"},
		{name: "lost", err: fmt.Errorf("renew: %w", lease.ErrLost)},
		{name: "deleted", err: fmt.Errorf("renew: %w", lease.ErrNotFound)},
		{name: "new url", item: codec.Connection{DesiredState: schema.Started, WSURL: "ws://other/y"}, stillRuns: true, newURL: "ws://other/y"},
		{name: "bad spec", item: codec.Connection{DesiredState: schema.Started, WSURL: url0,
			SpecErr: fmt.Errorf("%w keepalive: interval 0s", schema.ErrInvalid)}, released: true, status: "invalid"},
		{name: "spec changed", item: codec.Connection{DesiredState: schema.Started, WSURL: url0,
			Spec: schema.Spec{Start: schema.StartEarliest}}, released: true, status: "restarting"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := newRig(t, 5)
				r.store.renew = func(context.Context, lease.Lease, lease.Progress) (codec.Connection, error) {
					return tc.item, tc.err
				}
				stop := r.start(t)
				r.wake(t, wakeup.Conn{ID: "a", Reason: wakeup.NeedsOwner})
				s := r.stream("a")
				s.seq.Store(77)
				time.Sleep(2*time.Second + time.Millisecond) // one renew
				synctest.Wait()
				if s.running.Load() != tc.stillRuns {
					t.Fatalf("running %v, want %v", s.running.Load(), tc.stillRuns)
				}
				p, released := r.store.released("a")
				if released != tc.released || p.Status != tc.status || (released && p.LastSeq != 77) {
					t.Fatalf("release %+v %v, want %v with status %q at 77", p, released, tc.released, tc.status)
				}
				if tc.newURL != "" && s.URL() != tc.newURL {
					t.Fatalf("url %s, want %s", s.URL(), tc.newURL)
				}
				if tc.stillRuns {
					r.store.renew = func(_ context.Context, l lease.Lease, _ lease.Progress) (codec.Connection, error) {
						return codec.Connection{DesiredState: schema.Started, WSURL: tc.newURL}, nil
					}
				}
				stop()
			})
		})
	}
}

func TestWakeResults(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, 2)
		r.store.acquire = func(id string) (lease.Lease, error) {
			switch id {
			case "held":
				return lease.Lease{}, fmt.Errorf("acquire: %w", lease.ErrHeld)
			case "stopped":
				return lease.Lease{}, fmt.Errorf("acquire: %w", lease.ErrNotStarted)
			case "gone":
				return lease.Lease{}, fmt.Errorf("acquire: %w", lease.ErrNotFound)
			case "down":
				return lease.Lease{}, fmt.Errorf("acquire: %w", lease.ErrUnavailable)
			}
			return lease.Lease{ID: id, Owner: "w", Version: 3, WSURL: url0}, nil
		}
		stop := r.start(t)
		steps := []struct {
			c    wakeup.Conn
			want wakeup.Result
		}{
			{wakeup.Conn{ID: "a", LeaseVersion: 2, Reason: wakeup.NeedsOwner}, wakeup.Acquired},
			// Held ids are verified against the table (a renew here), never answered
			// from memory, whatever version the wakeup names.
			{wakeup.Conn{ID: "a", LeaseVersion: 2, Reason: wakeup.NeedsOwner}, wakeup.AlreadyOwned},
			{wakeup.Conn{ID: "a", LeaseVersion: 1, Reason: wakeup.Check}, wakeup.AlreadyOwned},
			{wakeup.Conn{ID: "a", LeaseVersion: 3, Reason: wakeup.NeedsOwner}, wakeup.AlreadyOwned},
			{wakeup.Conn{ID: "a", LeaseVersion: 3, Reason: wakeup.Check}, wakeup.AlreadyOwned},
			{wakeup.Conn{ID: "held", Reason: wakeup.NeedsOwner}, wakeup.LostRace},
			{wakeup.Conn{ID: "stopped", Reason: wakeup.NeedsOwner}, wakeup.NotStartable},
			{wakeup.Conn{ID: "gone", Reason: wakeup.NeedsOwner}, wakeup.NotStartable},
			{wakeup.Conn{ID: "down", Reason: wakeup.NeedsOwner}, wakeup.Failed},
			{wakeup.Conn{ID: "b", Reason: wakeup.Check}, wakeup.LostRace},
			{wakeup.Conn{ID: "b", Reason: wakeup.NeedsOwner}, wakeup.Acquired},
			{wakeup.Conn{ID: "c", Reason: wakeup.NeedsOwner}, wakeup.NoCapacity},
		}
		for _, st := range steps {
			if got := r.wake(t, st.c); got != st.want {
				t.Errorf("wake %+v = %s, want %s", st.c, got, st.want)
			}
		}
		if got := r.m.Load(); got != 2 {
			t.Errorf("load %d after acquiring a and b, want 2 (the figure wakeup replies carry)", got)
		}
		// A Check whose renew finds the item STOPPED releases it and says so.
		r.store.renew = func(context.Context, lease.Lease, lease.Progress) (codec.Connection, error) {
			return codec.Connection{DesiredState: schema.Stopped, WSURL: url0}, nil
		}
		if got := r.wake(t, wakeup.Conn{ID: "a", LeaseVersion: 3, Reason: wakeup.Check}); got != wakeup.NotStartable {
			t.Errorf("check of a stopped item = %s", got)
		}
		synctest.Wait()
		if _, ok := r.store.released("a"); !ok {
			t.Error("stopped item not released")
		}
		if got := r.m.Load(); got != 1 {
			t.Errorf("load %d after a was released, want 1", got)
		}
		r.store.renew = func(_ context.Context, l lease.Lease, _ lease.Progress) (codec.Connection, error) {
			return started(l.ID), nil
		}
		stop()
		if got := r.wake(t, wakeup.Conn{ID: "z", Reason: wakeup.NeedsOwner}); got != wakeup.Draining {
			t.Errorf("wake after drain = %s", got)
		}
		if !r.m.Draining() || len(r.m.Owned()) != 0 {
			t.Error("not drained")
		}
	})
}

func TestHealthFailsWhenLoopStalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, 5)
		block := make(chan struct{})
		r.store.renew = func(_ context.Context, l lease.Lease, _ lease.Progress) (codec.Connection, error) {
			<-block // a renew that ignores its context: the loop is stuck
			return started(l.ID), nil
		}
		stop := r.start(t)
		r.wake(t, wakeup.Conn{ID: "a", Reason: wakeup.NeedsOwner})
		time.Sleep(5 * time.Second)
		if err := r.m.Healthy(); err != nil {
			t.Fatalf("unhealthy too early: %v", err)
		}
		time.Sleep(10 * time.Second)
		if err := r.m.Healthy(); err == nil {
			t.Fatal("healthy although no round began for 13s")
		}
		close(block)
		stop()
	})
}

func TestConfigTimingRule(t *testing.T) {
	base := Config{WorkerID: "w", MaxConnections: 1, Store: &fakeStore{}, Registry: &fakeRegistry{},
		NewStream: func(lease.Lease, func() bool) Stream { return nil }, DrainTimeout: time.Second, SkewMargin: time.Second}
	cases := []struct {
		lease, deadline, interval time.Duration
		ok                        bool
	}{
		{10 * time.Second, 6 * time.Second, 2 * time.Second, true},
		{6 * time.Second, 6 * time.Second, 2 * time.Second, false},
		{10 * time.Second, 2 * time.Second, 2 * time.Second, false},
		{10 * time.Second, 6 * time.Second, 0, false},
	}
	for _, tc := range cases {
		c := base
		c.Lease, c.RenewDeadline, c.RenewInterval = tc.lease, tc.deadline, tc.interval
		if _, err := New(c); (err == nil) != tc.ok {
			t.Errorf("%+v: err %v", tc, err)
		}
	}
	if got := FenceAfter(10*time.Second, 9*time.Second, 3*time.Second); got != 7*time.Second {
		t.Errorf("FenceAfter = %s, want lease-margin 7s", got)
	}
}

// The sink-write guard and the graceful flush agree: after a stop or drain (graceful
// causes) queued messages may still be delivered until the fence deadline; after a
// lost lease or a self-fence nothing may.
func TestStillOursAfterGracefulCancel(t *testing.T) {
	m := newRig(t, 1).m
	for cause, want := range map[error]bool{nil: true, errStopped: true, errDraining: true, errInvalid: true,
		errLost: false, errDeleted: false, errFenced: false} {
		ctx, cancel := context.WithCancelCause(context.Background())
		o := &owned{ctx: ctx, cancel: cancel}
		if cause != nil {
			cancel(cause)
		}
		if got := m.beforeFence(o); got != want {
			t.Errorf("cause %v: still ours %v, want %v", cause, got, want)
		}
		o.writtenAt.Store(int64(-2 * time.Minute)) // past the fence deadline
		if m.beforeFence(o) {
			t.Errorf("cause %v: still ours past the fence deadline", cause)
		}
		cancel(nil)
	}
}

// haltStream stops by itself, as a stream does on a sequence reset under
// seq_reset=halt.
type haltStream struct{ fakeStream }

func (s *haltStream) Run(context.Context) {}
func (s *haltStream) Epoch() int64        { return 3 }
func (s *haltStream) Halted() error       { return errors.New("sequence reset: seq 1 after 900") }

// A stream that halted itself is released with status seq_reset, its reason and
// its checkpoint (epoch included); it is not taken for a fence.
func TestHaltedStreamReleasesWithSeqReset(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, 5)
		r.m.cfg.NewStream = func(l lease.Lease, _ func() bool) Stream {
			s := &haltStream{}
			s.url.Store(&l.WSURL)
			s.seq.Store(900)
			return s
		}
		stop := r.start(t)
		defer stop()
		r.wake(t, wakeup.Conn{ID: "h", Reason: wakeup.NeedsOwner})
		synctest.Wait()
		p, ok := r.store.released("h")
		if !ok || p.Status != schema.StatusSeqReset || !strings.Contains(p.Error, "sequence reset") || p.LastSeq != 900 || p.Epoch != 3 || !p.Stop {
			t.Fatalf("release %+v %v; want seq_reset at 900, epoch 3", p, ok)
		}
		if n := r.m.cfg.Metrics.SelfFences.Load(); n != 0 {
			t.Fatalf("%d self-fences", n)
		}
	})
}
