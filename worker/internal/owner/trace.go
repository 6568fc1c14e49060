package owner

import (
	"context"

	"github.com/sockfleet/sockfleet/shared/lease"
	"github.com/sockfleet/sockfleet/shared/tracing"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// Spans of the ownership paths (docs/TRACING.md): lease.acquire, connection.session
// (a child of what took the lease, living as long as the session), lease.release,
// worker.drain and the handoff.* spans. Nothing on the message path: the streams mark
// only their first delivery (tracing.FirstDelivery).

var tracer = tracing.Tracer("worker/internal/owner")

// openSession starts o's connection.session span as a child of ctx's span and puts it
// in o.ctx, where the stream's spans (dial, open, first delivery) find it. Call before
// the session's goroutine starts.
func (m *Manager) openSession(ctx context.Context, o *owned, standby bool) {
	_, o.span = tracer.Start(ctx, "connection.session", trace.WithAttributes(tracing.Conn(o.lease.ID),
		tracing.Worker(m.cfg.WorkerID), tracing.Version(o.lease.Version), attribute.Bool("sockfleet.standby", standby)))
	if o.span.SpanContext().IsValid() { // tracing off and no trace given: nothing to carry
		o.ctx = trace.ContextWithSpan(o.ctx, o.span)
	}
}

// closeSession ends o's session span, saying why the session ended.
func closeSession(o *owned) {
	if c := context.Cause(o.ctx); c != nil {
		o.span.SetAttributes(attribute.String("sockfleet.session.end", c.Error()))
	}
	o.span.End()
}

// stopIn records ctx's span as the one that stops o (a check that found it stopped,
// a drain, a handoff): o's release or transfer becomes its child. No span: nothing.
func (o *owned) stopIn(ctx context.Context) {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		o.stopper.Store(&sc)
	}
}

// stopContext returns a fresh context under o's stopper span, if any: the parent of
// its release or transfer. Without one, they start traces of their own, linked to
// the session (a session's trace is the one that took the lease, long ago).
func stopContext(o *owned) context.Context {
	if sc := o.stopper.Load(); sc != nil {
		return trace.ContextWithSpanContext(context.Background(), *sc)
	}
	return context.Background()
}

// sessionLink links to o's session span.
func sessionLink(o *owned) trace.Link {
	if o == nil || o.span == nil {
		return trace.Link{}
	}
	return trace.Link{SpanContext: o.span.SpanContext()}
}

// leaseAttrs are the attributes of a span about lease l.
func leaseAttrs(l lease.Lease) trace.SpanStartEventOption {
	return trace.WithAttributes(tracing.Conn(l.ID), tracing.Version(l.Version))
}
