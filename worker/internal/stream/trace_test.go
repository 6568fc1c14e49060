package stream

import (
	"context"
	"testing"
	"time"

	"github.com/sockfleet/sockfleet/shared/local/demoupstream"
	"github.com/sockfleet/sockfleet/shared/local/tracingtest"
	"github.com/sockfleet/sockfleet/shared/schema"
	"go.opentelemetry.io/otel"
)

// Under a session span, a stream makes one dial and one open span (its first
// socket's), one first delivery, and marks rotations and sequence resets as events on
// the session span; the sockets a rotation opens and the messages add no span.
func TestSessionSpanEvents(t *testing.T) {
	sr := tracingtest.Record(t)
	up := upstream(t, demoupstream.Config{Rate: 300, Rules: demoupstream.Rules{MaxLifetime: 800 * time.Millisecond,
		Announce: `{"type":"goAway"}`, AnnounceBefore: 400 * time.Millisecond}})
	snk := &memSink{}
	cfg := testConfig(t, snk, "seq")
	cfg.ResetBelow = 5
	s := specStream(t, cfg, up.URL("r"), "r", 0, schema.Spec{ShutdownMatch: `"goAway"`})
	s.version = 5
	ctx, session := otel.Tracer("test").Start(context.Background(), "connection.session")
	cctx, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	go func() { s.Run(cctx); close(done) }()
	waitFor(t, 5*time.Second, "a rotation", func() bool { return cfg.Metrics.Rotations.Load() >= 1 })
	up.ResetNumbering("r")
	waitFor(t, 5*time.Second, "epoch 1", func() bool { return s.Epoch() == 1 })
	cancel(ErrGraceful)
	<-done
	session.End()

	events := map[string]int{}
	for _, ev := range tracingtest.Named(sr.Ended(), "connection.session")[0].Events() {
		events[ev.Name]++
	}
	if events["first_delivery"] != 1 || events["rotation"] < 1 || events["seq_reset"] != 1 {
		t.Fatalf("session events %v: want one first_delivery, a rotation, one seq_reset", events)
	}
	for _, name := range []string{"stream.dial", "stream.open", "sink.first_delivery"} {
		spans := tracingtest.Named(sr.Ended(), name)
		if len(spans) != 1 || spans[0].Parent().SpanID() != session.SpanContext().SpanID() {
			t.Errorf("%d %s spans; want one, the session's child", len(spans), name)
		}
	}
	if n := len(sr.Ended()); n != 4 {
		t.Errorf("%d spans; want 4 (session, dial, open, first delivery)", n)
	}
}
