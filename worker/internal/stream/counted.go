package stream

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gorilla/websocket"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/worker/internal/sink"
)

// Counter mode: a connection without a sequence path numbers its messages by
// counting them from the socket's resume point. A second socket's count means
// something only if the upstream resumed exactly there; one that ignores the resume
// point and streams from its live head numbers nothing, and no count says where its
// messages fall against the first socket's. Aligning two sockets by count would
// drop, as "already delivered", fresh messages read during the new socket's dial.
// So counter mode never overlaps two sockets: a rotation closes the old socket
// before it dials (the session reads to the upstream's close reply and delivers what
// came before it), a graceful stop does the same, and a planned handoff is a
// release-then-acquire (MakeBeforeBreak). The cost against a live-head upstream is a
// gap of about one dial (what it produced while no socket was open), which the
// status says; an upstream that does resume from the count loses nothing.

// ErrCounted is why a counter-mode connection cannot be handed over make-before-break.
var ErrCounted = errors.New("counter mode (no seq_path): a standby's count cannot be aligned with the old owner's, so the handoff is break-before-make")

// errCountedRotation ends a counter-mode session the rotator closed; Run dials again
// at once.
var errCountedRotation = errors.New("counter mode (no seq_path): socket rotated break-before-make")

// MakeBeforeBreak says why a connection with spec sp cannot be taken over by a
// second socket opened before the first closes (a planned handoff's standby), or
// nil: the upstream cannot resume (resume none), or the sequence is a count.
func (c *Config) MakeBeforeBreak(sp schema.Spec) error {
	r, p := c.Resume, c.SeqPath
	var err error
	if sp.Resume != "" {
		if r, err = ParseResume(sp.Resume); err != nil {
			return err
		}
	}
	if sp.SeqPath != "" {
		if p, err = ParseSeqPath(sp.SeqPath); err != nil {
			return err
		}
	}
	switch {
	case r.Kind == "none":
		return errors.New("resume none: the upstream cannot resume, so the handoff is a release-then-acquire")
	case p.Counter():
		return ErrCounted
	}
	return nil
}

// countedResume is the status of a counter-mode socket that resumed after a count
// (a reconnect, a rotation, a new owner): the position it asked for is a count.
func countedResume(from int64) error {
	return fmt.Errorf("counter mode (no seq_path): resumed after message %d by count, break-before-make; "+
		"an upstream that ignores the resume point did not send what it produced while no socket was open", from)
}

// beginClose sends sock's close frame and lets its reader read on until the
// upstream's close reply, or CloseWait: everything the upstream sent before its
// reply is read and queued. Safe to call from any goroutine, once or more.
func (s *Stream) beginClose(sock *socket) {
	by := time.Now().Add(s.cfg.CloseWait)
	if !sock.closeBy.CompareAndSwap(0, by.UnixNano()) {
		return
	}
	sock.w.stop() // no ping or keepalive after the close frame
	_ = sock.conn.WriteControl(websocket.CloseMessage,
		websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), by)
	_ = sock.conn.SetReadDeadline(by)
}

// closeAndDeliver ends a counter-mode socket on a graceful stop: it sends the close
// frame and delivers what the reader reads until the upstream's reply (or
// CloseWait), so the next socket, which cannot skip by number, starts where this
// one's upstream stopped sending. A failed sink write stops it: the rest is not
// acknowledged, and last_seq stays at what was.
func (s *Stream) closeAndDeliver(ctx context.Context, sock *socket, msgs chan sink.Message) {
	s.beginClose(sock)
	var batch []sink.Message
	for {
		select {
		case m := <-msgs:
			batch = s.fill(batch[:0], m, msgs)
			err := s.sinkWrite(ctx, batch)
			batch = drop(batch)
			if err != nil {
				return
			}
		case <-sock.readerDone:
			s.flushQueued(ctx, msgs)
			return
		}
	}
}
