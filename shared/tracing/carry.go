package tracing

import (
	"context"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// W3C trace context headers.
const (
	HeaderTraceParent = "traceparent"
	HeaderTraceState  = "tracestate"
)

// AttrTraceParent is the item attribute (String) in which a write that causes a
// stream record — a release, a transfer — leaves its writer's traceparent, folded into
// that same write, so the reconciler's span for the record can join the trace.
const AttrTraceParent = "trace_parent"

// Headers returns the traceparent and tracestate of the span in ctx, both "" when
// ctx carries no valid span (tracing off, or not sampled and not recording).
func Headers(ctx context.Context) (traceparent, tracestate string) {
	c := propagation.MapCarrier{}
	Propagator.Inject(ctx, c)
	return c[HeaderTraceParent], c[HeaderTraceState]
}

// TraceParent is the traceparent of the span in ctx, or "".
func TraceParent(ctx context.Context) string {
	tp, _ := Headers(ctx)
	return tp
}

// Inject sets the traceparent (and tracestate) of ctx's span on h; nothing when none.
func Inject(ctx context.Context, h http.Header) {
	Propagator.Inject(ctx, propagation.HeaderCarrier(h))
}

// Extract returns ctx carrying the remote span context in h, or ctx itself when h
// carries none that parses.
func Extract(ctx context.Context, h http.Header) context.Context {
	return Propagator.Extract(ctx, propagation.HeaderCarrier(h))
}

// Remote parses a traceparent (as AttrTraceParent holds it) into a remote span
// context; ok false if it does not parse.
func Remote(traceparent string) (sc trace.SpanContext, ok bool) {
	if traceparent == "" || len(traceparent) > 128 {
		return trace.SpanContext{}, false
	}
	ctx := Propagator.Extract(context.Background(), propagation.MapCarrier{HeaderTraceParent: traceparent})
	sc = trace.SpanContextFromContext(ctx)
	return sc, sc.IsValid()
}

// FirstDelivery marks the first messages of a session handed to the sink: a
// sink.first_delivery span from start (the write's start) to now, child of ctx's
// span (the connection's session), and a first_delivery event on that span. The
// caller makes sure it runs once per session: nothing on the message path is traced.
func FirstDelivery(ctx context.Context, tr trace.Tracer, start time.Time, conn string, version int64, messages int) {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return
	}
	attrs := []attribute.KeyValue{Conn(conn), Version(version), attribute.Int("sockfleet.messages", messages)}
	parent.AddEvent("first_delivery", trace.WithAttributes(attrs...))
	_, sp := tr.Start(ctx, "sink.first_delivery", trace.WithTimestamp(start), trace.WithAttributes(attrs...))
	sp.End()
}
