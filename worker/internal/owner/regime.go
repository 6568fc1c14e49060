package owner

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sockfleet/sockfleet/shared/lease"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/shared/tracing"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// regime is how this worker keeps the right to deliver what it holds, and how it
// writes as an owner: polling mode (pollingMode, one lease renewed per connection)
// or stream mode (streamMode, one membership lease per worker). The loop below, the
// acquisitions and the sessions call only this; neither regime knows the other.
type regime interface {
	// join makes the worker able to own connections; nothing is acquired before it
	// returns nil.
	join(ctx context.Context) error
	// keep runs the regime's loops and returns when ctx ends (nil) or the right to
	// own anything is lost for good (why). Loops a drain still needs (the
	// membership's renew) go on until leave.
	keep(ctx context.Context) error
	// valid reports whether o's lease (nil: one about to be acquired) is before its
	// fence deadline now, on the monotonic clock.
	valid(o *owned) bool
	// fence arms o's self-fence, which calls m.fenced(o) (or stops o for good) when
	// the deadline passes; the func returned disarms it and reports whether it had
	// not fired yet.
	fence(o *owned) (disarm func() bool)
	// checkpoint is the owner's periodic write of o (a renew of its lease in polling
	// mode, a checkpoint in stream mode), carrying p and returning the item.
	checkpoint(ctx context.Context, o *owned, p lease.Progress) (codec.Connection, error)
	// release gives l back with its final progress p.
	release(ctx context.Context, l lease.Lease, p lease.Progress) error
	// advertise writes this worker's registry entry now (a drain's, with draining set).
	advertise(ctx context.Context)
	// leave ends the drain once every session ended; err is the drain's own.
	leave(ctx context.Context, err error) error
	// lastRound is when the regime's keep loop last began a round, for Healthy.
	lastRound() time.Time
}

// Healthy returns an error when the renew loop has stalled: no round began within
// three intervals plus the time one round may take.
func (m *Manager) Healthy() error {
	if !m.running.Load() {
		return nil // starting up, or drained
	}
	since := time.Since(m.rg.lastRound())
	if limit := 3*m.cfg.RenewInterval + m.cfg.RenewDeadline; since > limit {
		return fmt.Errorf("renew loop stalled: last round began %s ago (limit %s)", since.Round(time.Millisecond), limit)
	}
	return nil
}

// Joined reports whether Run has joined (the membership in stream mode, the
// registry in polling mode) and the worker was not expelled since: whether it can
// take connections.
func (m *Manager) Joined() bool { return m.joined.Load() }

// Run joins, keeps what this worker owns until ctx is cancelled, then drains: it
// marks the worker draining, hands connections off to live workers (if handoffs are
// on), stops every other connection, releases each lease with its final checkpoint,
// and leaves the registry, all within DrainTimeout.
// It returns after every goroutine it started has exited.
func (m *Manager) Run(ctx context.Context) error {
	m.running.Store(true)
	defer m.running.Store(false)
	if err := m.rg.join(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // stopped before joining: nothing to drain
		}
		return err
	}
	m.joined.Store(true)
	var startup sync.WaitGroup
	if m.cfg.Candidates != nil {
		// Concurrent with the loop: leases taken early in a long pass must be kept.
		startup.Go(func() { m.startup(ctx) })
	}
	if lost := m.rg.keep(ctx); lost != nil {
		m.joined.Store(false)
		m.cancelBase(errExpelled) // standbys too
	}
	startup.Wait() // acquisitions after this point would miss the drain
	return m.drain()
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
	// The root of the drain's trace (the SIGTERM): its handoffs and releases are children.
	ctx, span := tracer.Start(ctx, "worker.drain", trace.WithAttributes(tracing.Worker(m.cfg.WorkerID),
		tracing.Cause("drain"), attribute.Int("sockfleet.connections", len(list))))
	defer span.End()
	// Bounded well inside the drain: an unreachable table must not eat the time the
	// connections need to stop.
	rctx, rcancel := context.WithTimeout(ctx, min(5*time.Second, m.cfg.DrainTimeout/4))
	m.rg.advertise(rctx) // draining = true, at once rather than at the next tick
	rcancel()
	if m.ho != nil && m.joined.Load() { // not expelled
		m.dropStandbys()
		// Hand off first, make-before-break, leaving time for the releases of what
		// could not be handed off.
		stopBy := deadline.Add(-m.cfg.ReleaseTimeout - m.cfg.SkewMargin)
		m.cfg.Log.InfoContext(ctx, "draining by handoff", "connections", len(list), "timeout", m.cfg.DrainTimeout)
		hctx, hcancel := context.WithTimeout(ctx, min(5*time.Second, m.cfg.DrainTimeout/4))
		m.drainByHandoff(hctx, list, stopBy)
		hcancel()
	}
	m.cfg.Log.Info("draining", "connections", len(list), "timeout", m.cfg.DrainTimeout)
	for _, o := range list {
		o.stopIn(ctx)
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
	err = m.rg.leave(dctx, err)
	m.cfg.Log.Info("drained", "err", err)
	return err
}
