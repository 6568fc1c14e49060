// Package owner is the worker's ownership loop: it acquires connection leases (on a
// wakeup, or in the one start-up pass), streams each owned connection, keeps the
// right to stream it, fences itself when it cannot, and drains on shutdown.
//
// Two modes keep that right. In stream mode (Config.Member set; see member.go and
// docs/MEMBERSHIP.md) the worker renews one membership lease, its registry item, and
// writes each connection only to checkpoint (when something changed, at most once
// per checkpoint interval) and to release. In polling mode (the seed's design) it
// renews every connection's lease each interval, carrying the acknowledged last_seq.
//
// Guarantees:
//   - A connection streams only under a lease this worker acquired, and stops at once
//     (its context is cancelled) when a renew or checkpoint says the lease is lost or
//     the item is gone, STOPPED or unusable.
//   - Self-fencing: past its local deadline — the start of the last successful renew
//     (the membership's in stream mode, the connection's in polling mode) plus
//     min(RenewDeadline, Lease − SkewMargin), on the monotonic clock — a connection
//     stops and no sink write passes the guard, even if the table cannot be reached
//     at all. The lease in the table runs from a moment after that start, and others
//     take it over (polling) or release it (the reconciler, stream mode) only
//     SkewMargin after it expired on their clocks, so a fenced worker has stopped
//     before anyone else can acquire. SinkWindow bounds the sink writes in flight.
//   - Stream mode: a membership renew refused as "not a member" (declared dead,
//     replaced, deleted) stops every connection and makes Run return ErrExpelled.
//   - Every stop except "lost" and "deleted" ends with one release write that
//     carries the final acknowledged last_seq (lease_expires_at_ms = 0); in stream
//     mode a release the table did not answer is retried after each successful
//     membership renew.
//   - A wakeup about a lease this worker holds is answered after a conditional write
//     that reads the item, never from memory.
//   - Run joins every goroutine it started, including connection goroutines.
//   - Planned handoff (stream mode, Config.Handoff; handoff.go, docs/HANDOFF.md):
//     the old owner stops delivering (its stream returns, everything read delivered)
//     before the one conditional write that transfers the lease, and the new owner
//     delivers only after it learns the new version (the commit, or the item read
//     with a conditional write), dropping what the old owner delivered. So at most
//     one worker delivers a connection at a time, and a handoff skips no sequence and
//     repeats none. Two upstream sockets may be open at once for at most the prepare
//     timeout plus the cut (the old stream's last flush and close). A handoff that
//     cannot be prepared ends in the release above, saying why in status_error; a
//     drain hands off first and releases what is left, within DrainTimeout.
//
// Non-guarantees: delivery is at least once. Messages delivered after the last
// checkpoint are delivered again by the next owner if this worker dies without
// releasing; that window is one checkpoint interval (stream mode) or one renew
// interval (polling mode) of traffic.
package owner

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sockfleet/sockfleet/shared/lease"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/shared/wakeup"
	"github.com/sockfleet/sockfleet/worker/internal/metrics"
	"github.com/sockfleet/sockfleet/worker/internal/stream"
)

// Store is the part of the lease store the loop uses.
type Store interface {
	Acquire(ctx context.Context, id, worker string) (lease.Lease, error)
	Renew(ctx context.Context, l lease.Lease, p lease.Progress) (codec.Connection, error)
	Release(ctx context.Context, l lease.Lease, p lease.Progress) error
}

// Registry is the part of the worker registry the loop uses.
type Registry interface {
	Put(ctx context.Context, w codec.Worker) error
	Delete(ctx context.Context, id string) error
}

// Stream runs one connection (see package stream).
type Stream interface {
	Run(ctx context.Context)
	LastSeq() int64
	Status() stream.Status
	SetURL(url string)
	URL() string
}

// Why a connection's context was cancelled.
var (
	errLost     = errors.New("lease lost")
	errDeleted  = errors.New("connection deleted")
	errFenced   = errors.New("self-fenced: lease not renewed in time")
	errStopped  = fmt.Errorf("desired_state is not STARTED: %w", stream.ErrGraceful)
	errInvalid  = fmt.Errorf("item unusable: %w", stream.ErrGraceful)
	errDraining = fmt.Errorf("worker draining: %w", stream.ErrGraceful)
	// errExpelled: the membership renew says this worker is no longer a member.
	errExpelled = errors.New("expelled: no longer a member")
	// The operator changed the connection's spec: give the lease back so the next
	// acquire (the release wakes one) streams with the new spec from the checkpoint.
	errSpecChanged = fmt.Errorf("spec changed: %w", stream.ErrGraceful)
	errHalted      = errors.New("stream halted itself")
)

// sequenced is implemented by streams that track a sequence epoch and may halt
// themselves (a reset of the upstream's numbering under seq_reset=halt).
type sequenced interface {
	Epoch() int64
	Halted() error
}

// progress is o's checkpoint: its last sequence and, if the stream tracks one, the
// epoch of that sequence.
func progress(o *owned) lease.Progress {
	p := lease.Progress{LastSeq: o.s.LastSeq()}
	if sq, ok := o.s.(sequenced); ok {
		p.Epoch = sq.Epoch()
	}
	return p
}

// Config configures a Manager.
type Config struct {
	WorkerID       string
	Addr           string // advertised host:port of the wakeup endpoint
	MaxConnections int

	Lease         time.Duration
	RenewInterval time.Duration
	RenewDeadline time.Duration
	SkewMargin    time.Duration
	DrainTimeout  time.Duration

	RenewConcurrency  int           // renews in flight at once; default 32
	WakeupConcurrency int           // ids of one wakeup handled at once; default 16
	ReleaseTimeout    time.Duration // one release write; default 10s, at most DrainTimeout/2

	Store    Store
	Registry Registry
	// Candidates, if set, lists connections to try in the one start-up pass (see
	// ScanCandidates), so a fleet that starts cold is not idle until the next event.
	Candidates func(ctx context.Context) ([]string, error)
	// NewStream makes a connection's stream; valid reports, on the monotonic clock,
	// whether the lease is still before its fence deadline.
	NewStream func(l lease.Lease, valid func() bool) Stream

	// Polling mode (the seed's design; nil in stream mode). Orphans lists STARTED
	// connections whose lease is released or expired; it is called every PollInterval
	// with ±50 % jitter from Rand, and every id found is tried. DesiredState is the
	// seed's per-connection desired_state read, made for every owned connection on
	// every renew tick.
	Orphans      func(ctx context.Context) ([]string, error)
	PollInterval time.Duration
	Rand         func() float64 // [0,1); default math/rand/v2
	DesiredState func(ctx context.Context, id string) (schema.State, error)
	Metrics      *metrics.Counters
	EMF          *metrics.EMF // may be nil
	Log          *slog.Logger

	// Membership (stream mode; nil in polling mode): Lease, RenewInterval and
	// RenewDeadline then time the worker's membership lease, not its connections',
	// which are never renewed. See member.go.
	Member *MemberConfig
	// Handoff (stream mode; nil: drain releases, handoff wakeups are refused):
	// planned handoffs make-before-break, see handoff.go and docs/HANDOFF.md.
	Handoff *HandoffConfig
}

// Manager owns this worker's leases.
type Manager struct {
	cfg   Config
	fence time.Duration // renew deadline after a successful renew start

	base       context.Context // parent of every connection's context
	cancelBase context.CancelCauseFunc
	wg         sync.WaitGroup // connection sessions

	mu        sync.Mutex
	conns     map[string]*owned
	acquiring map[string]bool
	draining  bool

	started   time.Time    // monotonic base of lastRound
	lastRound atomic.Int64 // ns after started at which a renew round last began
	running   atomic.Bool

	mem *membership // nil in polling mode
	ho  *handoffs   // nil unless planned handoffs are on (stream mode)
}

// owned is one held lease and its stream.
type owned struct {
	lease  lease.Lease // Version is fixed for the life of the session
	s      Stream
	ctx    context.Context
	cancel context.CancelCauseFunc
	timer  *time.Timer // self-fence

	renewMu sync.Mutex    // one renew of this lease at a time (a single call, never a retry loop)
	written stream.Status // status last folded into a write; under renewMu
	// renewedAt is when the last successful renew (or the acquire) began, as the
	// monotonic time since Manager.started: rounds renew the oldest first.
	renewedAt atomic.Int64

	done chan struct{} // closed when its session has ended

	// Planned handoff (handoff.go): set once a handoff of this lease began; the
	// target once its standby is ready (read by the session's cut-over); why it fell
	// back to a release; whether the transfer was written.
	handing     atomic.Bool
	rebalance   atomic.Bool // the handoff is a rebalance move: it starts the cooling period
	target      atomic.Pointer[codec.Worker]
	fallback    atomic.Pointer[string]
	transferred atomic.Bool
	cut         atomic.Bool  // cutOver ran (from the stream's Cut, or from finish)
	stopAt      atomic.Int64 // when a handoff stopped the stream (unix ns), for the cut-over's timings
	// Membership mode, under renewMu: when the last checkpoint was written (monotonic,
	// since Manager.started) and the last_seq it carried.
	checkpointAt int64
	writtenSeq   int64
}

// New checks cfg and returns a Manager.
func New(cfg Config) (*Manager, error) {
	if cfg.WorkerID == "" || cfg.Store == nil || cfg.Registry == nil || cfg.NewStream == nil {
		return nil, errors.New("owner config: worker id, store, registry and stream factory are required")
	}
	if cfg.MaxConnections <= 0 {
		return nil, fmt.Errorf("owner config: max connections %d must be positive", cfg.MaxConnections)
	}
	if err := schema.CheckTimings(cfg.Lease, cfg.RenewDeadline, cfg.RenewInterval, cfg.SkewMargin); err != nil {
		return nil, fmt.Errorf("owner config: %w", err)
	}
	if cfg.DrainTimeout <= 0 {
		return nil, fmt.Errorf("owner config: drain timeout %s must be positive", cfg.DrainTimeout)
	}
	if cfg.RenewConcurrency <= 0 {
		cfg.RenewConcurrency = 32
	}
	if cfg.WakeupConcurrency <= 0 {
		cfg.WakeupConcurrency = 16
	}
	if cfg.ReleaseTimeout <= 0 {
		cfg.ReleaseTimeout = min(10*time.Second, cfg.DrainTimeout/2)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = new(metrics.Counters)
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	m := &Manager{
		cfg:       cfg,
		fence:     FenceAfter(cfg.Lease, cfg.RenewDeadline, cfg.SkewMargin),
		conns:     map[string]*owned{},
		acquiring: map[string]bool{},
		started:   time.Now(),
	}
	m.base, m.cancelBase = context.WithCancelCause(context.Background())
	if cfg.Member != nil {
		mem, err := newMembership(m, cfg.Member)
		if err != nil {
			return nil, err
		}
		m.mem = mem
	}
	if cfg.Handoff != nil {
		if m.mem == nil {
			return nil, errors.New("owner config: planned handoffs need stream mode (membership)")
		}
		ho, err := newHandoffs(cfg.Handoff)
		if err != nil {
			return nil, err
		}
		m.ho = ho
	}
	return m, nil
}

// FenceAfter is how long after the start of a successful renew (or acquire) a lease
// may go unrenewed before its connection must stop: the renew deadline, and never
// later than the lease less the skew margin.
func FenceAfter(leaseDur, renewDeadline, margin time.Duration) time.Duration {
	return min(renewDeadline, leaseDur-margin)
}

// Owned returns the ids this worker holds now.
func (m *Manager) Owned() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	ids := make([]string, 0, len(m.conns))
	for id := range m.conns {
		ids = append(ids, id)
	}
	return ids
}

// Load is how many connections this worker holds, is acquiring or stands by for in
// a handoff: the figure its registry item and its wakeup replies carry.
func (m *Manager) Load() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.loadLocked()
}

// Draining reports whether the worker is draining (it refuses wakeups).
func (m *Manager) Draining() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.draining
}

// Healthy returns an error when the renew loop has stalled: no round began within
// three intervals plus the time one round may take.
func (m *Manager) Healthy() error {
	if !m.running.Load() {
		return nil // starting up, or drained
	}
	since := time.Since(m.started) - time.Duration(m.lastRound.Load())
	if limit := 3*m.cfg.RenewInterval + m.cfg.RenewDeadline; since > limit {
		return fmt.Errorf("renew loop stalled: last round began %s ago (limit %s)", since.Round(time.Millisecond), limit)
	}
	return nil
}

// Run registers the worker, renews every interval until ctx is cancelled, then
// drains: it marks the worker draining, hands connections off to live workers (if
// handoffs are on), stops every other connection, releases each lease with its
// final checkpoint, and deletes the registry item, all within DrainTimeout.
// It returns after every goroutine it started has exited.
func (m *Manager) Run(ctx context.Context) error {
	if m.mem != nil {
		return m.mem.run(ctx)
	}
	m.lastRound.Store(int64(time.Since(m.started)))
	m.running.Store(true)
	m.refreshRegistry(ctx)
	var startup sync.WaitGroup
	defer startup.Wait()
	if m.cfg.Candidates != nil {
		// Concurrent with the loop: leases taken early in a long pass must be renewed.
		startup.Go(func() { m.startup(ctx) })
	}
	if m.cfg.Orphans != nil && m.cfg.PollInterval > 0 {
		startup.Go(func() { m.pollOrphans(ctx) })
	}
	t := time.NewTicker(m.cfg.RenewInterval)
	defer t.Stop()
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-t.C:
			m.tick(ctx)
		}
	}
	startup.Wait() // acquisitions after this point would miss the drain
	return m.drain()
}

// tick is one renew round plus the registry refresh and the owned-count metric.
func (m *Manager) tick(ctx context.Context) {
	m.lastRound.Store(int64(time.Since(m.started)))
	if m.cfg.DesiredState != nil {
		m.readDesiredStates(ctx)
	}
	m.renewAll(ctx)
	m.refreshRegistry(ctx)
	m.cfg.EMF.Put(schema.MetricOwned, m.cfg.Metrics.Owned.Load())
}

// renewAll renews every owned lease, RenewConcurrency at a time. A lease whose
// previous renew is still in flight is skipped this round.
func (m *Manager) renewAll(ctx context.Context) {
	m.mu.Lock()
	list := make([]*owned, 0, len(m.conns))
	for _, o := range m.conns {
		list = append(list, o)
	}
	m.mu.Unlock()
	// Oldest first: when the table is slow and a round outlasts the interval, the
	// leases nearest their fence deadline go first.
	slices.SortFunc(list, func(a, b *owned) int { return cmp.Compare(a.renewedAt.Load(), b.renewedAt.Load()) })
	sem := make(chan struct{}, m.cfg.RenewConcurrency)
	var wg sync.WaitGroup
	for _, o := range list {
		if !o.renewMu.TryLock() {
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			o.renewMu.Unlock()
			wg.Wait()
			return
		}
		wg.Go(func() {
			defer func() { <-sem }()
			defer o.renewMu.Unlock()
			m.renew(ctx, o)
		})
	}
	wg.Wait()
}

// renew renews o once (with o.renewMu held) and acts on the returned item. It
// returns the store's error.
func (m *Manager) renew(ctx context.Context, o *owned) error {
	if o.ctx.Err() != nil {
		return nil // stopping; its session releases it
	}
	if !m.beforeFence(o) {
		// Past the fence deadline (resumed after a stall, before the fence timer ran):
		// never extend such a lease, even if the write would succeed — a stale image
		// written back by an operator can make an old owner-and-version match again.
		// The fence timer, due now, stops it.
		return nil
	}
	start := time.Now()
	rctx, cancel := context.WithTimeout(ctx, m.cfg.RenewInterval)
	defer cancel()
	p := progress(o)
	st := o.s.Status()
	if st != o.written {
		p.Status, p.Error = st.State, st.Error
	}
	var c codec.Connection
	var err error
	if m.mem != nil {
		c, err = m.mem.store.Checkpoint(rctx, o.lease, p)
	} else {
		c, err = m.cfg.Store.Renew(rctx, o.lease, p)
	}
	switch {
	case err == nil && m.mem != nil:
		o.written, o.writtenSeq, o.checkpointAt = st, p.LastSeq, int64(start.Sub(m.started))
		m.cfg.Metrics.Checkpoints.Add(1)
		m.act(o, c)
	case err == nil:
		o.written = st
		o.renewedAt.Store(int64(start.Sub(m.started)))
		o.timer.Reset(time.Until(start.Add(m.fence))) // no effect once fenced: the context stays cancelled
		m.act(o, c)
	case errors.Is(err, lease.ErrLost):
		if o.ctx.Err() == nil { // else: our own release won the race with this renew
			m.cfg.Metrics.LeasesLost.Add(1)
			m.cfg.Log.Warn("lease lost; stopping", "conn", o.lease.ID, "err", err)
		}
		o.cancel(errLost)
	case errors.Is(err, lease.ErrNotFound):
		m.cfg.Log.Info("connection deleted; stopping", "conn", o.lease.ID)
		o.cancel(errDeleted)
	default:
		m.cfg.Metrics.RenewFailures.Add(1)
		m.cfg.EMF.Put(schema.MetricRenewFailures, 1)
		m.cfg.Log.Warn("renew failed", "conn", o.lease.ID, "err", err)
	}
	if err == nil {
		m.cfg.Log.Debug("renewed", "conn", o.lease.ID, "last_seq", p.LastSeq)
	}
	return err
}

// act applies what a renew returned: stop, or follow a new URL.
func (m *Manager) act(o *owned, c codec.Connection) {
	switch {
	case c.DesiredState != schema.Started:
		if _, err := schema.ParseState(string(c.DesiredState)); err != nil {
			// An operator's unknown value (a lowercase "started"): stop, and say which
			// value on the item, not a plain "stopped".
			m.cfg.Log.Warn("desired_state unusable; stopping", "conn", o.lease.ID, "err", err)
			o.cancel(unusable(err))
			return
		}
		m.cfg.Log.Info("desired_state changed; stopping", "conn", o.lease.ID, "desired_state", c.DesiredState)
		o.cancel(errStopped)
	case schema.ValidateURL(c.WSURL) != nil:
		err := schema.ValidateURL(c.WSURL)
		m.cfg.Log.Warn("ws_url unusable; stopping", "conn", o.lease.ID, "err", err)
		o.cancel(unusable(err))
	case c.SpecErr != nil:
		m.cfg.Log.Warn("spec unusable; stopping", "conn", o.lease.ID, "err", c.SpecErr)
		o.cancel(unusable(c.SpecErr))
	case !reflect.DeepEqual(c.Spec, o.lease.Spec):
		m.cfg.Log.Info("spec changed; releasing to restart with it", "conn", o.lease.ID)
		o.cancel(errSpecChanged)
	case c.WSURL != o.s.URL():
		m.cfg.Log.Info("ws_url changed; reconnecting", "conn", o.lease.ID)
		o.s.SetURL(c.WSURL)
	}
}

// unusableError is errInvalid with the problem an operator made, naming the field and
// the value; the release writes its message as status_error.
type unusableError struct{ problem error }

func (e unusableError) Error() string { return "item unusable: " + e.problem.Error() }

func (e unusableError) Is(target error) bool {
	return target == errInvalid || target == stream.ErrGraceful
}

func unusable(problem error) error { return unusableError{problem: problem} }

// fenced is the self-fence timer's action: it only cancels the connection's context;
// the connection's session goroutine does the rest.
func (m *Manager) fenced(o *owned) {
	if o.ctx.Err() != nil {
		return
	}
	m.cfg.Metrics.SelfFences.Add(1)
	m.cfg.EMF.Put(schema.MetricSelfFences, 1)
	m.cfg.Log.Error("lease not renewed in time; self-fencing", "conn", o.lease.ID, "after", m.fence)
	o.cancel(errFenced)
}

// beforeFence reports whether o is still ours to deliver: its lease is before its
// fence deadline, read on the monotonic clock now rather than trusting the fence
// timer to have fired, and it was not cancelled, or cancelled gracefully (a stop or
// drain, whose flush must still run). A lost, deleted or fenced lease is not ours.
// This is the one definition the stream's sink-write guard and the graceful flush
// share; SinkWindow says how long a write that passed it may still take.
func (m *Manager) beforeFence(o *owned) bool {
	if o.ctx.Err() != nil && !errors.Is(context.Cause(o.ctx), stream.ErrGraceful) {
		return false
	}
	if m.mem != nil {
		return m.mem.valid() // the membership lease covers every connection
	}
	return time.Since(m.started) < time.Duration(o.renewedAt.Load())+m.fence
}

// SinkWindow is the longest a sink write may take when it passed the fence guard
// just before the fence deadline: from the fence deadline to the earliest moment
// another worker may acquire (the lease less the skew margin, counted from the same
// renew start). The sink timeout must not exceed it, or a write could land after
// another worker took the connection over.
func SinkWindow(leaseDur, renewDeadline, margin time.Duration) time.Duration {
	return leaseDur - margin - FenceAfter(leaseDur, renewDeadline, margin)
}

// start begins streaming l, whose acquire began at t0. Call with m.mu held.
func (m *Manager) start(l lease.Lease, t0 time.Time) {
	ctx, cancel := context.WithCancelCause(m.base)
	o := &owned{lease: l, ctx: ctx, cancel: cancel, done: make(chan struct{})}
	o.renewedAt.Store(int64(t0.Sub(m.started)))
	o.s = m.cfg.NewStream(l, func() bool { return m.beforeFence(o) })
	o.written = o.s.Status()
	o.writtenSeq, o.checkpointAt = l.LastSeq, int64(t0.Sub(m.started))
	if m.mem == nil { // in membership mode one timer fences every connection
		o.timer = time.AfterFunc(time.Until(t0.Add(m.fence)), func() { m.fenced(o) })
	}
	m.conns[l.ID] = o
	m.cfg.Metrics.Owned.Store(int64(len(m.conns)))
	m.wg.Go(func() { m.session(o) })
}

// session runs o's stream until its context is cancelled, then gives the lease back
// unless it is no longer ours.
func (m *Manager) session(o *owned) {
	defer close(o.done)
	o.s.Run(o.ctx)
	m.finish(o)
}

// finish ends o's session after its stream returned: it gives the lease back, hands
// it over (a planned handoff) or leaves it, by the cause.
func (m *Manager) finish(o *owned) {
	if sq, ok := o.s.(sequenced); ok && o.ctx.Err() == nil && sq.Halted() != nil {
		if o.timer != nil {
			o.timer.Stop()
		}
		o.cancel(fmt.Errorf("%w: %w", errHalted, sq.Halted()))
	}
	if o.timer != nil && o.timer.Stop() && o.ctx.Err() == nil {
		m.fenced(o) // the stream saw the fence deadline pass before the timer fired
	}
	if m.mem != nil && o.ctx.Err() == nil {
		m.fenced(o) // the stream saw the membership fence deadline pass first
	}
	cause := context.Cause(o.ctx)
	m.mu.Lock()
	delete(m.conns, o.lease.ID)
	if m.ho != nil {
		m.ho.ended[o.lease.ID] = max(m.ho.ended[o.lease.ID], o.lease.Version)
	}
	m.cfg.Metrics.Owned.Store(int64(len(m.conns)))
	m.mu.Unlock()
	if errors.Is(cause, errLost) || errors.Is(cause, errDeleted) {
		return
	}
	p := progress(o) // draining: the store's default "released"
	switch {
	case errors.Is(cause, errHandingOff):
		if o.cut.CompareAndSwap(false, true) { // not cut by the stream before its close
			m.cutOver(o, p)
		}
		return
	case errors.Is(cause, errHandoffFallback):
		p.Error = "handoff: " + *o.fallback.Load() + "; released for the next owner (release-then-acquire)"
	case errors.Is(cause, errHalted):
		p.Status, p.Error, p.Stop = schema.StatusSeqReset, cause.Error(), true
	case cause == errSpecChanged:
		p.Status = "restarting"
	case errors.Is(cause, errStopped):
		p.Status = "stopped"
	case errors.Is(cause, errInvalid):
		p.Status, p.Error = "invalid", cause.Error()
		if u, ok := cause.(unusableError); ok {
			p.Error = u.problem.Error() // as the reconciler and the sweep word it, so they need not rewrite it
		}
	case errors.Is(cause, errFenced):
		p.Status, p.Error = "fenced", cause.Error()
	case errors.Is(cause, errExpelled):
		p.Status, p.Error = "expelled", cause.Error()
	}
	m.release(o.lease, p)
}

// release writes l's release on a fresh, bounded context: the cancelled one that
// brought us here must not cut the last write short.
func (m *Manager) release(l lease.Lease, p lease.Progress) {
	ctx, cancel := context.WithTimeout(context.Background(), m.cfg.ReleaseTimeout)
	defer cancel()
	if err := m.cfg.Store.Release(ctx, l, p); err != nil {
		if m.mem != nil && retryable(err) {
			m.mem.retryLater(l, p)
		}
		m.cfg.Log.Warn("release failed; retried after the next membership renew, else released by the reconciler",
			"conn", l.ID, "last_seq", p.LastSeq, "err", err)
		return
	}
	m.cfg.Metrics.Releases.Add(1)
	m.cfg.Log.Info("released", "conn", l.ID, "last_seq", p.LastSeq, "status", p.Status)
}

// drain stops everything and leaves: see Run.
func (m *Manager) drain() error {
	// Refuse wakeups first, then tell the reconciler: a wakeup taken in between would
	// only be released again at once.
	m.mu.Lock()
	m.draining = true
	list := make([]*owned, 0, len(m.conns))
	for _, o := range m.conns {
		list = append(list, o)
	}
	m.mu.Unlock()
	deadline := time.Now().Add(m.cfg.DrainTimeout)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	// Bounded well inside the drain: an unreachable table must not eat the time the
	// connections need to stop.
	rctx, rcancel := context.WithTimeout(ctx, min(5*time.Second, m.cfg.DrainTimeout/4))
	switch {
	case m.mem == nil:
		m.putRegistry(rctx, true)
	case !m.mem.expelled.Load():
		m.mem.renew(rctx) // draining = true, at once rather than at the next tick
	}
	rcancel()
	if m.ho != nil && !m.mem.expelled.Load() {
		m.dropStandbys()
		// Hand off first, make-before-break, leaving time for the releases of what
		// could not be handed off.
		stopBy := deadline.Add(-m.cfg.ReleaseTimeout - m.cfg.SkewMargin)
		m.cfg.Log.Info("draining by handoff", "connections", len(list), "timeout", m.cfg.DrainTimeout)
		hctx, hcancel := context.WithTimeout(ctx, min(5*time.Second, m.cfg.DrainTimeout/4))
		m.drainByHandoff(hctx, list, stopBy)
		hcancel()
	}
	m.cfg.Log.Info("draining", "connections", len(list), "timeout", m.cfg.DrainTimeout)
	for _, o := range list {
		o.cancel(errDraining)
	}
	done := make(chan struct{})
	go func() { m.wg.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = fmt.Errorf("drain: connections still stopping after %s", m.cfg.DrainTimeout)
		m.cfg.Log.Error("drain timeout; waiting for the bounded sink and release writes", "err", err)
		<-done // each session's remaining writes are bounded by their own timeouts
	}
	m.cancelBase(errDraining)
	m.running.Store(false)
	dctx, dcancel := context.WithTimeout(context.Background(), max(time.Until(deadline), 2*time.Second))
	defer dcancel()
	if m.mem != nil {
		return m.mem.leave(dctx, err)
	}
	if derr := m.cfg.Registry.Delete(dctx, m.cfg.WorkerID); derr != nil {
		m.cfg.Metrics.RegistryErrors.Add(1)
		err = errors.Join(err, derr)
	}
	m.cfg.Log.Info("drained", "err", err)
	return err
}

func (m *Manager) refreshRegistry(ctx context.Context) {
	m.mu.Lock()
	draining := m.draining
	m.mu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, m.cfg.RenewInterval)
	defer cancel()
	m.putRegistry(rctx, draining)
}

func (m *Manager) putRegistry(ctx context.Context, draining bool) {
	load := m.Load()
	w := codec.Worker{
		ID: m.cfg.WorkerID, Addr: m.cfg.Addr, Capacity: m.cfg.MaxConnections, Load: load,
		Draining: draining, HeartbeatExpiresAtMs: time.Now().Add(m.cfg.Lease).UnixMilli(),
	}
	if err := m.cfg.Registry.Put(ctx, w); err != nil {
		m.cfg.Metrics.RegistryErrors.Add(1)
		m.cfg.Log.Warn("registry refresh failed", "err", err)
	}
}

// loadLocked is how many connections this worker holds, is taking, or stands by
// for. Call with m.mu held.
func (m *Manager) loadLocked() int {
	n := len(m.conns) + len(m.acquiring)
	if m.ho != nil {
		n += len(m.ho.standby)
	}
	return n
}

// Acquire tries to take connection id and start streaming it.
func (m *Manager) Acquire(ctx context.Context, id string) (wakeup.Result, string) {
	m.mu.Lock()
	switch {
	case m.draining:
		m.mu.Unlock()
		return wakeup.Draining, ""
	case m.conns[id] != nil || m.acquiring[id]:
		m.mu.Unlock()
		return wakeup.AlreadyOwned, ""
	case m.ho != nil && m.ho.standby[id] != nil:
		m.mu.Unlock()
		return wakeup.AlreadyOwned, "standing by for a handoff to this worker"
	case m.loadLocked() >= m.cfg.MaxConnections:
		m.mu.Unlock()
		return wakeup.NoCapacity, ""
	case m.mem != nil && !m.mem.valid():
		m.mu.Unlock()
		return wakeup.Failed, "membership lease not renewed in time"
	}
	m.acquiring[id] = true
	m.mu.Unlock()

	t0 := time.Now()
	l, err := m.cfg.Store.Acquire(ctx, id, m.cfg.WorkerID)

	m.mu.Lock()
	delete(m.acquiring, id)
	if err == nil && m.draining {
		m.mu.Unlock()
		m.release(l, lease.Progress{LastSeq: l.LastSeq})
		return wakeup.Draining, ""
	}
	if err == nil && m.mem != nil && !m.mem.valid() {
		// The membership fence passed while the acquire was in flight: the fence has
		// already stopped everything else, so give this one back too.
		m.mu.Unlock()
		m.release(l, lease.Progress{LastSeq: l.LastSeq, Status: "fenced", Error: errFenced.Error()})
		return wakeup.Failed, "membership lease not renewed in time"
	}
	if err == nil {
		m.start(l, t0)
	}
	m.mu.Unlock()
	switch {
	case err == nil:
		m.cfg.Metrics.Acquisitions.Add(1)
		m.cfg.Log.Info("acquired", "conn", id, "version", l.Version, "last_seq", l.LastSeq)
		return wakeup.Acquired, ""
	case errors.Is(err, lease.ErrHeld):
		m.cfg.Metrics.LostRaces.Add(1)
		return wakeup.LostRace, err.Error()
	case errors.Is(err, lease.ErrNotStarted), errors.Is(err, lease.ErrNotFound), errors.Is(err, lease.ErrInvalid):
		return wakeup.NotStartable, err.Error()
	default:
		m.cfg.Log.Warn("acquire failed", "conn", id, "err", err)
		return wakeup.Failed, err.Error()
	}
}

// Check re-reads an owned connection by renewing it now, and acts on the result.
func (m *Manager) check(ctx context.Context, o *owned) (wakeup.Result, string) {
	o.renewMu.Lock()
	err := m.renew(ctx, o)
	o.renewMu.Unlock()
	if err != nil && !errors.Is(err, lease.ErrLost) && !errors.Is(err, lease.ErrNotFound) {
		return wakeup.Failed, err.Error()
	}
	switch cause := context.Cause(o.ctx); {
	case o.ctx.Err() == nil:
		return wakeup.AlreadyOwned, ""
	case errors.Is(cause, errLost):
		return wakeup.LostRace, cause.Error()
	default:
		return wakeup.NotStartable, cause.Error()
	}
}

// Wake answers a wakeup: for each id, acquire it (NeedsOwner) or re-check it (Check).
// Ids are handled WakeupConcurrency at a time; results keep the request's order.
func (m *Manager) Wake(ctx context.Context, conns []wakeup.Conn) []wakeup.ConnResult {
	out := make([]wakeup.ConnResult, len(conns))
	sem := make(chan struct{}, m.cfg.WakeupConcurrency)
	// One registry read per wakeup, for all its handoffs.
	targets := sync.OnceValues(func() ([]codec.Worker, error) { return m.targets(ctx) })
	var wg sync.WaitGroup
	for i, c := range conns {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			r, detail := m.wakeOne(ctx, c, targets)
			out[i] = wakeup.ConnResult{ID: c.ID, Result: r, Detail: detail}
		})
	}
	wg.Wait()
	return out
}

func (m *Manager) wakeOne(ctx context.Context, c wakeup.Conn, targets func() ([]codec.Worker, error)) (wakeup.Result, string) {
	m.mu.Lock()
	o, draining := m.conns[c.ID], m.draining
	m.mu.Unlock()
	switch {
	case draining:
		return wakeup.Draining, ""
	case c.Reason == wakeup.Handoff:
		return m.wakeHandoff(ctx, o, c, targets)
	case o == nil && m.ho != nil && c.Reason == wakeup.Check:
		// The table may name this worker after a handoff whose commit never came.
		if r, detail, ok := m.adoptNamed(ctx, c.ID); ok {
			return r, detail
		}
	}
	switch {
	case o != nil && c.Reason == wakeup.Check:
		return m.check(ctx, o)
	case o != nil:
		// Someone thinks it needs an owner while we believe we hold it. Memory is not
		// enough: a console write may have released it at our version, or it may have
		// been deleted and re-created. Ask the table with a conditional owner write.
		r, detail := m.check(ctx, o)
		if r != wakeup.LostRace {
			return r, detail
		}
		// Not ours any more: once our session has stopped, try to take it again.
		select {
		case <-o.done:
		case <-ctx.Done():
			return wakeup.Failed, "stopping the lost session: " + ctx.Err().Error()
		}
		return m.Acquire(ctx, c.ID)
	case c.Reason == wakeup.Check:
		return wakeup.LostRace, "not held by this worker"
	}
	r, detail := m.Acquire(ctx, c.ID)
	if r == wakeup.LostRace && m.ho != nil {
		if r2, d2, ok := m.adoptNamed(ctx, c.ID); ok {
			return r2, d2
		}
	}
	return r, detail
}
