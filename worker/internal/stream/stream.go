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
//
// Non-guarantee: this package knows nothing of leases. Its caller (the ownership
// loop) cancels Run's context when the lease is lost, fenced, stopped or drained.
package stream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/worker/internal/metrics"
	"github.com/sockfleet/sockfleet/worker/internal/sink"
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

// Config holds the settings shared by every stream of a worker.
type Config struct {
	Resume      Resume
	SeqPath     SeqPath
	BadMessages BadPolicy

	HandshakeTimeout time.Duration // default 10s
	PongWait         time.Duration // a socket silent this long (no data, no pong) is dead; default 60s
	PingPeriod       time.Duration // must be < PongWait; default PongWait*9/10
	WriteWait        time.Duration // default 10s
	ReadLimit        int64         // bytes per message; default 1 MiB
	BatchSize        int           // most messages per sink write; default 256
	SinkTimeout      time.Duration // one sink write; default 10s
	// SinkSlowAfter: a sink write still running after this holds its connection back:
	// status sink_slow, counted in metrics. Default min(1s, SinkTimeout/2).
	SinkSlowAfter time.Duration

	BackoffMin time.Duration // default 500ms
	BackoffMax time.Duration // default 30s
	// PermanentBackoffMax caps the backoff after a permanent failure (a 4xx handshake,
	// close code 1008): such an upstream is retried rarely, never hammered. Default 5m.
	PermanentBackoffMax time.Duration
	// StableAfter: a session that lasted this long resets the backoff. Default 30s.
	StableAfter time.Duration
	// Jitter returns a value in [0, 1). Default math/rand/v2; inject a seeded source
	// to replay a run.
	Jitter func() float64

	// Sequences (a connection's spec may override SeqReset and MaxSeqJump).
	SeqReset   string // accept (default) or halt: what a restarted numbering does
	MaxSeqJump int64  // a sequence more than this past the last is bad; 0: no limit
	ResetBelow int64  // a sequence more than this below the last is a reset; default 1000

	CloseWait time.Duration // how long a stop waits for the close handshake; default 1s
	Secrets   Secrets       // resolves {{secret:…}} references; nil: a spec using one fails to dial
	Quota     *Quota        // per-host connect quota; nil: none

	Sink    sink.Sink
	Metrics *metrics.Counters
	Log     *slog.Logger
	Dialer  *websocket.Dialer // default: built from the settings above
}

// Fill sets defaults and checks the settings.
func (c *Config) Fill() error {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.HandshakeTimeout, 10*time.Second)
	def(&c.PongWait, 60*time.Second)
	def(&c.PingPeriod, c.PongWait*9/10)
	def(&c.WriteWait, 10*time.Second)
	def(&c.SinkTimeout, 10*time.Second)
	def(&c.SinkSlowAfter, min(time.Second, c.SinkTimeout/2))
	def(&c.BackoffMin, 500*time.Millisecond)
	def(&c.BackoffMax, 30*time.Second)
	def(&c.PermanentBackoffMax, 5*time.Minute)
	def(&c.StableAfter, 30*time.Second)
	if c.ReadLimit == 0 {
		c.ReadLimit = 1 << 20
	}
	def(&c.CloseWait, time.Second)
	if c.ResetBelow == 0 {
		c.ResetBelow = 1000
	}
	if c.SeqReset == "" {
		c.SeqReset = schema.SeqResetAccept
	}
	if c.SeqReset != schema.SeqResetAccept && c.SeqReset != schema.SeqResetHalt {
		return fmt.Errorf("stream config: seq reset %q: want accept or halt", c.SeqReset)
	}
	if c.MaxSeqJump < 0 || c.ResetBelow < 0 {
		return fmt.Errorf("stream config: max seq jump %d and reset distance %d must not be negative", c.MaxSeqJump, c.ResetBelow)
	}
	if c.BatchSize == 0 {
		c.BatchSize = 256
	}
	if c.BadMessages == "" {
		c.BadMessages = BadCount
	}
	if c.Resume.Kind == "" {
		c.Resume, _ = ParseResume(DefaultResume)
	}
	if c.Jitter == nil {
		c.Jitter = rand.Float64
	}
	if c.Metrics == nil {
		c.Metrics = new(metrics.Counters)
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Sink == nil {
		return errors.New("stream config: no sink")
	}
	if c.PingPeriod >= c.PongWait {
		return fmt.Errorf("stream config: ping period %s must be less than pong wait %s", c.PingPeriod, c.PongWait)
	}
	if c.BackoffMin <= 0 || c.BackoffMax < c.BackoffMin || c.PermanentBackoffMax < c.BackoffMax {
		return fmt.Errorf("stream config: want 0 < backoff min %s <= max %s <= permanent max %s",
			c.BackoffMin, c.BackoffMax, c.PermanentBackoffMax)
	}
	if c.Dialer == nil {
		c.Dialer = &websocket.Dialer{
			HandshakeTimeout: c.HandshakeTimeout,
			Proxy:            http.ProxyFromEnvironment,
			ReadBufferSize:   4096,
			// Idle sockets hold no write buffer: it is taken from the pool per message.
			WriteBufferPool: &sync.Pool{},
		}
	}
	return nil
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

	queue    chan sink.Message     // the session's queue; used by Run's goroutine only
	queued   int64                 // this stream's share of Metrics.SinkQueued (Run's goroutine only)
	set      *settings             // the connection's effective settings (fleet defaults + spec)
	halted   atomic.Pointer[error] // set when a seq_reset "halt" stopped the stream
	lastData atomic.Int64          // unix ns of the last data frame read
	idle     atomic.Bool           // status says idle
	opened   atomic.Bool           // some session got past its open messages
	sockets  atomic.Int64          // sockets open now (2 while rotating)
}

// ErrPastFence is returned when a batch was about to reach the sink after the lease's
// fence deadline: the owner's timer cancels the stream at that deadline, but a reader
// woken at the same moment (after a pause, say) must not deliver in between.
var ErrPastFence = errors.New("lease past its fence deadline")

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
	defer func() {
		if s.idle.Swap(false) {
			s.cfg.Metrics.IdleNow.Add(-1)
		}
	}()
	failures := 0
	for dials := 0; ; dials++ {
		if ctx.Err() != nil || (s.valid != nil && !s.valid()) {
			return // past the fence: the owner cancels ctx and gives the lease up
		}
		if dials > 0 {
			s.cfg.Metrics.Reconnects.Add(1)
		}
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
		s.setStatus(state, err)
		s.cfg.Log.Info("upstream disconnected; backing off", "conn", s.id, "status", state, "err", err, "wait", wait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-s.redial:
			t.Stop()
			failures = 0
		case <-t.C:
		}
	}
}

var errRedial = errors.New("upstream URL changed")

// permanentError is a failure retrying soon cannot fix.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return "permanent: " + e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

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
	s.cfg.Metrics.Messages.Add(int64(len(batch)))
	s.cfg.Metrics.Bytes.Add(n)
	return nil
}
