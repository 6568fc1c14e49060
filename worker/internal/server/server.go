// Package server is the worker's HTTP listener: POST /v1/wakeup (the only way the
// reconciler reaches a worker), POST /v1/handoff (another worker's planned handoff,
// docs/HANDOFF.md), GET /healthz and GET /metrics.
//
// A wakeup is authenticated before anything else is looked at: the body (at most
// wakeup.MaxBody bytes) must carry a valid HMAC-SHA256 signature over its timestamp,
// the timestamp must be within ±wakeup.Window, and the signature must not have been
// seen before. A request refused with 401, 400, 405, 413 or 503 changes no state.
// A handoff call is authenticated the same way, with the same secret and replay
// cache; it is answered while draining too (a draining worker refuses to prepare but
// must still hear commits, to release what it cannot run).
package server

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/sockfleet/sockfleet/shared/tracing"
	"github.com/sockfleet/sockfleet/shared/wakeup"
	"github.com/sockfleet/sockfleet/worker/internal/metrics"
	"github.com/sockfleet/sockfleet/worker/internal/peer"
	"go.opentelemetry.io/otel/trace"
)

// Owner is what the listener needs from the ownership loop.
type Owner interface {
	Wake(ctx context.Context, conns []wakeup.Conn) []wakeup.ConnResult
	Draining() bool
	Healthy() error
	// Load is how many connections the worker holds or is acquiring.
	Load() int
}

// Handoffs is what the listener needs to answer another worker's handoff calls.
type Handoffs interface {
	Handoff(ctx context.Context, r peer.Request) peer.Response
}

// Server serves the worker's endpoints.
type Server struct {
	Secret   []byte
	Worker   string // this worker's id, on its spans
	Owner    Owner
	Handoffs Handoffs // nil: POST /v1/handoff is not served
	Metrics  *metrics.Counters
	Replay   *wakeup.Replay   // default: a fresh cache
	Now      func() time.Time // default time.Now
	Log      *slog.Logger
}

// Handler returns the routes.
func (s *Server) Handler() http.Handler {
	if s.Replay == nil {
		s.Replay = &wakeup.Replay{}
	}
	if s.Now == nil {
		s.Now = time.Now
	}
	if s.Log == nil {
		s.Log = slog.New(slog.DiscardHandler)
	}
	if s.Metrics == nil {
		s.Metrics = new(metrics.Counters)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+wakeup.Path, s.wakeup)
	if s.Handoffs != nil {
		mux.HandleFunc("POST "+peer.Path, s.handoff)
	}
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.Handle("GET /metrics", metrics.Handler(s.Metrics))
	return mux
}

func (s *Server) refuse(w http.ResponseWriter, code int, msg string, err error) {
	s.Metrics.WakeupsRefused.Add(1)
	s.Log.Warn("wakeup refused", "status", code, "err", err)
	http.Error(w, msg, code)
}

var tracer = tracing.Tracer("worker/internal/server")

func (s *Server) wakeup(w http.ResponseWriter, r *http.Request) {
	ctx, body, ok := s.authentic(w, r, wakeup.MaxBody)
	if !ok {
		return // no detail for an unauthenticated caller
	}
	req, err := wakeup.DecodeRequest(body)
	if err != nil {
		s.refuse(w, http.StatusBadRequest, err.Error(), err)
		return
	}
	// The server side of the reconciler's wakeup.send (its child when the request
	// carried a signed traceparent).
	ctx, span := tracer.Start(ctx, "wakeup.handle", trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(tracing.Worker(s.Worker)))
	defer span.End()
	if s.Owner.Draining() {
		resp := wakeup.Response{V: wakeup.Version}
		for _, c := range req.Conns {
			resp.Results = append(resp.Results, wakeup.ConnResult{ID: c.ID, Result: wakeup.Draining})
		}
		wakeup.Annotate(span, req.Conns, resp.Results)
		s.Metrics.WakeupsRefused.Add(1)
		writeJSON(w, http.StatusServiceUnavailable, resp)
		return
	}
	s.Metrics.Wakeups.Add(1)
	resp := wakeup.Response{V: wakeup.Version, Results: s.Owner.Wake(ctx, req.Conns)}
	wakeup.Annotate(span, req.Conns, resp.Results)
	load := s.Owner.Load() // after the acquisitions: what the reconciler's next choice should see
	resp.Load = &load
	writeJSON(w, http.StatusOK, resp)
}

// authentic reads a signed body of at most limit bytes, answering the refusal itself
// when it is not acceptable. Its context carries the caller's trace context when the
// request's signature covers it (wakeup.TraceContext).
func (s *Server) authentic(w http.ResponseWriter, r *http.Request, limit int64) (context.Context, []byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			s.refuse(w, http.StatusRequestEntityTooLarge, "body too large", err)
			return nil, nil, false
		}
		s.refuse(w, http.StatusBadRequest, "cannot read body", err)
		return nil, nil, false
	}
	now := s.Now()
	sig := r.Header.Get(wakeup.HeaderSignature)
	if err := wakeup.Verify(s.Secret, now, r.Header.Get(wakeup.HeaderTimestamp), sig, body); err != nil {
		s.refuse(w, http.StatusUnauthorized, "unauthorized", err)
		return nil, nil, false
	}
	// Before the replay check: a copy with a tampered traceparent must not use up
	// the signature of the genuine request.
	ctx, err := wakeup.TraceContext(r.Context(), s.Secret, sig, r.Header)
	if err != nil {
		s.refuse(w, http.StatusUnauthorized, "unauthorized", err)
		return nil, nil, false
	}
	if s.Replay.Seen(sig, now) {
		s.refuse(w, http.StatusUnauthorized, "unauthorized", errors.New("replayed signature"))
		return nil, nil, false
	}
	return ctx, body, true
}

func (s *Server) handoff(w http.ResponseWriter, r *http.Request) {
	ctx, body, ok := s.authentic(w, r, peer.MaxBody)
	if !ok {
		return
	}
	req, err := peer.DecodeRequest(body)
	if err != nil {
		s.refuse(w, http.StatusBadRequest, err.Error(), err)
		return
	}
	writeJSON(w, http.StatusOK, s.Handoffs.Handoff(ctx, req))
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	if err := s.Owner.Healthy(); err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	_, _ = io.WriteString(w, "ok\n")
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(b)
}
