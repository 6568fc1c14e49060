package stream

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/gorilla/websocket"
	"github.com/sockfleet/sockfleet/shared/schema"
)

// writer is a socket's writer once its open messages are sent: pings, the spec's
// keepalive, the keepalive's pong check and the idle check. It is a timer, not a
// goroutine: each beat does what is due and arms the timer for the next due time.
// An idle socket therefore holds a timer instead of a goroutine parked in a select,
// whose stack (4 to 8 KiB) was the largest part of an idle connection's memory after
// the reader's (issue 11: at most 48 KiB per idle connection at 10,000).
//
// Beats never overlap: the timer is armed again only at the end of a beat, under mu.
// None runs after stop returns. The close frame is sent by closeSocket, after stop.
type writer struct {
	mu      sync.Mutex
	timer   *time.Timer
	stopped bool
	due     beats
	sentAt  int64 // unix ns of the keepalive whose pong is awaited; 0: none
}

// beats holds when each of a writer's duties is next due; a zero time: never.
type beats struct {
	ping, keepalive, pong, idle time.Time
}

// next is the earliest due time.
func (b beats) next() time.Time {
	t := b.ping
	for _, d := range []time.Time{b.keepalive, b.pong, b.idle} {
		if !d.IsZero() && (t.IsZero() || d.Before(t)) {
			t = d
		}
	}
	return t
}

// idleCheckEvery is how often a socket with an idle_timeout checks for idleness.
func idleCheckEvery(timeout time.Duration) time.Duration {
	return max(timeout/4, 100*time.Millisecond)
}

// startWriter arms sock's writer. Call after the open messages are sent.
func (s *Stream) startWriter(sock *socket) {
	w := &sock.w
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	w.due = beats{ping: now.Add(s.cfg.PingPeriod)}
	spec := s.set.spec
	if spec.Keepalive != nil {
		w.due.keepalive = now.Add(spec.Keepalive.Interval)
	}
	if spec.IdleTimeout > 0 {
		w.due.idle = now.Add(idleCheckEvery(spec.IdleTimeout))
	}
	// Held mu keeps a beat that fires at once from using the timer before it is set.
	w.timer = time.AfterFunc(time.Until(w.due.next()), func() { s.beat(sock) })
}

// stop ends the writer: no beat runs after it returns. A beat in progress (a ping or
// keepalive write is bounded by WriteWait) is waited for.
func (w *writer) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
	if w.timer != nil {
		w.timer.Stop()
	}
}

// beat does what is due and arms the next beat, unless the socket failed.
func (s *Stream) beat(sock *socket) {
	w := &sock.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	if !s.beatDue(sock, time.Now()) {
		w.stopped = true
		return
	}
	w.timer.Reset(time.Until(w.due.next()))
}

// beatDue does the duties due at now, and reports false when the socket failed (it
// is then closed, which unblocks the reader, and the reader reports the failure).
// Call with w.mu held.
func (s *Stream) beatDue(sock *socket, now time.Time) bool {
	w, conn := &sock.w, sock.conn
	ka := s.set.spec.Keepalive
	if !now.Before(w.due.ping) {
		if err := conn.WriteControl(websocket.PingMessage, nil, now.Add(s.cfg.WriteWait)); err != nil {
			conn.Close()
			return false
		}
		w.due.ping = now.Add(s.cfg.PingPeriod)
	}
	// The pong check comes before the next keepalive, which awaits a pong of its own.
	if !w.due.pong.IsZero() && !now.Before(w.due.pong) {
		if sock.lastPong.Load() < w.sentAt {
			s.cfg.Metrics.OpenFailures.Add(1)
			sock.fail(fmt.Errorf("%s: no reply containing %q within %s", schema.AttrKeepalive, ka.Pong, cmpOr(ka.PongTimeout, ka.Interval)))
			return false
		}
		w.sentAt, w.due.pong = 0, time.Time{}
	}
	if !w.due.keepalive.IsZero() && !now.Before(w.due.keepalive) {
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.WriteWait)
		msg, err := s.expand(ctx, ka.Message, s.LastSeq(), sock.dest, sock.tok)
		cancel()
		if err != nil {
			sock.fail(fmt.Errorf("%s: %w", schema.AttrKeepalive, err))
			return false
		}
		_ = conn.SetWriteDeadline(now.Add(s.cfg.WriteWait))
		if err := conn.WriteMessage(websocket.TextMessage, []byte(msg)); err != nil {
			conn.Close()
			return false
		}
		w.due.keepalive = now.Add(ka.Interval)
		if ka.Pong != "" && w.sentAt == 0 {
			w.sentAt = now.UnixNano()
			w.due.pong = now.Add(cmpOr(ka.PongTimeout, ka.Interval))
		}
	}
	if !w.due.idle.IsZero() && !now.Before(w.due.idle) {
		if err := s.checkIdle(sock); err != nil {
			sock.fail(err)
			return false
		}
		w.due.idle = now.Add(idleCheckEvery(s.set.spec.IdleTimeout))
	}
	return true
}

func cmpOr(a, b time.Duration) time.Duration {
	if a != 0 {
		return a
	}
	return b
}
