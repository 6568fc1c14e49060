package stream

import (
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	"github.com/sockfleet/sockfleet/worker/internal/sink"
)

// socket is one dialed upstream socket.
type socket struct {
	conn    *websocket.Conn
	dest    string  // the dial target, host:port: the only place its secrets may go
	from    int64   // the resume point asked for: the counter's base
	resumed bool    // a resume point was asked for (false: start at the upstream's latest)
	pending []frame // frames read while awaiting open-message replies, handled first
	tok     *token  // the token_request answer the socket was dialed with; nil without one
	opened  time.Time

	started    bool
	readErr    chan error
	readerDone chan struct{}
	done       chan struct{} // closed when the socket closes: the reader stops queueing
	w          writer        // pings and the keepalive, on a timer (see writer.go)
	stopping   atomic.Bool   // the reader is to stop: the stream rotates to another socket
	closeBy    atomic.Int64  // unix ns; set once this side sent the close frame: the reader's deadline
	failure    atomic.Pointer[error]
	lastPong   atomic.Int64 // unix ns
	queued     atomic.Int64 // last sequence the reader queued
	final      readState    // the reader's state when it returned; read after readErr
}

func (k *socket) fail(err error) {
	k.failure.CompareAndSwap(nil, &err)
	k.conn.Close() // unblocks the reader, which reports the failure
}

// extendRead moves the read deadline to d from now, unless this side began the close
// handshake: then the deadline stays the close's (beginClose). Checked after the
// move, so a close begun meanwhile still wins.
func (k *socket) extendRead(d time.Duration) error {
	err := k.conn.SetReadDeadline(time.Now().Add(d))
	if by := k.closeBy.Load(); by != 0 {
		err = k.conn.SetReadDeadline(time.Unix(0, by))
	}
	return err
}

// stopReading makes the reader return errRotated without reading further.
func (k *socket) stopReading() {
	k.stopping.Store(true)
	_ = k.conn.SetReadDeadline(time.Now())
}

// start runs sock's reader goroutine and arms its writer.
func (s *Stream) start(sock *socket, st readState, msgs chan<- sink.Message, rotate chan<- struct{}) {
	sock.started = true
	sock.readErr = make(chan error, 1)
	sock.readerDone = make(chan struct{})
	sock.done = make(chan struct{})
	sock.queued.Store(st.last)
	go func() {
		defer close(sock.readerDone)
		t := &tracker{s: s, sock: sock, st: st, counter: sock.from, first: true}
		err := s.read(sock, t, msgs, rotate)
		sock.final = t.st
		sock.readErr <- err
	}()
	s.startWriter(sock)
}

// closeSocket stops the writer, sends the close frame, waits up to CloseWait for
// the upstream's reply (so the upstream sees a clean close, not 1006), then closes
// the socket and waits for its reader.
func (s *Stream) closeSocket(sock *socket) {
	defer s.sockets.Add(-1)
	if sock.started {
		sock.w.stop() // no ping or keepalive after the close frame
		close(sock.done)
	}
	_ = sock.conn.WriteControl(websocket.CloseMessage,
		websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(s.cfg.CloseWait))
	if !sock.started {
		sock.conn.Close()
		return
	}
	t := time.NewTimer(s.cfg.CloseWait)
	select {
	case <-sock.readerDone:
	case <-t.C:
	}
	t.Stop()
	sock.conn.Close()
	<-sock.readerDone
}
