package stream

import (
	"strings"
	"testing"
	"time"

	"github.com/sockfleet/sockfleet/shared/local/demoupstream"
	"github.com/sockfleet/sockfleet/shared/schema"
)

// numbers reads the payload numbers of what s delivered from a LiveHead upstream.
func (s *memSink) numbers(t *testing.T) []int64 {
	t.Helper()
	var out []int64
	for _, m := range s.all() {
		n, ok := demoupstream.Number(m.Data)
		if !ok {
			t.Fatalf("delivered %q: not a numbered frame", m.Data)
		}
		out = append(out, n)
	}
	return out
}

// In counter mode (no seq_path) a rotation cannot align a second socket's count with
// the first's, so it is break-before-make: against an upstream that ignores the
// resume point and streams from its live head (~200 msg/s), every message the
// upstream sent on any socket reaches the sink, by the numbers in the payloads; what
// it produced while no socket was open is its own gap, and the status says why.
func TestCountedRotationLosesNothingSent(t *testing.T) {
	// A dial of 250 ms, as to a far upstream: the live head moves ~50 messages on.
	up := upstream(t, demoupstream.Config{Rate: 200, Size: 8, LiveHead: true, HandshakeDelay: 250 * time.Millisecond})
	snk := &memSink{}
	cfg := testConfig(t, snk, "")
	s := specStream(t, cfg, up.URL("live"), "live", 0, schema.Spec{MaxLifetime: 1500 * time.Millisecond})
	stop := run(s)
	waitFor(t, 15*time.Second, "3 rotations", func() bool { return cfg.Metrics.Rotations.Load() >= 3 })
	n := len(snk.all())
	waitFor(t, 5*time.Second, "the fourth socket streaming", func() bool { return len(snk.all()) >= n+20 })
	stop(ErrGraceful)
	waitFor(t, 5*time.Second, "every socket closed", func() bool { return up.Stats("live").Sockets == 0 })

	spans := up.SentSpans("live")
	tally := demoupstream.Count(spans, snk.numbers(t))
	t.Logf("%d sockets: %d numbers sent, %d delivered, %d missing, %d duplicates, %d never sent (between sockets)",
		len(spans), tally.Sent, tally.Delivered, len(tally.Missing), tally.Duplicates, tally.Unsent)
	if len(tally.Missing) > 0 {
		t.Fatalf("%d messages the upstream sent were never delivered (first %d)", len(tally.Missing), tally.Missing[0])
	}
	if len(spans) < 4 || tally.Sent < 400 {
		t.Fatalf("%d sockets, %d messages: want 3 rotations of a streaming socket", len(spans), tally.Sent)
	}
	if p := cfg.Metrics.OverlapPeak.Load(); p != 0 {
		t.Fatalf("overlap peak %d: want one socket at a time (break-before-make)", p)
	}
	contiguous(t, snk.seqs(), 1) // the labels go on by count
}

// Counter mode's break-before-make against an upstream that does resume: the new
// socket resumes after the last delivered count, so nothing is lost or repeated, the
// labels are the upstream's own numbers, and the status says the position is a count.
func TestCountedRotationResumes(t *testing.T) {
	up := upstream(t, demoupstream.Config{Rate: 400, Rules: demoupstream.Rules{MaxLifetime: 2 * time.Second}})
	snk := &memSink{}
	cfg := testConfig(t, snk, "")
	s := specStream(t, cfg, up.URL("rot"), "rot", 0, schema.Spec{MaxLifetime: 1500 * time.Millisecond})
	stop := run(s)
	waitFor(t, 10*time.Second, "a rotation", func() bool { return cfg.Metrics.Rotations.Load() >= 1 })
	waitFor(t, 5*time.Second, "the status to say counter mode", func() bool {
		st := s.Status()
		return st.State == "streaming" && strings.Contains(st.Error, "counter mode") && strings.Contains(st.Error, "break-before-make")
	})
	waitFor(t, 10*time.Second, "3 rotations", func() bool { return cfg.Metrics.Rotations.Load() >= 3 })
	stop(ErrGraceful)
	msgs := snk.all()
	noDuplicates(t, msgs)
	contiguous(t, snk.seqs(), 1)
	seq, _ := ParseSeqPath("seq")
	for _, m := range msgs {
		if n, ok := seq.Extract(m.Data); !ok || n != m.Seq {
			t.Fatalf("label %d on the upstream's message %d", m.Seq, n)
		}
	}
	if n := len(msgs); n < 400 {
		t.Fatalf("only %d messages", n)
	}
	if p, r := cfg.Metrics.OverlapPeak.Load(), cfg.Metrics.Reconnects.Load(); p != 0 || r != 0 {
		t.Fatalf("overlap peak %d, reconnects %d: want rotations alone, one socket at a time", p, r)
	}
}
