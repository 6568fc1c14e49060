// Package stream runs one upstream WebSocket connection: dial resuming after the last
// acknowledged sequence, read, hand messages to the sink, and reconnect with
// exponential backoff and jitter when the upstream refuses or drops it.
//
// Guarantees: one reader goroutine per socket and one writer at a time (the open
// messages from the connecting goroutine, then pings and the keepalive from the
// socket's timer, never two at once), with ping/pong deadlines, a read limit and a
// handshake timeout; LastSeq only moves after the sink acknowledged; Run returns
// only after every goroutine it started has exited and no socket timer can fire. A
// malformed frame is counted and handled by the BadPolicy; it never stops the stream.
// In counter mode (no sequence path) a connection never has two sockets: a rotation
// or a graceful stop sends the close frame and delivers what the upstream sent until
// its close reply (within CloseWait), and the next socket resumes after the count.
//
// Non-guarantee: in counter mode, what an upstream that ignores the resume point
// produced while no socket was open (about one dial) is never received, and what one
// that replays from before the count sends again is delivered again under new
// numbers; the status says the position is a count.
//
// Non-guarantee: this package knows nothing of leases. Its caller (the ownership
// loop) cancels Run's context when the lease is lost, fenced, stopped or drained.
//
// Files: stream.go runs the reconnect loop and a session's sockets; dial.go makes
// the handshake and sends the open messages; socket.go starts and closes a socket;
// reader.go is a socket's one reader, writer.go its timer-driven writer; deliver.go
// writes batches to the sink; rotation.go replaces a socket make-before-break;
// counted.go holds what counter mode (no sequence path) does instead: break-before-
// make, reading each socket to the upstream's close reply; seq.go follows the
// upstream's numbering; gate.go admits dials per host (the connect quota, shared by
// the fleet through the table) and ratelimit.go honours a 429's Retry-After;
// config.go and factory.go hold the settings and make a worker's streams. token.go
// makes the spec's token_request before each dial (and its refresh while a socket
// lives), snapshot.go its snapshot after each connect and gap, both through rest.go,
// which bounds them per host.
package stream

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/worker/internal/sink"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// ErrGraceful marks a cancellation cause after which messages already read are still
// delivered (stop, drain). Any other cause (lost lease, self-fence) drops them: the
// connection is no longer ours to deliver.
var ErrGraceful = errors.New("graceful stop")

// Cutter is a graceful cause that acts once the last message is delivered, before
// the socket's close handshake: a planned handoff transfers the lease there, so the
// new owner does not wait for the old socket's round trip to the upstream. Cut runs
// on the stream's goroutine, after the final delivery and before Run returns.
type Cutter interface {
	error
	Cut()
}

// Backoff returns the wait before attempt n (0-based) of a run of failures: an
// exponential step from min capped at cap, with "equal jitter" (half fixed, half
// random) so a fleet that lost an upstream at once does not come back at once.
func Backoff(n int, min, cap time.Duration, jitter float64) time.Duration {
	d := min
	for i := 0; i < n && d < cap; i++ {
		d *= 2
	}
	d = min2(d, cap)
	return d/2 + time.Duration(jitter*float64(d/2))
}

func min2(a, b time.Duration) time.Duration {
	if a < b {
		return a
	}
	return b
}

// Status is a stream's observed state, folded into lease writes.
type Status struct {
	// connecting, streaming, sink_slow (a sink write is holding it back), backoff,
	// invalid (not dialed: the item is unusable as written), or a schema.Status*.
	State string
	Error string
}

// Stream is one connection's runner. Create it with New, run it with Run.
type Stream struct {
	id  string
	cfg *Config

	pos    atomic.Pointer[Position] // last sequence (and its epoch) the sink acknowledged
	url    atomic.Pointer[string]
	status atomic.Pointer[Status]
	redial chan struct{} // the URL changed: drop the socket and dial the new one now
	valid  func() bool   // nil, or false once the lease is past its fence deadline
	// version is the lease_version every message carries (its fencing token); an
	// owner's lease keeps one version for the stream's life (a new one means a new stream).
	version int64

	queue    chan sink.Message     // the session's queue; used by Run's goroutine only
	queued   int64                 // this stream's share of Metrics.SinkQueued (Run's goroutine only)
	set      *settings             // the connection's effective settings (fleet defaults + spec)
	halted   atomic.Pointer[error] // set when a seq_reset "halt" stopped the stream
	lastData atomic.Int64          // unix ns of the last data frame read
	idle     atomic.Bool           // status says idle
	opened   atomic.Bool           // some session got past its open messages
	traced   atomic.Bool           // a socket opened: later dials get no spans (dial.go)
	// sessSpan is the connection's session span (from Run's context): rotations and
	// sequence resets are its events, and the first delivery is marked on it once.
	sessSpan  trace.Span
	delivered atomic.Bool  // the first delivery was marked
	sockets   atomic.Int64 // sockets open now (2 while rotating)
}

// sessionSpan is the connection's session span (a no-op one before Run).
func (s *Stream) sessionSpan() trace.Span {
	if s.sessSpan == nil {
		return trace.SpanFromContext(context.Background())
	}
	return s.sessSpan
}

// GuardWith makes every sink write first ask valid, on the owner's monotonic clock,
// whether the lease still holds. Call before Run.
func (s *Stream) GuardWith(valid func() bool) { s.valid = valid }

// New returns a stream for connection id, resuming after lastSeq.
func New(cfg *Config, id, rawURL string, lastSeq int64) *Stream {
	s := &Stream{id: id, cfg: cfg, redial: make(chan struct{}, 1)}
	s.pos.Store(&Position{Seq: lastSeq})
	s.set = cfg.defaults()
	s.url.Store(&rawURL)
	s.status.Store(&Status{State: "connecting"})
	return s
}

// LastSeq is the last sequence the sink acknowledged.
func (s *Stream) LastSeq() int64 { return s.pos.Load().Seq }

// Epoch is the sequence epoch of LastSeq.
func (s *Stream) Epoch() int64 { return s.pos.Load().Epoch }

// Position is a resume point: a sequence and the epoch of the upstream's numbering
// it belongs to.
type Position struct{ Seq, Epoch int64 }

func (s *Stream) position() Position { return *s.pos.Load() }

// Status returns the current status.
func (s *Stream) Status() Status { return *s.status.Load() }

// URL returns the URL the stream dials.
func (s *Stream) URL() string { return *s.url.Load() }

// SetURL switches the stream to a new upstream URL: the socket is closed and the new
// URL dialed at once, resuming after LastSeq.
func (s *Stream) SetURL(u string) {
	if old := s.url.Swap(&u); *old == u {
		return
	}
	select {
	case s.redial <- struct{}{}:
	default:
	}
}

func (s *Stream) setStatus(state string, err error) {
	st := Status{State: state}
	if err != nil {
		st.Error = err.Error()
		if len(st.Error) > 300 {
			st.Error = st.Error[:300]
		}
	}
	s.status.Store(&st)
}

// Run dials and streams until ctx is cancelled, reconnecting with backoff. When it
// returns, every message it acknowledged is reflected in LastSeq and all its
// goroutines have exited.
func (s *Stream) Run(ctx context.Context) {
	s.sessSpan = trace.SpanFromContext(ctx)
	defer func() {
		if s.idle.Swap(false) {
			s.cfg.Metrics.IdleNow.Add(-1)
		}
	}()
	failures, rotated := 0, false
	for dials := 0; ; dials++ {
		if ctx.Err() != nil || (s.valid != nil && !s.valid()) {
			return // past the fence: the owner cancels ctx and gives the lease up
		}
		if dials > 0 && !rotated {
			s.cfg.Metrics.Reconnects.Add(1)
		}
		rotated = false
		s.setStatus("connecting", nil)
		start := time.Now()
		err := s.session(ctx)
		if ctx.Err() != nil {
			return
		}
		var halt *haltError
		if errors.As(err, &halt) {
			s.halted.Store(&err)
			s.setStatus(schema.StatusSeqReset, err)
			s.cfg.Log.Warn("upstream numbering reset; halted as the spec asks", "conn", s.id, "err", err)
			return // the owner releases with status seq_reset
		}
		if errors.Is(err, errCountedRotation) {
			failures, rotated = 0, true // counter mode's rotation: closed; dial the next now
			continue
		}
		stable := time.Since(start) >= s.cfg.StableAfter
		if errors.Is(err, errRedial) || (stable && errors.Is(err, errAnnounced)) {
			failures = 0 // dial the new URL, or replace an announced shutdown, at once
			continue
		}
		if stable {
			failures = 0
		}
		cap, state := s.cfg.BackoffMax, "backoff"
		var perm *permanentError
		if errors.As(err, &perm) {
			cap = s.cfg.PermanentBackoffMax
		}
		if errors.Is(err, schema.ErrInvalid) {
			// Unusable as written (a secret its owner did not allow to the URL's host):
			// nothing was dialed. Looked at again rarely, so fixing the allowance heals it.
			cap, state = s.cfg.PermanentBackoffMax, schema.StatusInvalid
		}
		wait := Backoff(failures, s.cfg.BackoffMin, cap, s.cfg.Jitter())
		failures++
		var limited *rateLimitedError
		if errors.As(err, &limited) {
			// No sooner than the upstream asked (its Retry-After), nor than the
			// backoff: a run of 429s saying "Retry-After: 0" still backs off.
			state = schema.StatusRateLimited
			wait = max(wait, time.Until(limited.until))
		}
		s.setStatus(state, err)
		s.cfg.Log.Info("upstream disconnected; backing off", "conn", s.id, "status", state, "err", err, "wait", wait)
		woken, err := sleep(ctx, wait, s.redial)
		if err != nil {
			return
		}
		if woken {
			failures = 0 // a new URL: dial it now
		}
	}
}

var errRedial = errors.New("upstream URL changed")

// sleep waits d, or less if wake fires first (woken; a nil wake never does). It
// returns ctx's error if ctx ends first.
func sleep(ctx context.Context, d time.Duration, wake <-chan struct{}) (woken bool, err error) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false, ctx.Err()
	case <-wake:
		return true, nil
	case <-t.C:
		return false, nil
	}
}

// Halted returns why the stream stopped itself (a sequence reset under the halt
// policy), or nil.
func (s *Stream) Halted() error {
	if p := s.halted.Load(); p != nil {
		return *p
	}
	return nil
}

// haltError is a sequence reset under the halt policy: the stream stops for the
// operator to decide.
type haltError struct{ seq, last, from int64 }

func (e *haltError) Error() string {
	return fmt.Sprintf("sequence reset: seq %d after %d (asked to resume after %d); halted by seq_reset=halt", e.seq, e.last, e.from)
}

// session runs a connection until it fails or ctx ends: dial, open, read and
// deliver, and rotate to a new socket (make-before-break) at max_lifetime or when the
// upstream announces its shutdown; in counter mode the rotation closes the socket and
// the session ends with errCountedRotation, for Run to dial the next at once.
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
	} else if s.set.seqPath.Counter() && resumed && (pos.Seq > 0 || pos.Epoch > 0) {
		s.setStatus("streaming", countedResume(from)) // where it resumed is a count, not a known place
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
		if s.set.spec.MaxLifetime > 0 || s.set.spec.ShutdownMatch != "" || sock.tok != nil {
			// Only then: an idle socket without rotation costs no third goroutine.
			rwg.Go(func() { s.rotator(rctx, sock, rotate, next) })
		}
		if sock.tok != nil && s.set.spec.TokenRequest.Refresh != nil {
			rwg.Go(func() { s.refresher(rctx, sock, rotate) }) // token.go
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
			s.sessionSpan().AddEvent("rotation", trace.WithAttributes(attribute.Int64("sockfleet.last_seq", s.LastSeq())))
			s.cfg.Metrics.Overlap.Add(-1)
			sock = fresh
			continue
		}
		if errors.Is(err, errCountedRotation) && ctx.Err() == nil {
			s.cfg.Metrics.Rotations.Add(1) // closed and read to its end; Run dials the next
			s.sessionSpan().AddEvent("rotation", trace.WithAttributes(attribute.Int64("sockfleet.last_seq", s.LastSeq()),
				attribute.Bool("sockfleet.counter_mode", true)))
		}
		graceful := ctx.Err() != nil && errors.Is(context.Cause(ctx), ErrGraceful)
		var cut Cutter
		switch {
		case graceful && errors.As(context.Cause(ctx), &cut):
			// Deliver what was read, then cut, then close: what the reader queues
			// meanwhile is not delivered here (the next owner resumes after the cut).
			s.flushQueued(ctx, msgs)
			cut.Cut()
			graceful = false
		case graceful && s.set.seqPath.Counter():
			// The next socket cannot skip by count what this one read: read to the
			// upstream's close reply and deliver it all (counted.go).
			s.closeAndDeliver(ctx, sock, msgs)
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
