package owner

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sockfleet/sockfleet/shared/lease"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/worker/internal/stream"
	"go.opentelemetry.io/otel/trace"
)

// Manager owns this worker's leases: the table of owned connections (this file),
// the loop that keeps them (regime.go) and the sessions that stream them.
type Manager struct {
	cfg   Config
	fence time.Duration // how long a successful renew's start keeps a lease deliverable
	rg    regime        // polling or stream mode
	ho    *handoffs     // nil unless planned handoffs are on (stream mode)

	base       context.Context // parent of every connection's context
	cancelBase context.CancelCauseFunc
	wg         sync.WaitGroup // connection sessions

	mu        sync.Mutex
	conns     map[string]*owned
	acquiring map[string]bool
	draining  bool
	// unresolved: acquires whose write may have landed (lease.AmbiguousAcquire), by
	// id, with the stamp that tells the write apart; resolved after the next
	// successful membership renew (reconcile.go).
	unresolved map[string]int64

	started time.Time // monotonic base of the offsets kept in owned and the regimes
	running atomic.Bool
	joined  atomic.Bool // see Joined
}

// owned is one held lease and its stream.
type owned struct {
	lease   lease.Lease // Version is fixed for the life of the session
	s       Stream
	ctx     context.Context
	cancel  context.CancelCauseFunc
	unfence func() bool // disarms the self-fence; false if it already fired

	writeMu sync.Mutex // one checkpoint of this lease at a time (a single call, never a retry loop)
	// Under writeMu: the status and last_seq the last checkpoint (or the acquire)
	// wrote.
	written    stream.Status
	writtenSeq int64
	// writtenAt is when the last successful checkpoint (or the acquire) began, as the
	// monotonic time since Manager.started. In polling mode the lease's fence counts
	// from it.
	writtenAt atomic.Int64

	done chan struct{} // closed when its session has ended

	span    trace.Span                        // connection.session (see trace.go)
	stopper atomic.Pointer[trace.SpanContext] // the span that stops it, if one does (stopIn)

	// Planned handoff (handoff_source.go): set once a handoff of this lease began;
	// the target once its standby is ready (read by the session's cut-over); why it
	// fell back to a release; whether the transfer was written.
	handing     atomic.Bool
	rebalance   atomic.Bool // the handoff is a rebalance move: it starts the cooling period
	target      atomic.Pointer[codec.Worker]
	fallback    atomic.Pointer[string]
	transferred atomic.Bool
	cut         atomic.Bool  // cutOver ran (from the stream's Cut, or from finish)
	stopAt      atomic.Int64 // when a handoff stopped the stream (unix ns), for the cut-over's timings
}

// sequenced is implemented by streams that track a sequence epoch and may halt
// themselves (a reset of the upstream's numbering under seq_reset=halt).
type sequenced interface {
	Epoch() int64
	Halted() error
}

// progress is o's checkpoint: its last sequence and, if the stream tracks one, the
// epoch of that sequence.
func progress(o *owned) lease.Progress {
	p := lease.Progress{LastSeq: o.s.LastSeq()}
	if sq, ok := o.s.(sequenced); ok {
		p.Epoch = sq.Epoch()
	}
	return p
}

// Owned returns the ids this worker holds now.
func (m *Manager) Owned() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	ids := make([]string, 0, len(m.conns))
	for id := range m.conns {
		ids = append(ids, id)
	}
	return ids
}

// Load is how many connections this worker holds, is acquiring or stands by for in
// a handoff: the figure its registry item and its wakeup replies carry.
func (m *Manager) Load() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.loadLocked()
}

// Draining reports whether the worker is draining (it refuses wakeups).
func (m *Manager) Draining() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.draining
}

// loadLocked is how many connections this worker holds, is taking, or stands by
// for. Call with m.mu held.
func (m *Manager) loadLocked() int {
	n := len(m.conns) + len(m.acquiring)
	if m.ho != nil {
		n += len(m.ho.standby)
	}
	return n
}

// snapshot lists the connections held now.
func (m *Manager) snapshot() []*owned {
	m.mu.Lock()
	defer m.mu.Unlock()
	list := make([]*owned, 0, len(m.conns))
	for _, o := range m.conns {
		list = append(list, o)
	}
	return list
}

// hold enters o in the table and arms its self-fence. Call with m.mu held.
func (m *Manager) hold(o *owned) {
	o.unfence = m.rg.fence(o)
	m.conns[o.lease.ID] = o
	m.cfg.Metrics.Owned.Store(int64(len(m.conns)))
}

// drop takes o out of the table, recording that its version ended here.
func (m *Manager) drop(o *owned) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.conns, o.lease.ID)
	if m.ho != nil {
		m.ho.noteEnded(o.lease.ID, o.lease.Version, time.Now())
	}
	m.cfg.Metrics.Owned.Store(int64(len(m.conns)))
}
