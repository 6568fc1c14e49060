package stream

import (
	"time"

	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/worker/internal/sink"
)

// Conn is a connection as its owner hands it to a stream.
type Conn struct {
	ID      string
	URL     string
	LastSeq int64 // the stream resumes after it
	Epoch   int64 // the sequence epoch of LastSeq
	// Version is the lease_version the stream delivers under: every message carries
	// it as its fencing token. 0 for a standby, whose gate stamps the version of the
	// commit (peer.Gate.Open).
	Version int64
	Spec    schema.Spec
	// Valid (may be nil) is asked before every sink write whether the lease still
	// holds (see GuardWith).
	Valid func() bool
}

// Factory makes a worker's streams, all sharing one Config.
type Factory struct {
	Config *Config // filled (see Config.Fill)
	// IdleTimeout is the fleet's idle_timeout, given to a connection whose spec sets
	// none (a connection's own wins). It sets status only: it never turns
	// idle_reconnect on.
	IdleTimeout time.Duration
}

// New returns a stream for c, with c's spec applied and its lease guard set. A spec
// the stream refuses (the codec validated it, so the two disagree) is logged and the
// fleet defaults are used: the connection streams rather than not at all.
func (f *Factory) New(c Conn) *Stream {
	s := New(f.Config, c.ID, c.URL, c.LastSeq)
	if err := s.UseSpec(withFleetIdle(c.Spec, f.IdleTimeout), c.Epoch); err != nil {
		f.Config.Log.Error("spec refused by the stream; using fleet defaults", "conn", c.ID, "err", err)
		_ = s.UseSpec(withFleetIdle(schema.Spec{}, f.IdleTimeout), c.Epoch)
	}
	s.GuardWith(c.Valid)
	s.version = c.Version
	return s
}

// WithSink returns a factory whose streams write to snk instead (a standby's gate),
// with every other setting the same.
func (f *Factory) WithSink(snk sink.Sink) *Factory {
	cfg := *f.Config
	cfg.Sink = snk
	return &Factory{Config: &cfg, IdleTimeout: f.IdleTimeout}
}

// withFleetIdle gives sp the fleet's idle_timeout when the item sets none.
func withFleetIdle(sp schema.Spec, fleet time.Duration) schema.Spec {
	if sp.IdleTimeout == 0 {
		sp.IdleTimeout = fleet
	}
	return sp
}
