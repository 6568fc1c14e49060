package owner

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sockfleet/sockfleet/shared/lease"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/tracing"
	"github.com/sockfleet/sockfleet/worker/internal/stream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// One connection's session: start, stream until the context is cancelled, then
// give the lease back, hand it over, or leave it, by the cause.

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

// unusableError is errInvalid with the problem an operator made, naming the field and
// the value; the release writes its message as status_error.
type unusableError struct{ problem error }

func (e unusableError) Error() string { return "item unusable: " + e.problem.Error() }

func (e unusableError) Is(target error) bool {
	return target == errInvalid || target == stream.ErrGraceful
}

func unusable(problem error) error { return unusableError{problem: problem} }

// start begins streaming l, whose acquire began at t0, its session span a child of
// parent's span. Call with m.mu held.
func (m *Manager) start(parent context.Context, l lease.Lease, t0 time.Time) {
	ctx, cancel := context.WithCancelCause(m.base)
	o := &owned{lease: l, ctx: ctx, cancel: cancel, done: make(chan struct{})}
	m.openSession(parent, o, false)
	o.writtenAt.Store(int64(t0.Sub(m.started)))
	o.s = m.cfg.NewStream(l, func() bool { return m.beforeFence(o) })
	o.written, o.writtenSeq = o.s.Status(), l.LastSeq
	m.hold(o)
	m.wg.Go(func() { m.session(o) })
}

// session runs o's stream until its context is cancelled, then gives the lease back
// unless it is no longer ours.
func (m *Manager) session(o *owned) {
	defer close(o.done)
	o.s.Run(o.ctx)
	m.finish(o)
	closeSession(o)
}

// finish ends o's session after its stream returned: it gives the lease back, hands
// it over (a planned handoff) or leaves it, by the cause.
func (m *Manager) finish(o *owned) {
	if sq, ok := o.s.(sequenced); ok && o.ctx.Err() == nil && sq.Halted() != nil {
		o.unfence()
		o.cancel(fmt.Errorf("%w: %w", errHalted, sq.Halted()))
	}
	if o.unfence() && o.ctx.Err() == nil {
		m.fenced(o) // the stream saw the fence deadline pass before the fence fired
	}
	cause := context.Cause(o.ctx)
	m.drop(o)
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
	m.release(stopContext(o), o.lease, p, sessionLink(o))
}

// release writes l's release on a fresh, bounded context: the cancelled one that
// brought us here must not cut the last write short. Its lease.release span is a child
// of parent's span (only its span is used), linked to links; the write carries it
// as trace_parent, so the record it causes joins its trace.
func (m *Manager) release(parent context.Context, l lease.Lease, p lease.Progress, links ...trace.Link) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), m.cfg.ReleaseTimeout)
	defer cancel()
	var ls []trace.Link
	for _, k := range links {
		if k.SpanContext.IsValid() {
			ls = append(ls, k)
		}
	}
	ctx, span := tracer.Start(ctx, "lease.release", leaseAttrs(l), trace.WithLinks(ls...), trace.WithAttributes(
		tracing.Worker(m.cfg.WorkerID), attribute.String("sockfleet.status", p.Status), attribute.Int64("sockfleet.last_seq", p.LastSeq)))
	defer span.End()
	if err := m.rg.release(ctx, l, p); err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "release failed")
		m.cfg.Log.WarnContext(ctx, "release failed; retried after the next membership renew (stream mode), else released by the reconciler or at expiry",
			"conn", l.ID, "last_seq", p.LastSeq, "err", err)
		return
	}
	m.cfg.Metrics.Releases.Add(1)
	m.cfg.Log.InfoContext(ctx, "released", "conn", l.ID, "last_seq", p.LastSeq, "status", p.Status)
}

// fenced is the self-fence's action: it only cancels the connection's context; the
// connection's session goroutine does the rest.
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
// to have fired, and it was not cancelled, or cancelled gracefully (a stop or
// drain, whose flush must still run). A lost, deleted or fenced lease is not ours.
// This is the one definition the stream's sink-write guard and the graceful flush
// share; SinkWindow says how long a write that passed it may still take.
func (m *Manager) beforeFence(o *owned) bool {
	if o.ctx.Err() != nil && !errors.Is(context.Cause(o.ctx), stream.ErrGraceful) {
		return false
	}
	return m.rg.valid(o)
}
