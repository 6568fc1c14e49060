package stream

import (
	"bytes"
	"compress/flate"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/gorilla/websocket"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/worker/internal/sink"
)

var (
	errRotated   = errors.New("socket rotated")
	errAnnounced = errors.New("upstream announced its shutdown")
	errIdle      = errors.New("idle")
	// errIdleReconnected: the status of a connection that reconnected while idle.
	errIdleReconnected = errors.New("reconnected while idle; still no data message")
)

type frame struct {
	binary bool
	data   []byte
	over   bool // longer than the read limit: data holds its first ReadLimit bytes
	// decoded names the spec's decode that produced data; decodeErr says why the
	// frame did not decode (data is then the frame as it arrived).
	decoded   string
	decodeErr error
}

// readState is where a socket's reader stands in the upstream's numbering.
type readState struct {
	last  int64 // last sequence queued (a rotation's new socket starts from the old one's)
	epoch int64
	ref   bool // last is a real position, so gaps, jumps and resets can be judged against it
}

// readFrame reads one message, keeping at most limit bytes of it: the rest of an
// over-limit frame is read and discarded, so the socket stays usable and the frame
// is handled as a bad message rather than failing the socket (which would replay
// the same frame after every reconnect).
func readFrame(conn *websocket.Conn, limit int64) (frame, error) {
	kind, r, err := conn.NextReader()
	if err != nil {
		return frame{}, err
	}
	data, err := io.ReadAll(io.LimitReader(r, limit+1))
	var corrupt flate.CorruptInputError
	if errors.As(err, &corrupt) {
		// A permessage-deflate message that does not inflate: a bad message, not a
		// broken socket (the extension's messages are independent, as gorilla offers
		// no context takeover); the next NextReader skips the rest of it.
		return frame{binary: true, data: data, decodeErr: fmt.Errorf("%s message: %w", schema.DecodePermessageDeflate, err)}, nil
	}
	if err != nil {
		return frame{}, err
	}
	f := frame{binary: kind == websocket.BinaryMessage, data: data}
	if int64(len(data)) > limit {
		f.data, f.over = data[:limit], true
		if _, err := io.Copy(io.Discard, r); err != nil {
			return frame{}, err
		}
	}
	return f, nil
}

func classifyReadErr(err error) error {
	switch {
	case websocket.IsCloseError(err, websocket.ClosePolicyViolation):
		return &permanentError{fmt.Errorf("read: %w", err)}
	case websocket.IsCloseError(err, websocket.CloseGoingAway, websocket.CloseServiceRestart):
		return fmt.Errorf("read: %w (%w)", err, errAnnounced)
	}
	return fmt.Errorf("read: %w", err)
}

// read is the socket's only reader: it handles the frames kept by open, then the
// socket's, and queues data messages.
func (s *Stream) read(sock *socket, t *tracker, msgs chan<- sink.Message, rotate chan<- struct{}) error {
	conn := sock.conn
	conn.SetPongHandler(func(string) error {
		if sock.stopping.Load() {
			return nil
		}
		return sock.extendRead(s.cfg.PongWait)
	})
	spec := s.set.spec
	var pong, shutdown []byte
	if spec.Keepalive != nil {
		pong = []byte(spec.Keepalive.Pong)
	}
	if spec.ShutdownMatch != "" {
		shutdown = []byte(spec.ShutdownMatch)
	}
	pending := sock.pending
	sock.pending = nil
	if spec.Snapshot != nil && !s.snapshotAtConnect(sock, t, msgs) { // snapshot.go
		return nil
	}
	for {
		var f frame
		if len(pending) > 0 {
			f, pending[0] = pending[0], frame{}
			pending = pending[1:]
		} else {
			_ = sock.extendRead(s.cfg.PongWait)
			if sock.stopping.Load() {
				return errRotated
			}
			var err error
			f, err = readFrame(conn, s.cfg.ReadLimit)
			if err != nil {
				switch {
				case sock.stopping.Load():
					return errRotated
				case sock.closeBy.Load() != 0:
					// The upstream's close reply, or the close's deadline: everything it
					// sent before is queued. Only counter mode's rotator closes a socket
					// while the session goes on.
					return errCountedRotation
				}
				return classifyReadErr(err)
			}
			f = decodeFrame(f, spec.Decode, s.cfg.ReadLimit)
		}
		if !f.binary && !f.over {
			if len(pong) > 0 && bytes.Contains(f.data, pong) {
				sock.lastPong.Store(time.Now().UnixNano())
				continue
			}
			if len(shutdown) > 0 && bytes.Contains(f.data, shutdown) {
				s.cfg.Log.Info("upstream announced its shutdown; rotating", "conn", s.id)
				select {
				case rotate <- struct{}{}:
				default:
				}
				continue
			}
		}
		m, ok, err := t.next(f)
		if err != nil {
			return err
		}
		if ok && t.resync {
			t.resync = false
			m, ok = s.resync(sock, t, m, msgs)
		}
		if !ok {
			continue
		}
		if !m.Bad {
			s.lastData.Store(time.Now().UnixNano())
			if s.idle.CompareAndSwap(true, false) {
				s.cfg.Metrics.IdleNow.Add(-1)
				s.setStatus("streaming", nil)
			}
			sock.queued.Store(m.Seq)
		}
		select {
		case msgs <- m:
		case <-sock.done:
			return nil
		}
	}
}

// checkIdle sets status idle once no data message came for idle_timeout, and with
// idle_reconnect fails the session so the next one dials again.
func (s *Stream) checkIdle(sock *socket) error {
	spec := s.set.spec
	since := time.Since(time.Unix(0, s.lastData.Load()))
	if since < spec.IdleTimeout {
		return nil
	}
	err := fmt.Errorf("no data message for %s on a socket that asked to resume after %d", since.Truncate(time.Second), sock.from)
	if !sock.resumed {
		err = fmt.Errorf("no data message for %s since connecting at the upstream's latest", since.Truncate(time.Second))
	}
	if s.idle.CompareAndSwap(false, true) {
		s.cfg.Metrics.Idle.Add(1)
		s.cfg.Metrics.IdleNow.Add(1)
		s.setStatus(schema.StatusIdle, err)
		s.cfg.Log.Warn("connection idle", "conn", s.id, "err", err)
	}
	if spec.IdleReconnect {
		s.lastData.Store(time.Now().UnixNano()) // the next socket gets a full idle_timeout
		return fmt.Errorf("%w: %w; reconnecting (idle_reconnect)", errIdle, err)
	}
	return nil
}
