package server

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sockfleet/sockfleet/shared/local/tracingtest"
	"github.com/sockfleet/sockfleet/shared/tracing"
	"github.com/sockfleet/sockfleet/shared/wakeup"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// recordSpans records the test's spans; the tracer makes the caller's spans.
func recordSpans(t *testing.T) (*tracetest.SpanRecorder, trace.Tracer) {
	t.Helper()
	sr := tracingtest.Record(t)
	return sr, otel.Tracer("test")
}

// signedTraced is a request signed as SignedPost signs it, carrying ctx's trace
// context under a trace signature.
func signedTraced(ctx context.Context, now time.Time, body string) *http.Request {
	ts := wakeup.Timestamp(now)
	sig := wakeup.Sign(secret, ts, []byte(body))
	req := httptest.NewRequest(http.MethodPost, wakeup.Path, strings.NewReader(body))
	req.Header.Set(wakeup.HeaderTimestamp, ts)
	req.Header.Set(wakeup.HeaderSignature, sig)
	tp, _ := tracing.Headers(ctx)
	req.Header.Set(tracing.HeaderTraceParent, tp)
	req.Header.Set(wakeup.HeaderTraceSignature, wakeup.SignTrace(secret, sig, tp, ""))
	return req
}

func clone(r *http.Request, body string) *http.Request {
	c := httptest.NewRequest(http.MethodPost, wakeup.Path, strings.NewReader(body))
	c.Header = r.Header.Clone()
	return c
}

func serve(h http.Handler, r *http.Request) int {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec.Code
}

func handleSpans(sr *tracetest.SpanRecorder) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range sr.Ended() {
		if s.Name() == "wakeup.handle" {
			out = append(out, s)
		}
	}
	return out
}

// A signed traceparent makes wakeup.handle the sender's child. A forged or replayed
// one cannot change what a wakeup does: a replay is refused as any replay is (even
// with another traceparent), a tampered traceparent fails its signature (and does not
// use up the genuine request's), and one sent without a trace signature is ignored:
// the wakeup does exactly what it would have, in a trace of its own.
func TestTraceParentCannotChangeAWakeup(t *testing.T) {
	sr, tr := recordSpans(t)
	o := &fakeOwner{}
	h := (&Server{Secret: secret, Worker: "w1", Owner: o}).Handler()
	sendCtx, send := tr.Start(context.Background(), "wakeup.send")
	defer send.End()
	_, forged := tr.Start(context.Background(), "forged")
	forgedTP := tracing.TraceParent(trace.ContextWithSpan(context.Background(), forged))

	genuine := signedTraced(sendCtx, time.Now(), good)
	tampered := clone(genuine, good)
	tampered.Header.Set(tracing.HeaderTraceParent, forgedTP)
	if code := serve(h, tampered); code != http.StatusUnauthorized || o.nCalls() != 0 {
		t.Fatalf("tampered traceparent: status %d, %d wakes; want 401 and none", code, o.nCalls())
	}
	if code := serve(h, clone(genuine, good)); code != http.StatusOK || o.nCalls() != 1 {
		t.Fatalf("genuine request after a tampered copy: status %d, %d wakes; want 200 and one", code, o.nCalls())
	}
	hs := handleSpans(sr)
	if len(hs) != 1 || hs[0].Parent().SpanID() != send.SpanContext().SpanID() || hs[0].SpanContext().TraceID() != send.SpanContext().TraceID() {
		t.Fatalf("wakeup.handle spans %d; want one, the child of the sender's span", len(hs))
	}

	replay := clone(genuine, good)
	replay.Header.Set(tracing.HeaderTraceParent, forgedTP)
	replay.Header.Set(wakeup.HeaderTraceSignature, wakeup.SignTrace([]byte("not-the-secret-0123456"), genuine.Header.Get(wakeup.HeaderSignature), forgedTP, ""))
	if code := serve(h, replay); code != http.StatusUnauthorized || o.nCalls() != 1 {
		t.Fatalf("replay with another traceparent: status %d, %d wakes; want 401 and still one", code, o.nCalls())
	}
	if code := serve(h, clone(genuine, good)); code != http.StatusUnauthorized || o.nCalls() != 1 {
		t.Fatalf("plain replay: status %d, %d wakes; want 401 and still one", code, o.nCalls())
	}

	// Unsigned trace context on a validly signed request: the same wakeup, its own trace.
	ts := wakeup.Timestamp(time.Now().Add(time.Second)) // not the genuine request's signature
	bare := httptest.NewRequest(http.MethodPost, wakeup.Path, strings.NewReader(good))
	bare.Header.Set(wakeup.HeaderTimestamp, ts)
	bare.Header.Set(wakeup.HeaderSignature, wakeup.Sign(secret, ts, []byte(good)))
	bare.Header.Set(tracing.HeaderTraceParent, forgedTP)
	if code := serve(h, bare); code != http.StatusOK || o.nCalls() != 2 {
		t.Fatalf("unsigned traceparent: status %d, %d wakes; want 200 and two", code, o.nCalls())
	}
	if a, b := o.calls[0], o.calls[1]; len(a) != len(b) || a[0] != b[0] || a[1] != b[1] {
		t.Fatalf("the wakeups differ: %+v and %+v", a, b)
	}
	hs = handleSpans(sr)
	if len(hs) != 2 || hs[1].Parent().IsValid() || hs[1].SpanContext().TraceID() == forged.SpanContext().TraceID() {
		t.Fatalf("wakeup.handle of the unsigned traceparent: parent %v; want a root span, not in the forged trace", hs[len(hs)-1].Parent())
	}
	attrs := map[string]string{}
	for _, kv := range hs[0].Attributes() {
		attrs[string(kv.Key)] = kv.Value.Emit()
	}
	if attrs[tracing.AttrWorker] != "w1" || attrs["sockfleet.wakeup.conns"] != "2" {
		t.Fatalf("wakeup.handle attributes %v", attrs)
	}
}

// SignedPost sends the trace context of its context under a trace signature the
// server accepts; without a span it sends none.
func TestSignedPostCarriesTraceContext(t *testing.T) {
	sr, tr := recordSpans(t)
	o := &fakeOwner{}
	srv := httptest.NewServer((&Server{Secret: secret, Owner: o}).Handler())
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	c := &wakeup.Client{Secret: secret}
	req := wakeup.Request{Conns: []wakeup.Conn{{ID: "a", Reason: wakeup.NeedsOwner}}}
	ctx, root := tr.Start(context.Background(), "root")
	if _, err := c.Send(ctx, addr, req); err != nil {
		t.Fatal(err)
	}
	root.End()
	var send, handle sdktrace.ReadOnlySpan
	for _, s := range sr.Ended() {
		switch s.Name() {
		case "wakeup.send":
			send = s
		case "wakeup.handle":
			handle = s
		}
	}
	if send == nil || handle == nil || send.Parent().SpanID() != root.SpanContext().SpanID() ||
		handle.Parent().SpanID() != send.SpanContext().SpanID() || !handle.Parent().IsRemote() {
		t.Fatalf("send %v, handle %v: want root → wakeup.send → wakeup.handle (remote parent)", send, handle)
	}
}
