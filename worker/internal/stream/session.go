package stream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/worker/internal/sink"
)

// Secrets resolves the {{secret:…}} references of a spec (see package secrets) for
// the dial target dest ("host:port") the value goes out to, refusing a secret its
// owner did not allow there with an error wrapping schema.ErrInvalid. Errors must
// not contain secret values.
type Secrets interface {
	Resolve(ctx context.Context, ref schema.SecretRef, dest string) (string, error)
	Forget(name string)
}

// settings is one connection's effective configuration: the fleet's, overridden by
// the connection's spec.
type settings struct {
	resume   Resume
	seqPath  SeqPath
	bad      BadPolicy
	seqReset string
	maxJump  int64
	spec     schema.Spec
}

func (c *Config) defaults() *settings {
	return &settings{resume: c.Resume, seqPath: c.SeqPath, bad: c.BadMessages, seqReset: c.SeqReset, maxJump: c.MaxSeqJump}
}

// UseSpec applies a connection's spec over the fleet defaults, and the epoch its
// item records. Call before Run. The spec was validated by the codec; an error here
// means the two disagree, and the connection must not stream.
func (s *Stream) UseSpec(sp schema.Spec, epoch int64) error {
	if err := sp.Validate(); err != nil {
		return err
	}
	set := s.cfg.defaults()
	set.spec = sp
	var err error
	if sp.Resume != "" {
		if set.resume, err = ParseResume(sp.Resume); err != nil {
			return err
		}
	}
	if sp.SeqPath != "" {
		if set.seqPath, err = ParseSeqPath(sp.SeqPath); err != nil {
			return err
		}
	}
	if sp.BadMessages != "" {
		if set.bad, err = ParseBadPolicy(sp.BadMessages); err != nil {
			return err
		}
	}
	if sp.SeqReset != "" {
		set.seqReset = sp.SeqReset
	}
	if sp.MaxSeqJump != 0 {
		set.maxJump = sp.MaxSeqJump
	}
	s.set = set
	p := s.position()
	p.Epoch = epoch
	s.pos.Store(&p)
	return nil
}

// Halted returns why the stream stopped itself (a sequence reset under the halt
// policy), or nil.
func (s *Stream) Halted() error {
	if p := s.halted.Load(); p != nil {
		return *p
	}
	return nil
}

var (
	errRotated   = errors.New("socket rotated")
	errAnnounced = errors.New("upstream announced its shutdown")
	errIdle      = errors.New("idle")
	// errIdleReconnected: the status of a connection that reconnected while idle.
	errIdleReconnected = errors.New("reconnected while idle; still no data message")
)

// haltError is a sequence reset under the halt policy: the stream stops for the
// operator to decide.
type haltError struct{ seq, last, from int64 }

func (e *haltError) Error() string {
	return fmt.Sprintf("sequence reset: seq %d after %d (asked to resume after %d); halted by seq_reset=halt", e.seq, e.last, e.from)
}

// socket is one dialed upstream socket.
type socket struct {
	conn    *websocket.Conn
	dest    string  // the dial target, host:port: the only place its secrets may go
	from    int64   // the resume point asked for: the counter's base
	resumed bool    // a resume point was asked for (false: start at the upstream's latest)
	pending []frame // frames read while awaiting open-message replies, handled first
	opened  time.Time

	started    bool
	readErr    chan error
	readerDone chan struct{}
	done       chan struct{} // closed when the socket closes: the reader stops queueing
	w          writer        // pings and the keepalive, on a timer (see writer.go)
	stopping   atomic.Bool   // the reader is to stop: the stream rotates to another socket
	failure    atomic.Pointer[error]
	lastPong   atomic.Int64 // unix ns
	queued     atomic.Int64 // last sequence the reader queued
	final      readState    // the reader's state when it returned; read after readErr
}

func (k *socket) fail(err error) {
	k.failure.CompareAndSwap(nil, &err)
	k.conn.Close() // unblocks the reader, which reports the failure
}

// stopReading makes the reader return errRotated without reading further.
func (k *socket) stopReading() {
	k.stopping.Store(true)
	_ = k.conn.SetReadDeadline(time.Now())
}

type frame struct {
	binary bool
	data   []byte
	over   bool // longer than the read limit: data holds its first ReadLimit bytes
}

// readState is where a socket's reader stands in the upstream's numbering.
type readState struct {
	last  int64 // last sequence queued (a rotation's new socket starts from the old one's)
	epoch int64
	ref   bool // last is a real position, so gaps, jumps and resets can be judged against it
}

// session runs a connection until it fails or ctx ends: dial, open, read and
// deliver, and rotate to a new socket (make-before-break) at max_lifetime or when the
// upstream announces its shutdown.
func (s *Stream) session(ctx context.Context) error {
	pos := s.position()
	from, resumed := pos.Seq, true
	if pos.Seq == 0 && pos.Epoch == 0 {
		from, resumed = s.set.spec.StartSeq() // first connect: the spec's start
	}
	sock, err := s.connect(ctx, from, resumed)
	if err != nil {
		return err
	}
	s.lastData.Store(time.Now().UnixNano())
	if s.idle.Load() {
		// Still idle (idle_reconnect, or any reconnect while idle): say so again, as
		// the dial's own statuses replaced it; data clears it as on any socket.
		s.setStatus(schema.StatusIdle, errIdleReconnected)
	} else {
		s.setStatus("streaming", nil)
	}
	s.cfg.Log.Debug("upstream connected", "conn", s.id, "from", from, "resumed", resumed)

	// A short queue: a deep one costs memory on every idle socket (a Message is ~64 bytes).
	msgs := make(chan sink.Message, min(s.cfg.BatchSize, 32))
	s.queue = msgs
	defer s.setQueued(0)
	st := readState{last: from, epoch: pos.Epoch, ref: from > 0 || pos.Epoch > 0}
	rotate := make(chan struct{}, 1)
	for {
		s.start(sock, st, msgs, rotate)
		next := make(chan *socket, 1)
		rctx, rcancel := context.WithCancel(ctx)
		var rwg sync.WaitGroup
		if s.set.spec.MaxLifetime > 0 || s.set.spec.ShutdownMatch != "" {
			// Only then: an idle socket without rotation costs no third goroutine.
			rwg.Go(func() { s.rotator(rctx, sock, rotate, next) })
		}
		err = s.deliver(ctx, msgs, sock.readErr)
		rcancel()
		rwg.Wait()
		var fresh *socket
		select {
		case fresh = <-next:
		default:
		}
		if f := sock.failure.Load(); f != nil && !errors.Is(err, errRotated) {
			err = *f
		}
		if errors.Is(err, errRotated) && fresh != nil && ctx.Err() == nil {
			// Everything the old reader queued is delivered; the new socket, resumed
			// from the last delivered sequence, skips what the old one already gave.
			st = sock.final
			s.closeSocket(sock)
			s.cfg.Metrics.Rotations.Add(1)
			s.cfg.Metrics.Overlap.Add(-1)
			sock = fresh
			continue
		}
		graceful := ctx.Err() != nil && errors.Is(context.Cause(ctx), ErrGraceful)
		var cut Cutter
		if graceful && errors.As(context.Cause(ctx), &cut) {
			// Deliver what was read, then cut, then close: what the reader queues
			// meanwhile is not delivered here (the next owner resumes after the cut).
			s.flushQueued(ctx, msgs)
			cut.Cut()
			graceful = false
		}
		s.closeSocket(sock)
		if fresh != nil {
			s.closeSocket(fresh)
			s.cfg.Metrics.Overlap.Add(-1)
		}
		if graceful {
			s.flushQueued(ctx, msgs)
		}
		return err
	}
}

// connect dials, sends the open messages and awaits their replies.
func (s *Stream) connect(ctx context.Context, from int64, resumed bool) (*socket, error) {
	raw := s.URL()
	dest, err := dialAddr(raw)
	if err != nil {
		return nil, err
	}
	if err := s.checkSecrets(ctx, dest); err != nil {
		return nil, err // not dialed: no secret leaves for a host its owner did not allow
	}
	conn, err := s.dial(ctx, raw, dest, from, resumed)
	if err != nil {
		return nil, err
	}
	sock := &socket{conn: conn, dest: dest, from: from, resumed: resumed, opened: time.Now()}
	s.sockets.Add(1)
	if err := s.open(ctx, sock); err != nil {
		s.cfg.Metrics.OpenFailures.Add(1)
		s.closeSocket(sock)
		return nil, err
	}
	sock.lastPong.Store(time.Now().UnixNano())
	return sock, nil
}

// dial makes the handshake to raw (at dest): resume point, the spec's headers
// (secrets substituted) and subprotocols, after the per-host connect quota admits it.
func (s *Stream) dial(ctx context.Context, raw, dest string, from int64, resumed bool) (*websocket.Conn, error) {
	target, hdr := raw, http.Header{}
	if resumed {
		t, h, err := s.set.resume.Apply(raw, from)
		if err != nil {
			return nil, &permanentError{err}
		}
		target = t
		for k, v := range h {
			hdr[k] = v
		}
	}
	spec := s.set.spec
	for k, v := range spec.Headers {
		val, err := s.expand(ctx, v, from, dest)
		if err != nil {
			return nil, fmt.Errorf("header %s: %w", k, err)
		}
		if hdr.Get(k) == "" {
			hdr.Set(k, val)
		}
	}
	admitted, err := s.waitQuota(ctx, target)
	if err != nil {
		return nil, err
	}
	d := *s.cfg.Dialer
	d.Subprotocols = spec.Subprotocols
	dctx, cancel := context.WithTimeout(ctx, s.cfg.HandshakeTimeout)
	conn, resp, err := d.DialContext(dctx, target, hdr)
	cancel()
	admitted()
	if err == nil {
		return conn, nil
	}
	s.cfg.Metrics.DialFailures.Add(1)
	if resp == nil {
		return nil, fmt.Errorf("dial: %w", err)
	}
	code := resp.StatusCode
	err = fmt.Errorf("dial: handshake status %d: %w", code, err)
	if (code == http.StatusUnauthorized || code == http.StatusForbidden) && s.forgetSecrets() {
		// The credential may have been rotated: the next dial reads it again, and this
		// failure is not treated as permanent.
		return nil, err
	}
	if code >= 400 && code < 500 && code != http.StatusRequestTimeout && code != http.StatusTooManyRequests {
		return nil, &permanentError{err}
	}
	return nil, err
}

// forgetSecrets drops the cached values of every secret the spec references, and
// reports whether there were any.
func (s *Stream) forgetSecrets() bool {
	if s.cfg.Secrets == nil {
		return false
	}
	any := false
	forget := func(v string) {
		for _, r := range schema.SecretRefs(v) {
			s.cfg.Secrets.Forget(r.Name)
			any = true
		}
	}
	for _, v := range s.set.spec.Headers {
		forget(v)
	}
	for _, m := range s.set.spec.OpenMessages {
		forget(m.Text)
	}
	return any
}

// waitQuota waits for the host's connect quota and returns the function to call
// when the dial ends.
func (s *Stream) waitQuota(ctx context.Context, target string) (func(), error) {
	if s.cfg.Quota == nil {
		return func() {}, nil
	}
	host := target
	if u, err := url.Parse(target); err == nil {
		host = strings.ToLower(u.Hostname())
	}
	prev := s.Status()
	s.cfg.Metrics.QuotaWaiting.Add(1)
	defer s.cfg.Metrics.QuotaWaiting.Add(-1)
	if slot, d := s.cfg.Quota.reserve(host, time.Now()); d == 0 {
		return func() { s.cfg.Quota.release(host, slot, time.Now()) }, nil
	}
	s.cfg.Metrics.QuotaWaits.Add(1)
	s.setStatus(schema.StatusQuotaWait, fmt.Errorf("waiting for the connect quota of %s (%d per %s)", host, s.cfg.Quota.N, s.cfg.Quota.W))
	done, _, err := s.cfg.Quota.Wait(ctx, host)
	s.status.Store(&prev)
	return done, err
}

// expand fills a template sent to dest: {seq} (the resume point), {next} ({seq}+1),
// {conn} (the connection id), then {{secret:…}} references.
func (s *Stream) expand(ctx context.Context, v string, seq int64, dest string) (string, error) {
	v = s.placeholders(v, seq)
	if !strings.Contains(v, "{{secret:") {
		return v, nil
	}
	if s.cfg.Secrets == nil {
		return "", errors.New("the spec references a secret but the worker has no secrets source")
	}
	out, err := schema.ReplaceSecrets(v, func(r schema.SecretRef) (string, error) {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return s.cfg.Secrets.Resolve(rctx, r, dest)
	})
	if err != nil {
		s.cfg.Metrics.SecretErrors.Add(1)
		return "", fmt.Errorf("resolve secret: %w", err)
	}
	return out, nil
}

// open sends the spec's open messages in order, each awaiting its reply if it
// expects one. Frames that are not the awaited reply are kept for the reader.
func (s *Stream) open(ctx context.Context, sock *socket) error {
	msgs := s.set.spec.OpenMessages
	if len(msgs) == 0 {
		return nil
	}
	conn := sock.conn
	stop := context.AfterFunc(ctx, func() { _ = conn.NetConn().SetDeadline(time.Now()) })
	defer stop()
	for i, m := range msgs {
		kind, data := websocket.BinaryMessage, m.Binary
		if !m.IsBinary {
			text, err := s.expand(ctx, m.Text, sock.from, sock.dest)
			if err != nil {
				return fmt.Errorf("%s[%d]: %w", schema.AttrOpenMessages, i, err)
			}
			kind, data = websocket.TextMessage, []byte(text)
		}
		_ = conn.SetWriteDeadline(time.Now().Add(s.cfg.WriteWait))
		if err := conn.WriteMessage(kind, data); err != nil {
			return fmt.Errorf("%s[%d]: send: %w", schema.AttrOpenMessages, i, err)
		}
		if !m.Awaits() {
			continue
		}
		wait := m.Timeout
		if wait == 0 {
			wait = schema.DefaultOpenWait
		}
		deadline := time.Now().Add(wait)
		for {
			_ = conn.SetReadDeadline(deadline)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			f, err := readFrame(conn, s.cfg.ReadLimit)
			if err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() && ctx.Err() == nil {
					return fmt.Errorf("%s[%d]: no reply %s within %s", schema.AttrOpenMessages, i, describe(m), wait)
				}
				return fmt.Errorf("%s[%d]: awaiting reply: %w", schema.AttrOpenMessages, i, classifyReadErr(err))
			}
			if replyMatches(m, f) {
				break
			}
			if len(sock.pending) >= 1024 {
				return fmt.Errorf("%s[%d]: 1024 frames without the reply %s", schema.AttrOpenMessages, i, describe(m))
			}
			sock.pending = append(sock.pending, f)
		}
	}
	return nil
}

func describe(m schema.OpenMessage) string {
	if m.ExpectField != "" {
		return "with " + m.ExpectField
	}
	return fmt.Sprintf("containing %q", m.Expect)
}

// replyMatches reports whether f is the reply m awaits.
func replyMatches(m schema.OpenMessage, f frame) bool {
	if m.Expect != "" && !bytes.Contains(f.data, []byte(m.Expect)) {
		return false
	}
	if m.ExpectField != "" {
		path, want, _ := strings.Cut(m.ExpectField, "=")
		p, _ := ParseSeqPath(path)
		got, ok := p.field(f.data)
		if !ok {
			return false
		}
		var str string
		if json.Unmarshal(got, &str) == nil {
			return str == want
		}
		return string(bytes.TrimSpace(got)) == want
	}
	return true
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

// rotator replaces sock, make-before-break, shortly before max_lifetime or when
// the reader saw the upstream announce its shutdown: it dials and opens a new socket
// while the old one streams on, hands it over on next, then stops the old reader.
func (s *Stream) rotator(ctx context.Context, sock *socket, rotate <-chan struct{}, next chan<- *socket) {
	var due <-chan time.Time
	if life := s.set.spec.MaxLifetime; life > 0 {
		// Rotate a little before the cap (a tenth of it, 1 s to 30 s, at most a quarter),
		// plus up to as much again of jitter, so a fleet opened at once does not
		// rotate at once.
		lead := min(max(life/10, time.Second), 30*time.Second, life/4)
		lead += time.Duration(s.cfg.Jitter() * float64(lead))
		t := time.NewTimer(time.Until(sock.opened.Add(life - lead)))
		defer t.Stop()
		due = t.C
	}
	select {
	case <-ctx.Done():
		return
	case <-due:
	case <-rotate:
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
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// read is the socket's only reader: it handles the frames kept by open, then the
// socket's, and queues data messages.
func (s *Stream) read(sock *socket, t *tracker, msgs chan<- sink.Message, rotate chan<- struct{}) error {
	conn := sock.conn
	conn.SetPongHandler(func(string) error {
		if sock.stopping.Load() {
			return nil
		}
		return conn.SetReadDeadline(time.Now().Add(s.cfg.PongWait))
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
	for {
		var f frame
		if len(pending) > 0 {
			f, pending[0] = pending[0], frame{}
			pending = pending[1:]
		} else {
			_ = conn.SetReadDeadline(time.Now().Add(s.cfg.PongWait))
			if sock.stopping.Load() {
				return errRotated
			}
			var err error
			if f, err = readFrame(conn, s.cfg.ReadLimit); err != nil {
				if sock.stopping.Load() {
					return errRotated
				}
				return classifyReadErr(err)
			}
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
