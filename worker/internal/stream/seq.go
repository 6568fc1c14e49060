package stream

import (
	"fmt"
	"time"

	"github.com/sockfleet/sockfleet/shared/schema"

	"github.com/sockfleet/sockfleet/worker/internal/sink"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// tracker decides, frame by frame, what a socket's reader queues: it numbers or
// parses sequences, drops replays, and judges resets, gaps, bogus jumps and bad
// frames against the connection's policies. Duplicates are fine; silent loss is not:
// a restarted numbering is never taken for a replay.
type tracker struct {
	s       *Stream
	sock    *socket
	st      readState
	counter int64 // counter mode: frames numbered so far, from the socket's resume point
	first   bool  // no data frame yet on this socket

	loggedBad, loggedGap, loggedDecode bool

	// Snapshots (snapshot.go). While covering, deltas up to the snapshot's sequence
	// are dropped, and a reset is judged against floor, the deltas' place before it.
	covering bool
	floor    int64
	resync   bool      // the message next returned follows a gap: fetch a snapshot (on_gap resync)
	resynced time.Time // the last resync
}

// next returns the message to queue for f, false to drop it, or the error that
// ends the session (a reset under the halt policy).
func (t *tracker) next(f frame) (sink.Message, bool, error) {
	s, set := t.s, t.s.set
	m := sink.Message{Conn: s.id, Data: f.data, Binary: f.binary, Epoch: t.st.epoch, Version: s.version,
		Decoded: f.decoded, Dest: set.spec.Sink}
	if f.over {
		s.cfg.Metrics.OverLimit.Add(1)
	}
	if set.seqPath.Counter() {
		t.counter++
		if f.decodeErr != nil {
			return t.undecodable(m, f)
		}
		if f.over {
			return t.bad(m, f, "frame over the read limit")
		}
		if t.counter <= t.st.last {
			s.cfg.Metrics.Duplicates.Add(1) // the old socket of a rotation delivered it
			return m, false, nil
		}
		t.st.last, t.st.ref = t.counter, true
		m.Seq = t.counter
		return m, true, nil
	}
	if f.decodeErr != nil {
		return t.undecodable(m, f)
	}
	if f.over {
		return t.bad(m, f, "frame over the read limit")
	}
	seq, ok := int64(0), false
	if !f.binary {
		seq, ok = set.seqPath.Extract(f.data)
	}
	if !ok {
		return t.bad(m, f, "message without a parsable sequence")
	}
	first := t.first
	t.first = false
	last, ref := t.st.last, t.st.last
	if t.covering {
		ref = t.floor
	}
	switch {
	case (first && t.sock.resumed && seq < t.sock.from) || (t.st.ref && ref-seq > s.cfg.ResetBelow):
		return t.reset(m, seq)
	case seq <= last:
		s.cfg.Metrics.Duplicates.Add(1) // replayed by the upstream: delivered already
		return m, false, nil
	case t.st.ref && set.maxJump > 0 && seq-last > set.maxJump:
		s.cfg.Metrics.BogusJumps.Add(1)
		return t.bad(m, f, fmt.Sprintf("sequence %d jumps more than max_seq_jump %d past %d", seq, set.maxJump, last))
	}
	t.covering = false
	if t.st.ref && seq > last+1 {
		t.resync = set.spec.Snapshot != nil && set.spec.Snapshot.OnGap == schema.OnGapResync
		s.cfg.Metrics.SeqGaps.Add(1)
		s.cfg.Metrics.SeqGapMissing.Add(seq - last - 1)
		if !t.loggedGap {
			t.loggedGap = true
			s.cfg.Log.Warn("gap in the upstream's numbering (logged once per socket)", "conn", s.id,
				"after", last, "next", seq, "missing", seq-last-1)
		}
	}
	t.st.last, t.st.ref = seq, true
	m.Seq = seq
	return m, true, nil
}

// reset handles a restarted numbering: a sequence far below the last one, or the
// first of a socket below the resume point it asked for.
func (t *tracker) reset(m sink.Message, seq int64) (sink.Message, bool, error) {
	s := t.s
	s.cfg.Metrics.SeqResets.Add(1)
	s.sessionSpan().AddEvent("seq_reset", trace.WithAttributes(attribute.Int64("sockfleet.seq", seq),
		attribute.Int64("sockfleet.last_seq", t.st.last), attribute.Int64("sockfleet.epoch", t.st.epoch),
		attribute.String("sockfleet.seq_reset", string(s.set.seqReset))))
	if s.set.seqReset == schema.SeqResetHalt {
		return m, false, &haltError{seq: seq, last: t.st.last, from: t.sock.from}
	}
	t.st.epoch++
	err := fmt.Errorf("sequence reset accepted: epoch %d starts at seq %d (was %d)", t.st.epoch, seq, t.st.last)
	s.cfg.Log.Warn("upstream numbering reset; new epoch", "conn", s.id, "epoch", t.st.epoch, "seq", seq, "was", t.st.last)
	s.setStatus("streaming", err)
	t.st.last, t.st.ref = seq, true
	m.Seq, m.Epoch = seq, t.st.epoch
	return m, true, nil
}

// undecodable handles a frame the spec's decode could not decompress (corrupt, not
// compressed, or inflating past the read limit): a bad message, counted, and said in
// the status once per socket, so an operator sees a decode that does not fit the feed.
func (t *tracker) undecodable(m sink.Message, f frame) (sink.Message, bool, error) {
	s := t.s
	s.cfg.Metrics.DecodeErrors.Add(1)
	if !t.loggedDecode {
		t.loggedDecode = true
		s.setStatus("streaming", fmt.Errorf("bad message (bad_messages %s): %s: %w", s.set.bad, schema.AttrDecode, f.decodeErr))
		s.cfg.Log.Warn("frame does not decode (logged once per socket)", "conn", s.id, "err", f.decodeErr)
	}
	return t.bad(m, f, f.decodeErr.Error())
}

// bad applies the bad-message policy.
func (t *tracker) bad(m sink.Message, f frame, why string) (sink.Message, bool, error) {
	s := t.s
	s.cfg.Metrics.BadMessages.Add(1)
	switch s.set.bad {
	case BadPass:
		m.Seq, m.Bad = t.st.last, true
		return m, true, nil
	case BadCount:
		if !t.loggedBad {
			t.loggedBad = true
			s.cfg.Log.Warn("bad message dropped (logged once per socket)", "conn", s.id, "why", why,
				"bytes", len(f.data), "binary", f.binary, "over_limit", f.over)
		}
	}
	return m, false, nil
}
