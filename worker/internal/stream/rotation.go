package stream

import (
	"context"
	"time"
)

// rotator replaces sock, make-before-break, shortly before max_lifetime or when
// the reader saw the upstream announce its shutdown: it dials and opens a new socket
// while the old one streams on, hands it over on next, then stops the old reader. In
// counter mode it only closes sock (break-before-make), and Run dials the next.
func (s *Stream) rotator(ctx context.Context, sock *socket, rotate <-chan struct{}, next chan<- *socket) {
	var due <-chan time.Time
	var at time.Time
	if life := s.set.spec.MaxLifetime; life > 0 {
		at = s.rotateAt(sock.opened, life)
	}
	if t := s.tokenDue(sock); !t.IsZero() && (at.IsZero() || t.Before(at)) {
		at = t // the token expires first (token.go)
	}
	if !at.IsZero() {
		t := time.NewTimer(time.Until(at))
		defer t.Stop()
		due = t.C
	}
	select {
	case <-ctx.Done():
		return
	case <-due:
	case <-rotate:
	}
	if s.set.seqPath.Counter() {
		// A second socket's count could not be aligned with this one's (see
		// counted.go): close, let the reader read to the upstream's close reply and the
		// session deliver it, then the session ends and Run dials again at once.
		s.cfg.Log.Info("counter mode: rotating break-before-make (close, then dial)", "conn", s.id, "last_seq", s.LastSeq())
		s.beginClose(sock)
		return
	}
	for failures := 0; ; failures++ {
		pos := s.position()
		from, resumed := pos.Seq, true
		if pos.Seq == 0 && pos.Epoch == 0 {
			if q := sock.queued.Load(); q > 0 {
				from = q // nothing delivered yet: what the old socket queued will be
			} else {
				from, resumed = s.set.spec.StartSeq()
			}
		}
		fresh, err := s.connect(ctx, from, resumed)
		if err == nil {
			// Both sockets are open now: the old one streams until its reader stops.
			n := s.cfg.Metrics.Overlap.Add(1)
			for p := s.cfg.Metrics.OverlapPeak.Load(); n > p && !s.cfg.Metrics.OverlapPeak.CompareAndSwap(p, n); {
				p = s.cfg.Metrics.OverlapPeak.Load()
			}
			next <- fresh
			sock.stopReading()
			return
		}
		if ctx.Err() != nil {
			return
		}
		wait := Backoff(failures, s.cfg.BackoffMin, s.cfg.BackoffMax, s.cfg.Jitter())
		s.cfg.Log.Info("rotation dial failed; the old socket streams on", "conn", s.id, "err", err, "wait", wait)
		if _, err := sleep(ctx, wait, nil); err != nil {
			return
		}
	}
}

// rotateAt is when a socket opened at opened rotates to stay within life: a little
// before the cap (a tenth of it, 1 s to 30 s, at most a quarter), plus up to as much
// again of jitter, so a fleet opened at once does not rotate at once.
func (s *Stream) rotateAt(opened time.Time, life time.Duration) time.Time {
	lead := min(max(life/10, time.Second), 30*time.Second, life/4)
	lead += time.Duration(s.cfg.Jitter() * float64(lead))
	return opened.Add(life - lead)
}
