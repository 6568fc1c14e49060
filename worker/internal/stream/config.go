package stream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/gorilla/websocket"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/worker/internal/metrics"
	"github.com/sockfleet/sockfleet/worker/internal/sink"
)

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
	Quota     *Quota        // per-host connect quota of this worker; nil: none
	// Gate admits dials per host (quota and 429 holds); a worker with a table uses a
	// TableGate, shared by the fleet. nil: Quota alone, and a 429's Retry-After holds
	// back only the stream that got it.
	Gate Gate

	// Spec requests (token_request, refresh, snapshot; rest.go).
	HTTP        *http.Client // default: one that follows no redirect
	RESTPerHost int          // requests in flight per host, worker-wide; default DefaultRESTPerHost
	rest        *hostSlots   // shared by the copies WithSink makes

	Sink sink.Sink
	// SinkAllowed reports whether a connection's own sink attribute names a
	// destination Sink can reach (see sink.Router); nil: none may name one.
	SinkAllowed func(dest string) bool
	Metrics     *metrics.Counters
	Log         *slog.Logger
	Dialer      *websocket.Dialer // default: built from the settings above
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
	if c.RESTPerHost == 0 {
		c.RESTPerHost = DefaultRESTPerHost
	}
	if c.RESTPerHost < 0 {
		return fmt.Errorf("stream config: REST requests per host %d must be positive", c.RESTPerHost)
	}
	if c.HTTP == nil {
		c.HTTP = newRESTClient()
	}
	if c.rest == nil {
		c.rest = newHostSlots(c.RESTPerHost)
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

func (c *Config) gate() Gate {
	if c.Gate != nil {
		return c.Gate
	}
	return &LocalGate{Quota: c.Quota}
}

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
