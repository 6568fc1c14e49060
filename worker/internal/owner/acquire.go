package owner

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/sockfleet/sockfleet/shared/lease"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/shared/tracing"
	"github.com/sockfleet/sockfleet/shared/wakeup"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// detailStandingBy is Acquire's detail for a connection this worker only stands by
// for (a handoff to it not yet committed).
const detailStandingBy = "standing by for a handoff to this worker, not its owner"

// Acquire tries to take connection id and start streaming it. Its lease.acquire span
// (a child of ctx's: the wakeup's, or none) is the parent of the session it starts.
func (m *Manager) Acquire(ctx context.Context, id string) (wakeup.Result, string) {
	return m.acquire(ctx, id, 0, 0)
}

// floorAcquirer is a store that can acquire above a version floor
// (lease.Store.AcquireAbove).
type floorAcquirer interface {
	AcquireAbove(ctx context.Context, id, worker string, floor int64) (lease.Lease, error)
}

// acquire is Acquire writing a version above floor (a needs-owner wakeup's
// lease_version: one the reconciler saw issued), when the store can; with
// unheldMs > 0 (stream mode's start-up pass), of a lease that carried the
// reconciler's unheld mark since then (lease.Store.AcquireUnheld).
func (m *Manager) acquire(ctx context.Context, id string, floor, unheldMs int64) (r wakeup.Result, detail string) {
	ctx, span := tracer.Start(ctx, "lease.acquire", trace.WithAttributes(tracing.Conn(id), tracing.Worker(m.cfg.WorkerID)))
	defer func() {
		span.SetAttributes(tracing.Result(string(r)))
		if detail != "" {
			span.SetAttributes(attribute.String("sockfleet.detail", detail))
		}
		span.End()
	}()
	m.mu.Lock()
	switch {
	case m.draining:
		m.mu.Unlock()
		return wakeup.Draining, ""
	case m.conns[id] != nil || m.acquiring[id]:
		m.mu.Unlock()
		return wakeup.AlreadyOwned, ""
	case m.ho != nil && m.ho.standby[id] != nil:
		// Not owned here: a standby may still end without a commit. An answer the
		// reconciler takes as final would leave the connection to the sweep; this
		// one it offers to the next worker (or retries, which finds the standby
		// committed, adopted or gone).
		m.mu.Unlock()
		return wakeup.Failed, detailStandingBy
	case m.loadLocked() >= m.cfg.MaxConnections:
		m.mu.Unlock()
		return wakeup.NoCapacity, ""
	case !m.rg.valid(nil):
		m.mu.Unlock()
		return wakeup.Failed, "membership lease not renewed in time"
	}
	m.acquiring[id] = true
	m.mu.Unlock()

	t0 := time.Now()
	var l lease.Lease
	var err error
	if fa, ok := m.cfg.Store.(floorAcquirer); ok && floor > 0 {
		l, err = fa.AcquireAbove(ctx, id, m.cfg.WorkerID, floor)
	} else if unheldMs > 0 {
		l, err = m.cfg.Member.Store.AcquireUnheld(ctx, id, m.cfg.WorkerID, unheldMs)
	} else {
		l, err = m.cfg.Store.Acquire(ctx, id, m.cfg.WorkerID)
	}
	if err == nil {
		span.SetAttributes(tracing.Version(l.Version))
	}

	m.mu.Lock()
	delete(m.acquiring, id)
	if err == nil && m.draining {
		m.mu.Unlock()
		m.release(ctx, l, lease.Progress{LastSeq: l.LastSeq})
		return wakeup.Draining, ""
	}
	if err == nil && !m.rg.valid(nil) {
		// The membership fence passed while the acquire was in flight (stream mode):
		// the fence has already stopped everything else, so give this one back too.
		m.mu.Unlock()
		m.release(ctx, l, lease.Progress{LastSeq: l.LastSeq, Status: "fenced", Error: errFenced.Error()})
		return wakeup.Failed, "membership lease not renewed in time"
	}
	if err == nil {
		m.start(ctx, l, t0)
	}
	m.mu.Unlock()
	switch {
	case err == nil:
		m.cfg.Metrics.Acquisitions.Add(1)
		m.cfg.Log.InfoContext(ctx, "acquired", "conn", id, "version", l.Version, "last_seq", l.LastSeq)
		return wakeup.Acquired, ""
	case errors.Is(err, lease.ErrHeld):
		m.cfg.Metrics.LostRaces.Add(1)
		return wakeup.LostRace, err.Error()
	case errors.Is(err, lease.ErrNotStarted), errors.Is(err, lease.ErrNotFound), errors.Is(err, lease.ErrInvalid):
		return wakeup.NotStartable, err.Error()
	default:
		var amb *lease.AmbiguousAcquire
		if errors.As(err, &amb) && m.cfg.Member != nil {
			// The table may name this worker now: find out once it answers again.
			m.mu.Lock()
			m.unresolved[id] = amb.StampMs
			m.mu.Unlock()
		}
		m.cfg.Log.WarnContext(ctx, "acquire failed", "conn", id, "err", err)
		return wakeup.Failed, err.Error()
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
		return m.acquire(ctx, c.ID, c.LeaseVersion, 0)
	case c.Reason == wakeup.Check:
		return wakeup.LostRace, "not held by this worker"
	}
	r, detail := m.acquire(ctx, c.ID, c.LeaseVersion, 0)
	if (r == wakeup.LostRace || detail == detailStandingBy) && m.ho != nil {
		if r2, d2, ok := m.adoptNamed(ctx, c.ID); ok {
			return r2, d2
		}
	}
	return r, detail
}
