package owner

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sockfleet/sockfleet/shared/lease"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/shared/tracing"
	"github.com/sockfleet/sockfleet/shared/wakeup"
	"github.com/sockfleet/sockfleet/worker/internal/peer"
	"github.com/sockfleet/sockfleet/worker/internal/stream"
	"go.opentelemetry.io/otel/trace"
)

// The target's side of a planned handoff (B in docs/HANDOFF.md): prepare a standby
// whose stream writes to a gate, commit it (promote) at the version the old owner
// sends, or adopt the lease from the table when the commit never came; a standby
// neither committed nor adopted ends without a write.

// prepare opens a standby for r.Conn (B's side of step 1).
func (m *Manager) prepare(ctx context.Context, r peer.Request) peer.Response {
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
	case !m.rg.valid(nil):
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
	m.openSession(ctx, o, true) // a child of handoff.prepare; the commit promotes it
	m.mu.Lock()
	if m.draining { // checked under m.mu: a drain waits for every goroutine started before it
		m.mu.Unlock()
		closeSession(o)
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
	return answer(peer.Ready, "")
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
	defer closeSession(o)
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
func (m *Manager) commit(ctx context.Context, r peer.Request) peer.Response {
	m.mu.Lock()
	sb, o := m.ho.standby[r.Conn], m.conns[r.Conn]
	m.mu.Unlock()
	if o != nil {
		if o.lease.Version == r.Version {
			return answer(peer.Committed, "already delivering under this version")
		}
		return refused("held here at version %d", o.lease.Version)
	}
	if sb != nil {
		sb.mu.Lock()
		defer sb.mu.Unlock()
		if sb.from != r.From {
			return refused("standing by for %s, not %s", sb.from, r.From)
		}
		if res, ok := m.promote(ctx, sb, r.Version, peer.Position{Seq: r.Seq, Epoch: r.Epoch}); ok {
			return res
		}
	}
	return m.adopt(ctx, r.Conn, r.Version, r.Seq, r.Epoch, "committed without a usable standby", false)
}

// promote makes sb's stream the owner's at version, delivering after cut. ok false:
// the standby is gone or unusable (it was stopped); the caller adopts instead. Call
// with sb.mu held.
func (m *Manager) promote(ctx context.Context, sb *standby, version int64, cut peer.Position) (peer.Response, bool) {
	o := sb.o
	m.mu.Lock()
	if cur := m.conns[sb.id]; m.ho.standby[sb.id] != sb {
		m.mu.Unlock()
		if cur != nil && cur.lease.Version == version {
			return answer(peer.Committed, "already delivering under this version"), true
		}
		return peer.Response{}, false
	}
	delete(m.ho.standby, sb.id)
	if sb.timer != nil {
		sb.timer.Stop()
	}
	usable := !m.draining && o.ctx.Err() == nil && m.rg.valid(nil) && m.ho.endedAt(sb.id) < version
	if usable {
		usable = sb.gate.Open(cut, version) == nil
	}
	if !usable {
		m.mu.Unlock()
		sb.gate.Abandon(errStandbyGone)
		o.cancel(fmt.Errorf("%w: not usable at the commit", errStandbyGone))
		<-o.done
		return peer.Response{}, false
	}
	o.lease.Version, o.lease.LastSeq, o.lease.Epoch = version, cut.Seq, cut.Epoch
	o.lease.ExpiresAtMs = schema.LeaseHeldByMember
	o.written = stream.Status{State: lease.StatusHandedOff} // the next checkpoint says streaming
	o.writtenSeq = cut.Seq
	o.writtenAt.Store(int64(time.Since(m.started)))
	m.hold(o)
	m.mu.Unlock()
	m.cfg.Metrics.HandoffsTaken.Add(1)
	if err := sb.gate.Flush(ctx); err != nil {
		m.cfg.Log.Warn("handoff: held messages not delivered yet; retried with the next write", "conn", sb.id, "err", err)
	}
	o.span.AddEvent("committed", trace.WithAttributes(tracing.Version(version)))
	m.cfg.Log.InfoContext(ctx, "taken over by handoff", "conn", sb.id, "from", sb.from, "version", version, "after", cut.Seq)
	return answer(peer.Committed, ""), true
}

// adopt takes up a lease the table names this worker for at version (transferred to
// it, its standby gone or never committed; or a phantom lease the reconciliation
// found, reconcile.go) with checkpoint seq: one conditional write (owner = me AND
// version) confirms it, then it streams from seq. If this worker cannot run it, or
// the confirming write fails for any reason but the lease being gone, it releases
// it (conditioned on owner and version, and retried after the next membership
// renew if the table did not answer): a refusal never leaves the table naming a
// worker that runs nothing.
//
// renumber: the lease was not written for this worker by a protocol step it can
// name (a phantom the reconciliation found), so the confirming write also gives it a
// new version (lease.Store.Renumber), above any an earlier session delivered under.
func (m *Manager) adopt(ctx context.Context, id string, version, seq, epoch int64, why string, renumber bool) peer.Response {
	m.mu.Lock()
	switch o := m.conns[id]; {
	case o != nil && o.lease.Version == version:
		m.mu.Unlock()
		return answer(peer.Committed, "already delivering under this version")
	case o != nil || m.acquiring[id] || (m.ho != nil && m.ho.standby[id] != nil):
		m.mu.Unlock()
		return refused("held, being taken, or standing by here")
	case m.ho != nil && !renumber && m.ho.endedAt(id) >= version:
		// A late commit of a session that ended here. A phantom adoption (renumber)
		// is not one: it waited out its quarantine and writes a version of its own,
		// so no session's version is used twice.
		m.mu.Unlock()
		return refused("version %d already ended here", version)
	}
	m.acquiring[id] = true
	runnable := !m.draining && m.rg.valid(nil)
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
		m.release(ctx, l, p)
		return refused("draining or fenced: released for the next owner")
	}
	t0 := time.Now()
	var c codec.Connection
	var err error
	if renumber {
		var nl lease.Lease
		nl, c, err = m.cfg.Member.Store.Renumber(ctx, l, p)
		if err == nil {
			l = nl
		}
	} else {
		c, err = m.confirmer().Checkpoint(ctx, l, p)
	}
	switch {
	case errors.Is(err, lease.ErrLost), errors.Is(err, lease.ErrNotFound):
		return refused("confirm the lease: %v", err)
	case err != nil:
		// Unknown or failed: the table may still name this worker. Give it back so
		// the reconciler finds it an owner; the release matches only this lease.
		p.Status, p.Error = "released", "adopt not confirmed: "+err.Error()
		m.release(ctx, l, p)
		return refused("confirm the lease: %v; released for the next owner", err)
	}
	l.WSURL, l.Spec = c.WSURL, c.Spec
	m.mu.Lock()
	if m.draining || !m.rg.valid(nil) {
		m.mu.Unlock()
		p.Status, p.Error = "released", "handed over to a worker that is draining or fenced"
		m.release(ctx, l, p)
		return refused("draining or fenced: released for the next owner")
	}
	delete(m.acquiring, id)
	m.start(ctx, l, t0)
	o := m.conns[id]
	m.mu.Unlock()
	m.act(o, c) // stopped or changed meanwhile: act as a checkpoint would
	m.cfg.Metrics.HandoffsAdopted.Add(1)
	m.cfg.Log.Info("adopted a lease naming this worker", "conn", id, "version", version, "after", seq, "why", why)
	return answer(peer.Committed, why)
}

// confirmer is the store adopt confirms a lease with.
func (m *Manager) confirmer() interface {
	Checkpoint(ctx context.Context, l lease.Lease, p lease.Progress) (codec.Connection, error)
} {
	if m.ho != nil {
		return m.ho.cfg.Store
	}
	return m.cfg.Member.Store
}

// standbyExpired: no commit came in time. The item says whether the old owner
// transferred the lease (it died, or its commit was lost): then adopt, else give up.
func (m *Manager) standbyExpired(sb *standby) {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	m.mu.Lock()
	live := m.ho.standby[sb.id] == sb
	m.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), m.cfg.ReleaseTimeout)
	defer cancel()
	if !live {
		// The standby ended before its timer (its socket or its buffer gave up), so a
		// commit sent since found nothing to promote, or was lost: the table may name
		// this worker all the same. Read it, as for a live standby.
		if !m.runs(sb.id) && !m.Draining() {
			if _, detail, ok := m.adoptNamed(ctx, sb.id); ok {
				m.cfg.Log.Info("standby ended before its commit; the item named this worker", "conn", sb.id, "detail", detail)
			}
		}
		return
	}
	c, err := m.ho.cfg.Store.Get(ctx, sb.id)
	switch {
	case err != nil && !errors.Is(err, lease.ErrNotFound):
		// Unknown: the lease may be ours. Keep standing by and ask again.
		m.cfg.Log.Warn("standby without a commit: item unreadable; asking again", "conn", sb.id, "err", err)
		sb.timer.Reset(m.cfg.RenewInterval)
	case err == nil && c.LeaseOwner == m.cfg.WorkerID && c.LeaseVersion > sb.version && c.Status == lease.StatusHandedOff:
		if _, ok := m.promote(ctx, sb, c.LeaseVersion, peer.Position{Seq: c.LastSeq, Epoch: c.Epoch}); !ok {
			m.adopt(ctx, sb.id, c.LeaseVersion, c.LastSeq, c.Epoch, "transferred; no commit came", false)
		}
		m.cfg.Metrics.HandoffsAdopted.Add(1)
		m.cfg.Log.Info("standby: no commit came but the item names this worker; took it over", "conn", sb.id, "version", c.LeaseVersion)
	default:
		m.dropStandby(sb, "no commit within the standby timeout, and the item does not name this worker")
	}
}

// abortStandby drops the standby the old owner gave up.
func (m *Manager) abortStandby(r peer.Request) peer.Response {
	m.mu.Lock()
	sb := m.ho.standby[r.Conn]
	m.mu.Unlock()
	if sb == nil {
		return answer(peer.Aborted, "no standby")
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.from != r.From || sb.version != r.Version {
		return refused("standing by for %s at %d", sb.from, sb.version)
	}
	m.dropStandby(sb, "aborted by "+r.From)
	return answer(peer.Aborted, "")
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
		res, ok := m.promote(ctx, sb, c.LeaseVersion, peer.Position{Seq: c.LastSeq, Epoch: c.Epoch})
		sb.mu.Unlock()
		if ok && res.Result == peer.Committed {
			return wakeup.AlreadyOwned, "took over the standby of a handoff whose commit never came", true
		}
	}
	res := m.adopt(ctx, id, c.LeaseVersion, c.LastSeq, c.Epoch, "named in the table after a handoff; no commit came", false)
	if res.Result == peer.Committed {
		return wakeup.AlreadyOwned, res.Detail, true
	}
	return wakeup.Failed, res.Detail, true
}
