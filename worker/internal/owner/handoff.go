package owner

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/sockfleet/sockfleet/shared/lease"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/shared/wakeup"
	"github.com/sockfleet/sockfleet/worker/internal/handoff"
	"github.com/sockfleet/sockfleet/worker/internal/stream"
)

// Planned handoff, make-before-break (docs/HANDOFF.md). The old owner A asks the
// target B to prepare; B checks the item (A at A's version), dials the upstream
// resuming after A's last delivered sequence and holds what it reads behind a gate,
// and answers ready once its socket is up. A then stops delivering (a graceful stop
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
	NewStandby func(l lease.Lease, valid func() bool, overflow func(error)) (Stream, *handoff.Gate)
	// Resumable says why l's upstream cannot be resumed (resume none), or nil.
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
	Send(ctx context.Context, addr string, req handoff.Request) (handoff.Response, error)
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
	ended   map[string]int64 // the highest version of each connection whose session ended here
}

// standby is a connection this worker prepared to take over.
type standby struct {
	mu      sync.Mutex // one of prepare, commit, abort and expiry at a time
	id      string
	from    string
	version int64 // the old owner's
	o       *owned
	gate    *handoff.Gate
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
		standby: map[string]*standby{}, ended: map[string]int64{}}, nil
}

// gatedStream is a standby's stream: until its gate has delivered what it held, the
// last sequence delivered is the gate's, not the stream's.
type gatedStream struct {
	Stream
	gate *handoff.Gate
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
func (m *Manager) Handoff(ctx context.Context, r handoff.Request) handoff.Response {
	if m.ho == nil {
		return refused("planned handoffs are off on this worker")
	}
	if r.To != m.cfg.WorkerID {
		return refused("addressed to %s, this is %s", r.To, m.cfg.WorkerID)
	}
	switch r.Op {
	case handoff.Prepare:
		return m.prepare(ctx, r)
	case handoff.Commit:
		return m.commit(ctx, r)
	default:
		return m.abortStandby(r)
	}
}

func refused(format string, args ...any) handoff.Response {
	return handoff.Response{V: handoff.Version, Result: handoff.Refused, Detail: fmt.Sprintf(format, args...)}
}

func answer(r handoff.Result, detail string) handoff.Response {
	return handoff.Response{V: handoff.Version, Result: r, Detail: detail}
}

// prepare opens a standby for r.Conn (B's side of step 1).
func (m *Manager) prepare(ctx context.Context, r handoff.Request) handoff.Response {
	id := r.Conn
	m.mu.Lock()
	switch {
	case m.draining:
		m.mu.Unlock()
		return refused("draining")
	case m.conns[id] != nil || m.acquiring[id] || m.ho.standby[id] != nil:
		m.mu.Unlock()
		return refused("already held, being taken, or standing by here")
	case m.loadLocked() >= m.cfg.MaxConnections:
		m.mu.Unlock()
		return refused("no capacity")
	case !m.mem.valid():
		m.mu.Unlock()
		return refused("membership lease not renewed in time")
	}
	sb := &standby{id: id, from: r.From, version: r.Version}
	m.ho.standby[id] = sb
	m.mu.Unlock()

	sb.mu.Lock()
	defer sb.mu.Unlock()
	pctx, cancel := context.WithTimeout(ctx, m.ho.cfg.PrepareTimeout)
	defer cancel()
	c, err := m.ho.cfg.Store.Get(pctx, id)
	var why string
	switch {
	case err != nil:
		why = "read the item: " + err.Error()
	case c.LeaseOwner != r.From || c.LeaseVersion != r.Version:
		why = fmt.Sprintf("the item names %q at version %d, not %s at %d", c.LeaseOwner, c.LeaseVersion, r.From, r.Version)
	case c.DesiredState != schema.Started:
		why = "desired_state is " + string(c.DesiredState)
	case schema.ValidateURL(c.WSURL) != nil:
		why = schema.ValidateURL(c.WSURL).Error()
	case c.SpecErr != nil:
		why = c.SpecErr.Error()
	}
	l := lease.Lease{ID: id, Owner: m.cfg.WorkerID, WSURL: c.WSURL, LastSeq: r.Seq, Spec: c.Spec, Epoch: r.Epoch}
	if why == "" {
		if err := m.ho.cfg.Resumable(l); err != nil {
			why = err.Error()
		}
	}
	if why != "" {
		m.dropStandby(sb, why)
		return refused("%s", why)
	}
	octx, ocancel := context.WithCancelCause(m.base)
	o := &owned{lease: l, ctx: octx, cancel: ocancel, done: make(chan struct{})}
	s, g := m.ho.cfg.NewStandby(l, func() bool { return m.beforeFence(o) }, func(err error) {
		m.cfg.Metrics.StandbyOverflows.Add(1)
		o.cancel(fmt.Errorf("%w: %w", errStandbyGone, err))
	})
	o.s = gatedStream{Stream: s, gate: g}
	m.mu.Lock()
	if m.draining { // checked under m.mu: a drain waits for every goroutine started before it
		m.mu.Unlock()
		m.dropStandby(sb, "draining")
		return refused("draining")
	}
	sb.o, sb.gate = o, g
	m.wg.Go(func() { m.standbySession(sb) })
	m.mu.Unlock()
	if why := m.awaitReady(pctx, o); why != "" {
		m.dropStandby(sb, why)
		return refused("standby: %s", why)
	}
	sb.timer = time.AfterFunc(m.ho.cfg.StandbyTimeout, func() { m.standbyExpired(sb) })
	m.cfg.Log.Info("standing by for a handoff", "conn", id, "from", r.From, "version", r.Version, "after", r.Seq)
	return answer(handoff.Ready, "")
}

// awaitReady waits until the standby's socket is up (handshake and open messages
// done) and returns "", or why not.
func (m *Manager) awaitReady(ctx context.Context, o *owned) string {
	// The standby is not in m.conns: the drain's stop does not reach it, so look.
	t := time.NewTicker(2 * time.Millisecond)
	defer t.Stop()
	for {
		switch st := o.s.Status(); st.State {
		case "streaming", schema.StatusIdle:
			return ""
		case "backoff", schema.StatusInvalid: // invalid: not dialed (a secret not allowed to the host)
			return "dial failed: " + st.Error
		}
		if m.Draining() {
			return "draining" // do not hold up this worker's own drain
		}
		select {
		case <-o.ctx.Done():
			return context.Cause(o.ctx).Error()
		case <-ctx.Done():
			return "not ready within the prepare timeout"
		case <-t.C:
		}
	}
}

// standbySession runs a standby's stream. Committed, it is an owned connection and
// ends as one; otherwise it ends without a write.
func (m *Manager) standbySession(sb *standby) {
	o := sb.o
	defer close(o.done)
	o.s.Run(o.ctx)
	m.mu.Lock()
	promoted := m.conns[sb.id] == o
	if !promoted && m.ho.standby[sb.id] == sb {
		delete(m.ho.standby, sb.id)
	}
	m.mu.Unlock()
	if promoted {
		m.finish(o)
		return
	}
	sb.gate.Abandon(errStandbyGone)
	m.cfg.Log.Info("standby ended", "conn", sb.id, "from", sb.from, "why", context.Cause(o.ctx))
}

// dropStandby gives sb up. Call with sb.mu held.
func (m *Manager) dropStandby(sb *standby, why string) {
	m.mu.Lock()
	if m.ho.standby[sb.id] == sb {
		delete(m.ho.standby, sb.id)
	}
	m.mu.Unlock()
	if sb.timer != nil {
		sb.timer.Stop()
	}
	if sb.o != nil {
		sb.gate.Abandon(errStandbyGone)
		sb.o.cancel(fmt.Errorf("%w: %s", errStandbyGone, why))
		<-sb.o.done
	}
}

// commit is B's side of step 3: deliver under the new version from r.Seq+1.
func (m *Manager) commit(ctx context.Context, r handoff.Request) handoff.Response {
	m.mu.Lock()
	sb, o := m.ho.standby[r.Conn], m.conns[r.Conn]
	m.mu.Unlock()
	if o != nil {
		if o.lease.Version == r.Version {
			return answer(handoff.Committed, "already delivering under this version")
		}
		return refused("held here at version %d", o.lease.Version)
	}
	if sb != nil {
		sb.mu.Lock()
		defer sb.mu.Unlock()
		if sb.from != r.From {
			return refused("standing by for %s, not %s", sb.from, r.From)
		}
		if res, ok := m.promote(ctx, sb, r.Version, handoff.Position{Seq: r.Seq, Epoch: r.Epoch}); ok {
			return res
		}
	}
	return m.adopt(ctx, r.Conn, r.Version, r.Seq, r.Epoch, "committed without a usable standby")
}

// promote makes sb's stream the owner's at version, delivering after cut. ok false:
// the standby is gone or unusable (it was stopped); the caller adopts instead. Call
// with sb.mu held.
func (m *Manager) promote(ctx context.Context, sb *standby, version int64, cut handoff.Position) (handoff.Response, bool) {
	o := sb.o
	m.mu.Lock()
	if cur := m.conns[sb.id]; m.ho.standby[sb.id] != sb {
		m.mu.Unlock()
		if cur != nil && cur.lease.Version == version {
			return answer(handoff.Committed, "already delivering under this version"), true
		}
		return handoff.Response{}, false
	}
	delete(m.ho.standby, sb.id)
	if sb.timer != nil {
		sb.timer.Stop()
	}
	usable := !m.draining && o.ctx.Err() == nil && m.mem.valid() && m.ho.ended[sb.id] < version
	if usable {
		usable = sb.gate.Open(cut) == nil
	}
	if !usable {
		m.mu.Unlock()
		sb.gate.Abandon(errStandbyGone)
		o.cancel(fmt.Errorf("%w: not usable at the commit", errStandbyGone))
		<-o.done
		return handoff.Response{}, false
	}
	o.lease.Version, o.lease.LastSeq, o.lease.Epoch = version, cut.Seq, cut.Epoch
	o.lease.ExpiresAtMs = schema.LeaseHeldByMember
	o.written = stream.Status{State: lease.StatusHandedOff} // the next checkpoint says streaming
	o.writtenSeq, o.checkpointAt = cut.Seq, int64(time.Since(m.started))
	m.conns[sb.id] = o
	m.cfg.Metrics.Owned.Store(int64(len(m.conns)))
	m.mu.Unlock()
	m.cfg.Metrics.HandoffsTaken.Add(1)
	if err := sb.gate.Flush(ctx); err != nil {
		m.cfg.Log.Warn("handoff: held messages not delivered yet; retried with the next write", "conn", sb.id, "err", err)
	}
	m.cfg.Log.Info("taken over by handoff", "conn", sb.id, "from", sb.from, "version", version, "after", cut.Seq)
	return answer(handoff.Committed, ""), true
}

// adopt takes up a lease the table names this worker for at version (transferred to
// it, its standby gone or never committed) with checkpoint seq: one conditional
// write (owner = me AND version) confirms it, then it streams from seq. If this
// worker cannot run it, it releases it for the next owner.
func (m *Manager) adopt(ctx context.Context, id string, version, seq, epoch int64, why string) handoff.Response {
	m.mu.Lock()
	switch o := m.conns[id]; {
	case o != nil && o.lease.Version == version:
		m.mu.Unlock()
		return answer(handoff.Committed, "already delivering under this version")
	case o != nil || m.acquiring[id] || m.ho.standby[id] != nil:
		m.mu.Unlock()
		return refused("held, being taken, or standing by here")
	case m.ho.ended[id] >= version:
		m.mu.Unlock()
		return refused("version %d already ended here", version)
	}
	m.acquiring[id] = true
	runnable := !m.draining && m.mem.valid()
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		delete(m.acquiring, id)
		m.mu.Unlock()
	}()
	l := lease.Lease{ID: id, Owner: m.cfg.WorkerID, Version: version, ExpiresAtMs: schema.LeaseHeldByMember, LastSeq: seq, Epoch: epoch}
	p := lease.Progress{LastSeq: seq, Epoch: epoch}
	if !runnable {
		p.Status, p.Error = "released", "handed over to a worker that is draining or fenced"
		m.release(l, p)
		return refused("draining or fenced: released for the next owner")
	}
	t0 := time.Now()
	c, err := m.ho.cfg.Store.Checkpoint(ctx, l, p)
	if err != nil {
		return refused("confirm the lease: %v", err)
	}
	l.WSURL, l.Spec = c.WSURL, c.Spec
	m.mu.Lock()
	if m.draining || !m.mem.valid() {
		m.mu.Unlock()
		p.Status, p.Error = "released", "handed over to a worker that is draining or fenced"
		m.release(l, p)
		return refused("draining or fenced: released for the next owner")
	}
	delete(m.acquiring, id)
	m.start(l, t0)
	o := m.conns[id]
	m.mu.Unlock()
	m.act(o, c) // stopped or changed meanwhile: act as a checkpoint would
	m.cfg.Metrics.HandoffsAdopted.Add(1)
	m.cfg.Log.Info("adopted a lease handed to this worker", "conn", id, "version", version, "after", seq, "why", why)
	return answer(handoff.Committed, why)
}

// standbyExpired: no commit came in time. The item says whether the old owner
// transferred the lease (it died, or its commit was lost): then adopt, else give up.
func (m *Manager) standbyExpired(sb *standby) {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	m.mu.Lock()
	live := m.ho.standby[sb.id] == sb
	m.mu.Unlock()
	if !live {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), m.cfg.ReleaseTimeout)
	defer cancel()
	c, err := m.ho.cfg.Store.Get(ctx, sb.id)
	switch {
	case err != nil && !errors.Is(err, lease.ErrNotFound):
		// Unknown: the lease may be ours. Keep standing by and ask again.
		m.cfg.Log.Warn("standby without a commit: item unreadable; asking again", "conn", sb.id, "err", err)
		sb.timer.Reset(m.cfg.RenewInterval)
	case err == nil && c.LeaseOwner == m.cfg.WorkerID && c.LeaseVersion > sb.version && c.Status == lease.StatusHandedOff:
		if _, ok := m.promote(ctx, sb, c.LeaseVersion, handoff.Position{Seq: c.LastSeq, Epoch: c.Epoch}); !ok {
			m.adopt(ctx, sb.id, c.LeaseVersion, c.LastSeq, c.Epoch, "transferred; no commit came")
		}
		m.cfg.Metrics.HandoffsAdopted.Add(1)
		m.cfg.Log.Info("standby: no commit came but the item names this worker; took it over", "conn", sb.id, "version", c.LeaseVersion)
	default:
		m.dropStandby(sb, "no commit within the standby timeout, and the item does not name this worker")
	}
}

// abortStandby drops the standby the old owner gave up.
func (m *Manager) abortStandby(r handoff.Request) handoff.Response {
	m.mu.Lock()
	sb := m.ho.standby[r.Conn]
	m.mu.Unlock()
	if sb == nil {
		return answer(handoff.Aborted, "no standby")
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.from != r.From || sb.version != r.Version {
		return refused("standing by for %s at %d", sb.from, sb.version)
	}
	m.dropStandby(sb, "aborted by "+r.From)
	return answer(handoff.Aborted, "")
}

// handOff moves o to target (A's side), or releases it when that cannot be
// prepared. prepareBy, if not zero, cuts the prepare short. It returns whether the
// lease was transferred, and blocks until o's session has ended either way.
func (m *Manager) handOff(o *owned, target codec.Worker, prepareBy time.Time) bool {
	id := o.lease.ID
	p := progress(o)
	fallback := func(why string) bool {
		m.cfg.Metrics.HandoffFallbacks.Add(1)
		m.cfg.Log.Info("handoff not possible; releasing", "conn", id, "to", target.ID, "why", why)
		o.fallback.Store(&why)
		o.cancel(errHandoffFallback)
		<-o.done
		return false
	}
	if err := m.ho.cfg.Resumable(o.lease); err != nil {
		return fallback(fmt.Sprintf("to %s: %v", target.ID, err))
	}
	if p.LastSeq == 0 && p.Epoch == 0 {
		return fallback(fmt.Sprintf("to %s: nothing delivered yet, no resume point", target.ID))
	}
	req := handoff.Request{Op: handoff.Prepare, Conn: id, From: m.cfg.WorkerID, To: target.ID,
		Version: o.lease.Version, Seq: p.LastSeq, Epoch: p.Epoch}
	by := time.Now().Add(m.ho.cfg.PrepareTimeout)
	if !prepareBy.IsZero() && prepareBy.Before(by) {
		by = prepareBy
	}
	pctx, cancel := context.WithDeadline(o.ctx, by)
	resp, err := m.ho.cfg.Peer.Send(pctx, target.Addr, req)
	cancel()
	if err != nil || resp.Result != handoff.Ready {
		if err != nil {
			// Release first: the target did not answer, and may not answer an abort
			// either (its standby, if any, ends at its own timeout).
			defer m.abortPeer(target, req)
			return fallback(fmt.Sprintf("prepare at %s: %v", target.ID, err))
		}
		return fallback(fmt.Sprintf("prepare refused by %s: %s", target.ID, resp.Detail))
	}
	// Wait for a cut-over slot while still delivering; the standby holds what it
	// reads meanwhile.
	var free func()
	select {
	case m.ho.cuts <- struct{}{}:
		free = sync.OnceFunc(func() { <-m.ho.cuts })
		defer free()
	case <-o.ctx.Done():
		<-o.done
		m.abortPeer(target, req) // stopped for another reason first; its session said so
		return false
	}
	o.target.Store(&target)
	o.stopAt.Store(time.Now().UnixNano())
	o.cancel(handoffCut{m: m, o: o, free: free})
	<-o.done
	if !errors.Is(context.Cause(o.ctx), errHandingOff) {
		m.abortPeer(target, req) // stopped for another reason first; its session said so
		return false
	}
	return o.transferred.Load()
}

// handoffCut is the cause that stops a stream being handed off: the stream calls Cut
// after its last delivery and before its close handshake (stream.Cutter), so the
// transfer does not wait for the old socket's round trip to the upstream. If the
// stream ends without calling it (it was between sockets), finish cuts over instead.
type handoffCut struct {
	m    *Manager
	o    *owned
	free func() // gives the cut-over slot back (the close handshake needs none)
}

func (c handoffCut) Error() string { return errHandingOff.Error() }
func (c handoffCut) Unwrap() error { return errHandingOff }
func (c handoffCut) Cut() {
	if c.o.cut.CompareAndSwap(false, true) {
		c.m.cutOver(c.o, progress(c.o))
	}
	c.free()
}

// cutOver is the end of a session handed off (steps 2 and 3): the stream has
// delivered its last message, p.LastSeq. Transfer the lease, then commit at the
// target; fall back to a release when the transfer is refused.
func (m *Manager) cutOver(o *owned, p lease.Progress) {
	t := o.target.Load()
	ctx, cancel := context.WithTimeout(context.Background(), m.cfg.ReleaseTimeout)
	defer cancel()
	cut := time.Now()
	nl, err := m.ho.cfg.Store.Transfer(ctx, o.lease, t.ID, p, o.rebalance.Load())
	req := handoff.Request{Conn: o.lease.ID, From: m.cfg.WorkerID, To: t.ID, Version: o.lease.Version}
	switch {
	case err == nil:
		o.transferred.Store(true)
		m.cfg.Metrics.Handoffs.Add(1)
		written := time.Now()
		m.commitPeer(*t, nl, p)
		// The new owner's wait, in its parts: the stream's end (its last delivery),
		// the transfer write, the commit call (the target delivers what it held).
		m.cfg.Log.Info("handed off", "conn", o.lease.ID, "to", t.ID, "version", nl.Version, "last_seq", p.LastSeq,
			"stop_ms", ms(cut.Sub(time.Unix(0, o.stopAt.Load()))), "transfer_ms", ms(written.Sub(cut)), "commit_ms", ms(time.Since(written)))
	case errors.Is(err, lease.ErrNotStarted):
		m.abortPeer(*t, req)
		p.Status = "stopped"
		m.release(o.lease, p)
	case errors.Is(err, lease.ErrLost), errors.Is(err, lease.ErrNotFound):
		m.abortPeer(*t, req)
		m.cfg.Log.Warn("handoff: lease lost before the transfer", "conn", o.lease.ID, "err", err)
	default:
		// Outcome unknown. Never tell the target to deliver: it reads the item at its
		// standby timeout and adopts only a lease that names it. Release as for any
		// stop: refused (ErrLost) if the transfer did land.
		m.cfg.Metrics.HandoffFallbacks.Add(1)
		p.Error = fmt.Sprintf("handoff to %s: transfer outcome unknown (%v); released", t.ID, err)
		m.release(o.lease, p)
	}
}

// commitPeer tells the target it holds nl, a few times within a few seconds. If it
// never hears, its standby timeout finds the lease in the table.
func (m *Manager) commitPeer(t codec.Worker, nl lease.Lease, p lease.Progress) {
	req := handoff.Request{Op: handoff.Commit, Conn: nl.ID, From: m.cfg.WorkerID, To: t.ID,
		Version: nl.Version, Seq: p.LastSeq, Epoch: p.Epoch}
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		var resp handoff.Response
		resp, err = m.ho.cfg.Peer.Send(ctx, t.Addr, req)
		cancel()
		if err == nil && resp.Result == handoff.Committed {
			return
		}
		if err == nil {
			m.cfg.Log.Warn("handoff commit refused; the target releases what it cannot run", "conn", nl.ID, "to", t.ID, "detail", resp.Detail)
			return
		}
	}
	m.cfg.Log.Warn("handoff commit not answered; the target adopts it from the table at its standby timeout",
		"conn", nl.ID, "to", t.ID, "err", err)
}

// abortPeer tells the target to drop its standby, once, best effort (a standby not
// committed ends at its timeout anyway).
func (m *Manager) abortPeer(t codec.Worker, req handoff.Request) {
	req.Op = handoff.Abort
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if _, err := m.ho.cfg.Peer.Send(ctx, t.Addr, req); err != nil {
		m.cfg.Log.Debug("handoff abort not answered", "conn", req.Conn, "to", t.ID, "err", err)
	}
}

// targets lists the workers that may take connections now: live members, not
// draining, not this one, with spare capacity.
func (m *Manager) targets(ctx context.Context) ([]codec.Worker, error) {
	ws, err := m.ho.cfg.Workers(ctx)
	if err != nil {
		return nil, err
	}
	now := m.ho.cfg.Now().UnixMilli()
	var out []codec.Worker
	for _, w := range ws {
		if w.ID != m.cfg.WorkerID && w.Live(now) && !w.Draining && w.Capacity > w.Load && w.Addr != "" {
			out = append(out, w)
		}
	}
	return out, nil
}

// wakeHandoff answers a handoff wakeup for o (nil: not held) to worker c.To.
func (m *Manager) wakeHandoff(ctx context.Context, o *owned, c wakeup.Conn, targets func() ([]codec.Worker, error)) (wakeup.Result, string) {
	switch {
	case o == nil:
		return wakeup.LostRace, "not held by this worker"
	case c.LeaseVersion != 0 && c.LeaseVersion != o.lease.Version:
		return wakeup.Stale, fmt.Sprintf("held at version %d, not %d", o.lease.Version, c.LeaseVersion)
	case m.ho == nil:
		return wakeup.TargetUnavailable, "planned handoffs are off on this worker"
	case c.To == m.cfg.WorkerID:
		return wakeup.TargetUnavailable, "the target is this worker"
	}
	ws, err := targets()
	if err != nil {
		return wakeup.Failed, "read the registry: " + err.Error()
	}
	i := -1
	for j, w := range ws {
		if w.ID == c.To {
			i = j
		}
	}
	if i < 0 {
		return wakeup.TargetUnavailable, c.To + " is not a live, non-draining worker with spare capacity"
	}
	if !o.handing.CompareAndSwap(false, true) {
		return wakeup.HandingOff, "already handing off"
	}
	o.rebalance.Store(true)
	t := ws[i]
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.draining { // checked under m.mu: a drain waits for every goroutine started before it
		return wakeup.Draining, ""
	}
	m.wg.Go(func() {
		select {
		case m.ho.sem <- struct{}{}:
		case <-o.ctx.Done():
			return
		}
		defer func() { <-m.ho.sem }()
		if o.ctx.Err() == nil {
			m.handOff(o, t, time.Time{})
		}
	})
	return wakeup.HandingOff, ""
}

// drainByHandoff hands list to other workers, least loaded first and spread, before
// stopBy; what it does not hand off is left to the drain's release.
func (m *Manager) drainByHandoff(ctx context.Context, list []*owned, stopBy time.Time) {
	ws, err := m.targets(ctx)
	if err != nil || len(ws) == 0 {
		m.cfg.Log.Info("drain: no worker to hand connections to; releasing", "err", err)
		return
	}
	load := make([]float64, len(ws))
	given := make([]int, len(ws))
	for i, w := range ws {
		load[i] = float64(w.Load) / float64(w.Capacity)
	}
	// Oldest sessions first is as good as any order; keep the registry's for ties.
	sort.SliceStable(list, func(i, j int) bool { return list[i].lease.ID < list[j].lease.ID })
	sem := make(chan struct{}, m.ho.cfg.DrainConcurrency)
	var wg sync.WaitGroup
	var moved, fell int
	var mu sync.Mutex
	for _, o := range list {
		best := -1
		for i, w := range ws {
			if w.Load+given[i] < w.Capacity && (best < 0 || load[i] < load[best]) {
				best = i
			}
		}
		if best < 0 || time.Now().After(stopBy) {
			break
		}
		if o.ctx.Err() != nil || !o.handing.CompareAndSwap(false, true) {
			continue
		}
		given[best]++
		load[best] = float64(ws[best].Load+given[best]) / float64(ws[best].Capacity)
		sem <- struct{}{}
		t := ws[best]
		wg.Go(func() {
			defer func() { <-sem }()
			ok := m.handOff(o, t, stopBy)
			mu.Lock()
			if ok {
				moved++
			} else {
				fell++
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	m.cfg.Log.Info("drain: handoffs done", "handed_off", moved, "released", fell, "targets", len(ws))
}

// dropStandbys gives up every standby (a draining worker takes nothing over).
func (m *Manager) dropStandbys() {
	m.mu.Lock()
	list := make([]*standby, 0, len(m.ho.standby))
	for _, sb := range m.ho.standby {
		list = append(list, sb)
	}
	m.mu.Unlock()
	for _, sb := range list {
		sb.mu.Lock()
		m.dropStandby(sb, "draining")
		sb.mu.Unlock()
	}
}

// adoptNamed adopts id if the table names this worker as its owner after a handoff
// (status handed_off) at a version it does not hold: a transfer whose commit never
// came, reported by a wakeup. ok false: the table does not, carry on as usual.
func (m *Manager) adoptNamed(ctx context.Context, id string) (wakeup.Result, string, bool) {
	c, err := m.ho.cfg.Store.Get(ctx, id)
	if err != nil || c.LeaseOwner != m.cfg.WorkerID || c.Status != lease.StatusHandedOff {
		return "", "", false
	}
	m.mu.Lock()
	sb := m.ho.standby[id]
	m.mu.Unlock()
	if sb != nil {
		sb.mu.Lock()
		res, ok := m.promote(ctx, sb, c.LeaseVersion, handoff.Position{Seq: c.LastSeq, Epoch: c.Epoch})
		sb.mu.Unlock()
		if ok && res.Result == handoff.Committed {
			return wakeup.AlreadyOwned, "took over the standby of a handoff whose commit never came", true
		}
	}
	res := m.adopt(ctx, id, c.LeaseVersion, c.LastSeq, c.Epoch, "named in the table after a handoff; no commit came")
	if res.Result == handoff.Committed {
		return wakeup.AlreadyOwned, res.Detail, true
	}
	return wakeup.Failed, res.Detail, true
}

// ms is d in milliseconds, to 0.1 ms, for logs.
func ms(d time.Duration) float64 { return float64(d.Round(100*time.Microsecond)) / 1e6 }
