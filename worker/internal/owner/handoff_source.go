package owner

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/sockfleet/sockfleet/shared/lease"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/shared/tracing"
	"github.com/sockfleet/sockfleet/shared/wakeup"
	"github.com/sockfleet/sockfleet/worker/internal/peer"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// The source's side of a planned handoff (A in docs/HANDOFF.md): pick a target (a
// handoff wakeup, or a drain), ask it to prepare, stop delivering, transfer the
// lease in one conditional write, and tell the target to commit; fall back to a
// release whenever that cannot be done.

// handOff moves o to target (A's side), or releases it when that cannot be
// prepared. prepareBy, if not zero, cuts the prepare short. It returns whether the
// lease was transferred, and blocks until o's session has ended either way. cause is
// the span of what asked for it (the rebalance wakeup's handling, or worker.drain):
// the prepare call, the transfer (handoff.cut) and a fallback are its children.
func (m *Manager) handOff(cause trace.SpanContext, o *owned, target codec.Worker, prepareBy time.Time) bool {
	id := o.lease.ID
	p := progress(o)
	tctx := trace.ContextWithSpanContext(context.Background(), cause)
	fallback := func(why string) bool {
		m.cfg.Metrics.HandoffFallbacks.Add(1)
		fctx, span := tracer.Start(tctx, "handoff.fallback_release", leaseAttrs(o.lease), trace.WithAttributes(
			tracing.Worker(m.cfg.WorkerID), tracing.Fallback(true), tracing.Phase("fallback"),
			attribute.String("sockfleet.handoff.to", target.ID), attribute.String("sockfleet.handoff.why", why)))
		defer span.End()
		m.cfg.Log.InfoContext(fctx, "handoff not possible; releasing", "conn", id, "to", target.ID, "why", why)
		o.fallback.Store(&why)
		o.stopIn(fctx) // the release is this span's child
		o.cancel(errHandoffFallback)
		<-o.done
		return false
	}
	if err := m.ho.cfg.Resumable(o.lease); err != nil {
		return fallback(fmt.Sprintf("to %s: %v", target.ID, err))
	}
	if p.LastSeq == 0 && p.Epoch == 0 {
		return fallback(fmt.Sprintf("to %s: nothing delivered yet, no resume point", target.ID))
	}
	req := peer.Request{Op: peer.Prepare, Conn: id, From: m.cfg.WorkerID, To: target.ID,
		Version: o.lease.Version, Seq: p.LastSeq, Epoch: p.Epoch}
	by := time.Now().Add(m.ho.cfg.PrepareTimeout)
	if !prepareBy.IsZero() && prepareBy.Before(by) {
		by = prepareBy
	}
	// The prepare call carries cause's trace context: the target's handoff.prepare
	// is its child.
	pctx, cancel := context.WithDeadline(trace.ContextWithSpanContext(o.ctx, cause), by)
	resp, err := m.ho.cfg.Peer.Send(pctx, target.Addr, req)
	cancel()
	if err != nil || resp.Result != peer.Ready {
		if err != nil {
			// Release first: the target did not answer, and may not answer an abort
			// either (its standby, if any, ends at its own timeout).
			defer m.abortPeer(target, req)
			return fallback(fmt.Sprintf("prepare at %s: %v", target.ID, err))
		}
		return fallback(fmt.Sprintf("prepare refused by %s: %s", target.ID, resp.Detail))
	}
	// Wait for a cut-over slot while still delivering; the standby holds what it
	// reads meanwhile.
	var free func()
	select {
	case m.ho.cuts <- struct{}{}:
		free = sync.OnceFunc(func() { <-m.ho.cuts })
		defer free()
	case <-o.ctx.Done():
		<-o.done
		m.abortPeer(target, req) // stopped for another reason first; its session said so
		return false
	}
	o.target.Store(&target)
	o.stopAt.Store(time.Now().UnixNano())
	o.stopIn(tctx) // the transfer (handoff.cut) is cause's child
	o.cancel(handoffCut{m: m, o: o, free: free})
	<-o.done
	if !errors.Is(context.Cause(o.ctx), errHandingOff) {
		m.abortPeer(target, req) // stopped for another reason first; its session said so
		return false
	}
	return o.transferred.Load()
}

// handoffCut is the cause that stops a stream being handed off: the stream calls Cut
// after its last delivery and before its close handshake (stream.Cutter), so the
// transfer does not wait for the old socket's round trip to the upstream. If the
// stream ends without calling it (it was between sockets), finish cuts over instead.
type handoffCut struct {
	m    *Manager
	o    *owned
	free func() // gives the cut-over slot back (the close handshake needs none)
}

func (c handoffCut) Error() string { return errHandingOff.Error() }
func (c handoffCut) Unwrap() error { return errHandingOff }
func (c handoffCut) Cut() {
	if c.o.cut.CompareAndSwap(false, true) {
		c.m.cutOver(c.o, progress(c.o))
	}
	c.free()
}

// cutOver is the end of a session handed off (steps 2 and 3): the stream has
// delivered its last message, p.LastSeq. Transfer the lease, then commit at the
// target; fall back to a release when the transfer is refused.
func (m *Manager) cutOver(o *owned, p lease.Progress) {
	t := o.target.Load()
	ctx, cancel := context.WithTimeout(stopContext(o), m.cfg.ReleaseTimeout)
	defer cancel()
	// The transfer write carries this span as trace_parent; the commit call carries it
	// to the target, whose handoff.commit is its child.
	ctx, span := tracer.Start(ctx, "handoff.cut", leaseAttrs(o.lease), trace.WithLinks(sessionLink(o)), trace.WithAttributes(
		tracing.Worker(m.cfg.WorkerID), tracing.Phase("cut"), attribute.String("sockfleet.handoff.to", t.ID),
		attribute.Int64("sockfleet.last_seq", p.LastSeq)))
	defer span.End()
	cut := time.Now()
	nl, err := m.ho.cfg.Store.Transfer(ctx, o.lease, t.ID, p, o.rebalance.Load())
	if err != nil {
		span.RecordError(err)
	} else {
		span.SetAttributes(attribute.Int64("sockfleet.handoff.new_version", nl.Version))
	}
	req := peer.Request{Conn: o.lease.ID, From: m.cfg.WorkerID, To: t.ID, Version: o.lease.Version}
	switch {
	case err == nil:
		o.transferred.Store(true)
		m.cfg.Metrics.Handoffs.Add(1)
		written := time.Now()
		m.commitPeer(ctx, *t, nl, p)
		// The new owner's wait, in its parts: the stream's end (its last delivery),
		// the transfer write, the commit call (the target delivers what it held).
		m.cfg.Log.InfoContext(ctx, "handed off", "conn", o.lease.ID, "to", t.ID, "version", nl.Version, "last_seq", p.LastSeq,
			"stop_ms", ms(cut.Sub(time.Unix(0, o.stopAt.Load()))), "transfer_ms", ms(written.Sub(cut)), "commit_ms", ms(time.Since(written)))
	case errors.Is(err, lease.ErrNotStarted):
		m.abortPeer(*t, req)
		p.Status = "stopped"
		m.release(ctx, o.lease, p)
	case errors.Is(err, lease.ErrLost), errors.Is(err, lease.ErrNotFound):
		m.abortPeer(*t, req)
		m.cfg.Log.Warn("handoff: lease lost before the transfer", "conn", o.lease.ID, "err", err)
	default:
		// Outcome unknown. Never tell the target to deliver: it reads the item at its
		// standby timeout and adopts only a lease that names it. Release as for any
		// stop: refused (ErrLost) if the transfer did land.
		m.cfg.Metrics.HandoffFallbacks.Add(1)
		p.Error = fmt.Sprintf("handoff to %s: transfer outcome unknown (%v); released", t.ID, err)
		span.SetAttributes(tracing.Fallback(true))
		m.release(ctx, o.lease, p)
	}
}

// commitPeer tells the target it holds nl, a few times within a few seconds. If it
// never hears, its standby timeout finds the lease in the table.
func (m *Manager) commitPeer(parent context.Context, t codec.Worker, nl lease.Lease, p lease.Progress) {
	req := peer.Request{Op: peer.Commit, Conn: nl.ID, From: m.cfg.WorkerID, To: t.ID,
		Version: nl.Version, Seq: p.LastSeq, Epoch: p.Epoch}
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), 2*time.Second)
		var resp peer.Response
		resp, err = m.ho.cfg.Peer.Send(ctx, t.Addr, req)
		cancel()
		if err == nil && resp.Result == peer.Committed {
			return
		}
		if err == nil {
			m.cfg.Log.Warn("handoff commit refused; the target releases what it cannot run", "conn", nl.ID, "to", t.ID, "detail", resp.Detail)
			return
		}
	}
	m.cfg.Log.Warn("handoff commit not answered; the target adopts it from the table at its standby timeout",
		"conn", nl.ID, "to", t.ID, "err", err)
}

// abortPeer tells the target to drop its standby, once, best effort (a standby not
// committed ends at its timeout anyway).
func (m *Manager) abortPeer(t codec.Worker, req peer.Request) {
	req.Op = peer.Abort
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if _, err := m.ho.cfg.Peer.Send(ctx, t.Addr, req); err != nil {
		m.cfg.Log.Debug("handoff abort not answered", "conn", req.Conn, "to", t.ID, "err", err)
	}
}

// targets lists the workers that may take connections now: live members, not
// draining, not this one, with spare capacity.
func (m *Manager) targets(ctx context.Context) ([]codec.Worker, error) {
	ws, err := m.ho.cfg.Workers(ctx)
	if err != nil {
		return nil, err
	}
	now := m.ho.cfg.Now().UnixMilli()
	var out []codec.Worker
	for _, w := range ws {
		if w.ID != m.cfg.WorkerID && w.Live(now) && !w.Draining && w.Capacity > w.Load && w.Addr != "" {
			out = append(out, w)
		}
	}
	return out, nil
}

// wakeHandoff answers a handoff wakeup for o (nil: not held) to worker c.To.
func (m *Manager) wakeHandoff(ctx context.Context, o *owned, c wakeup.Conn, targets func() ([]codec.Worker, error)) (wakeup.Result, string) {
	switch {
	case o == nil:
		return wakeup.LostRace, "not held by this worker"
	case c.LeaseVersion != 0 && c.LeaseVersion != o.lease.Version:
		return wakeup.Stale, fmt.Sprintf("held at version %d, not %d", o.lease.Version, c.LeaseVersion)
	case m.ho == nil:
		return wakeup.TargetUnavailable, "planned handoffs are off on this worker"
	case c.To == m.cfg.WorkerID:
		return wakeup.TargetUnavailable, "the target is this worker"
	}
	ws, err := targets()
	if err != nil {
		return wakeup.Failed, "read the registry: " + err.Error()
	}
	i := -1
	for j, w := range ws {
		if w.ID == c.To {
			i = j
		}
	}
	if i < 0 {
		return wakeup.TargetUnavailable, c.To + " is not a live, non-draining worker with spare capacity"
	}
	if !o.handing.CompareAndSwap(false, true) {
		return wakeup.HandingOff, "already handing off"
	}
	o.rebalance.Store(true)
	t := ws[i]
	cause := trace.SpanContextFromContext(ctx) // the wakeup's handling: ends before the handoff does
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.draining { // checked under m.mu: a drain waits for every goroutine started before it
		return wakeup.Draining, ""
	}
	m.wg.Go(func() {
		select {
		case m.ho.sem <- struct{}{}:
		case <-o.ctx.Done():
			return
		}
		defer func() { <-m.ho.sem }()
		if o.ctx.Err() == nil {
			m.handOff(cause, o, t, time.Time{})
		}
	})
	return wakeup.HandingOff, ""
}

// drainByHandoff hands list to other workers, least loaded first and spread, before
// stopBy; what it does not hand off is left to the drain's release.
func (m *Manager) drainByHandoff(ctx context.Context, list []*owned, stopBy time.Time) {
	ws, err := m.targets(ctx)
	if err != nil || len(ws) == 0 {
		m.cfg.Log.Info("drain: no worker to hand connections to; releasing", "err", err)
		return
	}
	load := make([]float64, len(ws))
	given := make([]int, len(ws))
	for i, w := range ws {
		load[i] = float64(w.Load) / float64(w.Capacity)
	}
	// Oldest sessions first is as good as any order; keep the registry's for ties.
	sort.SliceStable(list, func(i, j int) bool { return list[i].lease.ID < list[j].lease.ID })
	sem := make(chan struct{}, m.ho.cfg.DrainConcurrency)
	var wg sync.WaitGroup
	var moved, fell int
	var mu sync.Mutex
	for _, o := range list {
		best := -1
		for i, w := range ws {
			if w.Load+given[i] < w.Capacity && (best < 0 || load[i] < load[best]) {
				best = i
			}
		}
		if best < 0 || time.Now().After(stopBy) {
			break
		}
		if o.ctx.Err() != nil || !o.handing.CompareAndSwap(false, true) {
			continue
		}
		given[best]++
		load[best] = float64(ws[best].Load+given[best]) / float64(ws[best].Capacity)
		sem <- struct{}{}
		t := ws[best]
		wg.Go(func() {
			defer func() { <-sem }()
			ok := m.handOff(trace.SpanContextFromContext(ctx), o, t, stopBy)
			mu.Lock()
			if ok {
				moved++
			} else {
				fell++
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	m.cfg.Log.Info("drain: handoffs done", "handed_off", moved, "released", fell, "targets", len(ws))
}
