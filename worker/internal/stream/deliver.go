package stream

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sockfleet/sockfleet/shared/tracing"
	"github.com/sockfleet/sockfleet/worker/internal/sink"
)

// ErrPastFence is returned when a batch was about to reach the sink after the lease's
// fence deadline: the owner's timer cancels the stream at that deadline, but a reader
// woken at the same moment (after a pause, say) must not deliver in between.
var ErrPastFence = errors.New("lease past its fence deadline")

// deliver hands messages to the sink in batches until the reader fails, the URL
// changes or ctx ends.
func (s *Stream) deliver(ctx context.Context, msgs chan sink.Message, readErr chan error) error {
	var batch []sink.Message // grown on demand, so an idle socket holds none
	for {
		// A cancellation wins over queued messages (select alone picks at random):
		// after a stop the graceful flush delivers them, after a lost lease nothing.
		if ctx.Err() != nil {
			return ctx.Err()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.redial:
			return errRedial
		case err := <-readErr:
			// Deliver what the reader queued before it failed.
			for len(msgs) > 0 {
				batch = s.fill(batch[:0], <-msgs, msgs)
				werr := s.sinkWrite(ctx, batch)
				batch = drop(batch)
				if werr != nil {
					return werr
				}
			}
			return err
		case m := <-msgs:
			batch = s.fill(batch[:0], m, msgs)
			err := s.sinkWrite(ctx, batch)
			batch = drop(batch)
			if err != nil {
				return err
			}
		}
	}
}

// drop forgets a written batch's messages, so the buffer kept for the next batch
// holds no frame data while the socket is idle, and returns a buffer small enough
// to keep (a burst's large one is let go).
func drop(batch []sink.Message) []sink.Message {
	clear(batch)
	if cap(batch) > 32 {
		return nil
	}
	return batch[:0]
}

// fill appends m and whatever else is queued, up to the batch size.
func (s *Stream) fill(batch []sink.Message, m sink.Message, msgs chan sink.Message) []sink.Message {
	batch = append(batch, m)
	for len(batch) < s.cfg.BatchSize {
		select {
		case m := <-msgs:
			batch = append(batch, m)
		default:
			return batch
		}
	}
	return batch
}

// flushQueued delivers messages read before a graceful stop.
func (s *Stream) flushQueued(ctx context.Context, msgs chan sink.Message) {
	batch := make([]sink.Message, 0, len(msgs))
	for len(msgs) > 0 {
		batch = append(batch, <-msgs)
	}
	if len(batch) > 0 {
		_ = s.sinkWrite(ctx, batch)
	}
}

// setQueued records how many of this stream's messages wait for the sink (the
// batch in hand and the queue behind it), in the worker-wide gauge.
func (s *Stream) setQueued(n int64) {
	s.cfg.Metrics.SinkQueued.Add(n - s.queued)
	s.queued = n
}

// sinkWrite writes batch on a context that survives ctx's cancellation (bounded by
// SinkTimeout), so a write in flight at a stop completes and is acknowledged. While
// it writes, the reader can queue only a few messages more before it stops reading
// (and TCP pushes back on the upstream): a slow sink costs time, not memory. A write
// that takes longer than SinkSlowAfter shows as status sink_slow until it ends.
func (s *Stream) sinkWrite(ctx context.Context, batch []sink.Message) error {
	if s.valid != nil && !s.valid() {
		return ErrPastFence
	}
	s.setQueued(int64(len(batch) + len(s.queue)))
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.SinkTimeout)
	defer cancel()
	start := time.Now()
	slowed := make(chan struct{})
	slow := time.AfterFunc(s.cfg.SinkSlowAfter, func() {
		defer close(slowed)
		s.cfg.Metrics.SinkSlowWrites.Add(1)
		s.cfg.Metrics.SinkSlow.Add(1)
		s.setStatus("sink_slow", fmt.Errorf("a sink write of %d messages has taken over %s", len(batch), s.cfg.SinkSlowAfter))
	})
	err := s.cfg.Sink.Write(wctx, batch)
	s.cfg.Metrics.SinkWrites.Add(1)
	s.cfg.Metrics.SinkWriteNanos.Add(int64(time.Since(start)))
	if !slow.Stop() {
		<-slowed
		s.cfg.Metrics.SinkSlow.Add(-1)
		if err == nil {
			s.setStatus("streaming", nil)
		}
	}
	s.setQueued(int64(len(s.queue)))
	if err != nil {
		s.cfg.Metrics.SinkErrors.Add(1)
		return fmt.Errorf("sink: %w", err)
	}
	var n int64
	pos := s.position()
	for _, m := range batch {
		n += int64(len(m.Data))
		if !m.Bad { // in order: the last good message is the resume point (its epoch may be newer)
			pos = Position{Seq: m.Seq, Epoch: m.Epoch}
		}
	}
	s.pos.Store(&pos)
	if s.version != 0 && !s.delivered.Load() && len(batch) > 0 {
		// Once per stream (a standby's gate marks its own, after the commit).
		s.delivered.Store(true)
		tracing.FirstDelivery(ctx, tracer, start, s.id, s.version, len(batch))
	}
	s.cfg.Metrics.Messages.Add(int64(len(batch)))
	s.cfg.Metrics.Bytes.Add(n)
	return nil
}
