package owner

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sockfleet/sockfleet/shared/lease"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/shared/tracing"
	"github.com/sockfleet/sockfleet/shared/wakeup"
	"github.com/sockfleet/sockfleet/worker/internal/peer"
	"github.com/sockfleet/sockfleet/worker/internal/stream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// Planned handoff, make-before-break (docs/HANDOFF.md). This file holds what both
// sides share; handoff_source.go is the old owner's side (A: prepare, cut over,
// transfer, commit), handoff_target.go the new owner's (B: standby, commit or
// adopt).
//
// The old owner A asks the target B to prepare; B checks the item (A at A's
// version), dials the upstream resuming after A's last delivered sequence and holds
// what it reads behind a gate, and answers ready once its socket is up. A then stops delivering (a graceful stop
// of its stream: everything read is delivered first), transfers the lease in one
// conditional write (lease.Transfer) with checkpoint N, and tells B to commit at the
// new version and N. B drops what it holds up to N and delivers from N+1.
//
// Only one worker delivers at a time: A's stream has returned before the transfer
// is written, and B's gate opens only once B knows the new version, from A's commit
// or, if that never comes, from the table (a standby not committed in time reads the
// item and adopts a lease that names it). Every failure before the transfer ends in
// A's release, as without handoffs.

// Why a connection's context was cancelled (handoffs).
var (
	// errHandingOff: the target is ready; stop delivering and transfer the lease.
	errHandingOff = fmt.Errorf("handing off: %w", stream.ErrGraceful)
	// errHandoffFallback: the handoff could not be prepared; release as before.
	errHandoffFallback = fmt.Errorf("handoff not possible: %w", stream.ErrGraceful)
	// errStandbyGone: a standby ends without being committed; it releases nothing.
	errStandbyGone = errors.New("standby given up")
)

// HandoffConfig configures planned handoffs.
type HandoffConfig struct {
	Peer    Peer
	Store   HandoffStore
	Workers func(ctx context.Context) ([]codec.Worker, error) // the registry, every item
	// NewStandby makes a standby's stream, writing to a gate in front of the sink:
	// valid is the stream's fence guard, overflow is to be called when the gate
	// gives up.
	NewStandby func(l lease.Lease, valid func() bool, overflow func(error)) (Stream, *peer.Gate)
	// Resumable says why l cannot be handed over make-before-break, or nil: its
	// upstream cannot be resumed (resume none), or its sequence is a count of the
	// messages a socket read (no seq_path), which a standby's socket cannot align
	// with the old owner's. Either way the handoff falls back to a release.
	Resumable func(l lease.Lease) error

	// PrepareTimeout bounds a prepare: the target's item read, dial and open
	// messages. Default 10s.
	PrepareTimeout time.Duration
	// StandbyTimeout: a ready standby without a commit this long reads the item and
	// adopts the lease if it names this worker, else gives up. Default
	// PrepareTimeout + 10s.
	StandbyTimeout time.Duration
	// Concurrency bounds the handoffs this worker runs for handoff wakeups (default
	// 8); DrainConcurrency those of a drain (default 32).
	Concurrency      int
	DrainConcurrency int
	// CutConcurrency bounds the cut-overs (stop, transfer, commit) this worker runs
	// at once, default 1. A handoff waits for its turn while the old owner still
	// delivers, so the wait adds nothing to the gap, whereas transfers in flight
	// together each wait on the others' writes after delivery stopped: in the
	// rolling-deploy bench, 1, 2, 4 and 32 gave gap p99s of 7, 12, 22 and 86 ms, with
	// drains as long (docs/BENCHMARKS.md). A cut-over is one write and one call,
	// about 10 ms on DynamoDB, so 1 still drains about 100 connections a second;
	// prepares (the dials) still run DrainConcurrency at once.
	CutConcurrency int
	// Now is the wall clock registry heartbeats are compared with; default time.Now.
	Now func() time.Time
}

// Peer sends handoff calls to another worker.
type Peer interface {
	Send(ctx context.Context, addr string, req peer.Request) (peer.Response, error)
}

// HandoffStore is the part of the lease store handoffs use.
type HandoffStore interface {
	Transfer(ctx context.Context, l lease.Lease, to string, p lease.Progress, rebalance bool) (lease.Lease, error)
	Get(ctx context.Context, id string) (codec.Connection, error)
	Checkpoint(ctx context.Context, l lease.Lease, p lease.Progress) (codec.Connection, error)
	Release(ctx context.Context, l lease.Lease, p lease.Progress) error
}

type handoffs struct {
	cfg  HandoffConfig
	sem  chan struct{} // handoffs of wakeups in flight
	cuts chan struct{} // cut-overs in flight (HandoffConfig.CutConcurrency)
	// Under Manager.mu:
	standby map[string]*standby
	// ended holds the highest version of each connection whose session ended here,
	// so a late commit or a standby's adopt cannot take up again a version this
	// worker let go. An entry is kept at least keepEnded, past which no such call
	// can arrive, and is pruned within half that again.
	ended      map[string]endedVersion
	endedSwept time.Time
}

type endedVersion struct {
	version int64
	at      time.Time
}

// keepEnded is how long a version that ended here can still be named by a call that
// would take it up: a commit is accepted only within wakeup.Window of its signed
// timestamp (on clocks up to a window apart), and a standby that was waiting for
// one ends within the prepare and standby timeouts.
func (h *handoffs) keepEnded() time.Duration {
	return 2*wakeup.Window + h.cfg.PrepareTimeout + h.cfg.StandbyTimeout
}

// endedAt is the highest version of id whose session ended here (0: none known).
// Call with Manager.mu held.
func (h *handoffs) endedAt(id string) int64 { return h.ended[id].version }

// noteEnded records that id's session at version ended here, and forgets what
// ended longer than keepEnded ago. Call with Manager.mu held.
func (h *handoffs) noteEnded(id string, version int64, now time.Time) {
	h.ended[id] = endedVersion{version: max(version, h.ended[id].version), at: now}
	keep := h.keepEnded()
	if now.Sub(h.endedSwept) < keep/2 {
		return
	}
	h.endedSwept = now
	for k, e := range h.ended {
		if now.Sub(e.at) > keep {
			delete(h.ended, k)
		}
	}
}

// standby is a connection this worker prepared to take over.
type standby struct {
	mu      sync.Mutex // one of prepare, commit, abort and expiry at a time
	id      string
	from    string
	version int64 // the old owner's
	o       *owned
	gate    *peer.Gate
	timer   *time.Timer
}

func newHandoffs(c *HandoffConfig) (*handoffs, error) {
	if c.Peer == nil || c.Store == nil || c.Workers == nil || c.NewStandby == nil || c.Resumable == nil {
		return nil, errors.New("owner config: handoffs need a peer, a store, the registry, a standby factory and a resume check")
	}
	if c.PrepareTimeout <= 0 {
		c.PrepareTimeout = 10 * time.Second
	}
	if c.StandbyTimeout <= 0 {
		c.StandbyTimeout = c.PrepareTimeout + 10*time.Second
	}
	if c.StandbyTimeout <= c.PrepareTimeout {
		return nil, fmt.Errorf("owner config: standby timeout %s must exceed the prepare timeout %s", c.StandbyTimeout, c.PrepareTimeout)
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 8
	}
	if c.DrainConcurrency <= 0 {
		c.DrainConcurrency = 32
	}
	if c.CutConcurrency <= 0 {
		c.CutConcurrency = 1
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return &handoffs{cfg: *c, sem: make(chan struct{}, c.Concurrency), cuts: make(chan struct{}, c.CutConcurrency),
		standby: map[string]*standby{}, ended: map[string]endedVersion{}}, nil
}

// gatedStream is a standby's stream: until its gate has delivered what it held, the
// last sequence delivered is the gate's, not the stream's.
type gatedStream struct {
	Stream
	gate *peer.Gate
}

func (g gatedStream) LastSeq() int64 {
	if p, ok := g.gate.Held(); ok {
		return p.Seq
	}
	return g.Stream.LastSeq()
}

func (g gatedStream) Epoch() int64 {
	if p, ok := g.gate.Held(); ok {
		return p.Epoch
	}
	if sq, ok := g.Stream.(sequenced); ok {
		return sq.Epoch()
	}
	return 0
}

func (g gatedStream) Halted() error {
	if sq, ok := g.Stream.(sequenced); ok {
		return sq.Halted()
	}
	return nil
}

// Handoff answers a call of another worker's handoff.
func (m *Manager) Handoff(ctx context.Context, r peer.Request) peer.Response {
	if m.ho == nil {
		return refused("planned handoffs are off on this worker")
	}
	if r.To != m.cfg.WorkerID {
		return refused("addressed to %s, this is %s", r.To, m.cfg.WorkerID)
	}
	// The server side of the other worker's call: a child of its span (worker.drain,
	// a rebalance wakeup's handling, or handoff.cut) when the call carried it.
	ctx, span := tracer.Start(ctx, "handoff."+string(r.Op), trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(
		tracing.Conn(r.Conn), tracing.Worker(m.cfg.WorkerID), tracing.Version(r.Version), tracing.Phase(string(r.Op)),
		attribute.String("sockfleet.handoff.from", r.From), attribute.Int64("sockfleet.last_seq", r.Seq)))
	defer span.End()
	var resp peer.Response
	switch r.Op {
	case peer.Prepare:
		resp = m.prepare(ctx, r)
	case peer.Commit:
		resp = m.commit(ctx, r)
	default:
		resp = m.abortStandby(r)
	}
	span.SetAttributes(attribute.String("sockfleet.handoff.result", string(resp.Result)))
	if resp.Detail != "" {
		span.SetAttributes(attribute.String("sockfleet.detail", resp.Detail))
	}
	return resp
}

func refused(format string, args ...any) peer.Response {
	return peer.Response{V: peer.Version, Result: peer.Refused, Detail: fmt.Sprintf(format, args...)}
}

func answer(r peer.Result, detail string) peer.Response {
	return peer.Response{V: peer.Version, Result: r, Detail: detail}
}

// ms is d in milliseconds, to 0.1 ms, for logs.
func ms(d time.Duration) float64 { return float64(d.Round(100*time.Microsecond)) / 1e6 }
