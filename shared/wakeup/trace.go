package wakeup

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"

	"github.com/sockfleet/sockfleet/shared/tracing"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// HeaderTraceSignature signs the W3C trace context a signed call carries (the
// traceparent and tracestate headers): "v1=" + hex HMAC-SHA256, with the shared
// secret, over "<request signature>.<traceparent>.<tracestate>". Binding it to the
// request signature ties the trace context to this one timestamp and body, so it is
// covered by the request's signature and replay check as a whole.
//
// Why a second header rather than a second signed string under HeaderSignature: a
// receiver that predates tracing checks HeaderSignature over "<timestamp>.<body>"
// only and ignores the rest, so a fleet in the middle of a deploy keeps waking its
// workers with tracing on. A receiver that knows it refuses a request whose trace
// signature does not match (a tampered traceparent), and ignores a traceparent that
// comes without one (nothing covers it). Either way, the trace context only says
// which trace the receiver's spans join: it never changes what a call does.
const HeaderTraceSignature = "X-Sockfleet-Trace-Signature"

// SignTrace returns the trace signature header value for traceparent and tracestate
// sent with a request signed sig.
func SignTrace(secret []byte, sig, traceparent, tracestate string) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(sig))
	m.Write([]byte{'.'})
	m.Write([]byte(traceparent))
	m.Write([]byte{'.'})
	m.Write([]byte(tracestate))
	return sigPrefix + hex.EncodeToString(m.Sum(nil))
}

// signTrace adds ctx's trace context, and its signature, to a request signed sig.
func signTrace(ctx context.Context, secret []byte, sig string, h http.Header) {
	tp, ts := tracing.Headers(ctx)
	if tp == "" {
		return
	}
	h.Set(tracing.HeaderTraceParent, tp)
	if ts != "" {
		h.Set(tracing.HeaderTraceState, ts)
	}
	h.Set(HeaderTraceSignature, SignTrace(secret, sig, tp, ts))
}

// TraceContext returns ctx carrying the remote trace context of a request whose
// signature sig Verify accepted: the traceparent and tracestate of h when h's trace
// signature covers them, else ctx as it is (no trace signature: the traceparent, if
// any, is not covered and is ignored). A trace signature that does not match is
// ErrUnauthorized: the headers were changed on the way.
func TraceContext(ctx context.Context, secret []byte, sig string, h http.Header) (context.Context, error) {
	tsig := h.Get(HeaderTraceSignature)
	if tsig == "" {
		return ctx, nil
	}
	tp, ts := h.Get(tracing.HeaderTraceParent), h.Get(tracing.HeaderTraceState)
	if !strings.HasPrefix(tsig, sigPrefix) || len(tsig) != len(sigPrefix)+64 {
		return ctx, fmt.Errorf("%w: bad trace signature format", ErrUnauthorized)
	}
	if !hmac.Equal([]byte(SignTrace(secret, sig, tp, ts)), []byte(tsig)) {
		return ctx, fmt.Errorf("%w: bad trace signature", ErrUnauthorized)
	}
	carrier := http.Header{}
	carrier.Set(tracing.HeaderTraceParent, tp)
	if ts != "" {
		carrier.Set(tracing.HeaderTraceState, ts)
	}
	return tracing.Extract(ctx, carrier), nil
}

// Annotate records on span what a wakeup asked and got: for a single id, its id,
// reason, version and result as the span's attributes; for each id, an event
// "wakeup.conn" with the same (results may be nil: the call failed).
func Annotate(span trace.Span, conns []Conn, results []ConnResult) {
	if !span.IsRecording() {
		return
	}
	got := make(map[string]Result, len(results))
	for _, r := range results {
		got[r.ID] = r.Result
	}
	span.SetAttributes(attribute.Int("sockfleet.wakeup.conns", len(conns)))
	for _, c := range conns {
		attrs := []attribute.KeyValue{tracing.Conn(c.ID), tracing.Version(c.LeaseVersion), tracing.Action(string(c.Reason))}
		if r, ok := got[c.ID]; ok {
			attrs = append(attrs, tracing.Result(string(r)))
		}
		if c.To != "" {
			attrs = append(attrs, attribute.String("sockfleet.handoff.to", c.To))
		}
		if len(conns) == 1 {
			span.SetAttributes(attrs...)
		}
		span.AddEvent("wakeup.conn", trace.WithAttributes(attrs...))
	}
}
