package owner

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/sockfleet/sockfleet/shared/lease"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

// Reconciling the table against this worker (stream mode, issue 21). At each
// backstop pass the worker lists every item the lease_owner index names it in and,
// for each one it runs no session for (a phantom lease: a handoff whose commit and
// adopt failed, an ambiguous acquire, an operator's "Create item", a stale image),
// reads the item and either releases it (not STARTED) or adopts it: one write
// conditioned on exactly the owner and version it read, then a session from the
// item's last_seq. See the package doc for why this never makes two deliverers.

// phantomSeen is when a pass first saw a phantom lease at version, on the monotonic
// clock.
type phantomSeen struct {
	version int64
	at      time.Time
}

// quarantine is how long a phantom lease must have named this worker, unchanged,
// before it is adopted: long enough for a holder it displaced (a stale image or a
// recreated item written over another worker's lease) to have stopped. Such a
// holder, if it reaches the table, reads the item in a backstop pass that starts at
// most BackstopInterval + RenewInterval after the write and stops on its
// conditional checkpoint (one read and one write, each bounded by RenewInterval);
// if it cannot, its fence stops it at most the fence deadline after its last
// successful renew, plus a renew interval for that renew to have started.
func (r *streamMode) quarantine() time.Duration {
	return max(r.cfg.BackstopInterval+3*r.m.cfg.RenewInterval, r.m.fence+r.m.cfg.RenewInterval)
}

// reconcile is the backstop's second half: see above. Work loop only.
func (r *streamMode) reconcile(ctx context.Context) {
	m := r.m
	if m.Draining() {
		return
	}
	qctx, cancel := context.WithTimeout(ctx, m.cfg.RenewInterval)
	ids, units, err := r.store.Naming(qctx, m.cfg.WorkerID)
	cancel()
	m.cfg.Metrics.ReconcileQueries.Add(1)
	m.cfg.Metrics.ReconcileReadUnits.Add(int64(units * 1000))
	if err != nil {
		m.cfg.Log.Warn("reconcile: lease_owner index query failed", "err", err)
		return
	}
	seen := make(map[string]phantomSeen)
	for _, id := range ids {
		if ctx.Err() != nil || m.Draining() {
			return
		}
		if m.runs(id) || r.releasePending(id) {
			continue
		}
		gctx, cancel := context.WithTimeout(ctx, m.cfg.RenewInterval)
		c, err := r.store.Get(gctx, id)
		cancel()
		switch {
		case errors.Is(err, lease.ErrNotFound):
			continue
		case err != nil:
			m.cfg.Log.Warn("reconcile: read failed", "conn", id, "err", err)
			if prev, ok := r.phantoms[id]; ok {
				seen[id] = prev // keep its age: the read says nothing either way
			}
			continue
		case c.LeaseOwner != m.cfg.WorkerID || m.runs(id):
			continue // the index lags, or it was taken up meanwhile
		}
		if p, ok := r.phantomAction(ctx, id, c, r.phantoms, seen); ok {
			m.cfg.Metrics.PhantomsReleased.Add(1)
			m.cfg.Log.Warn("reconcile: released a lease naming this worker, which runs no session for it",
				"conn", id, "version", c.LeaseVersion, "why", p.Error)
			m.release(ctx, lease.Lease{ID: id, Owner: m.cfg.WorkerID, Version: c.LeaseVersion}, p)
		}
	}
	r.phantoms = seen
}

// phantomAction decides what to do with phantom c (read consistently, naming this
// worker; earlier holds what was seen of it before): adopt it (done here), wait
// (recorded in seen), or release it (the progress to release with, true).
func (r *streamMode) phantomAction(ctx context.Context, id string, c codec.Connection, earlier, seen map[string]phantomSeen) (lease.Progress, bool) {
	m := r.m
	release := lease.Progress{LastSeq: c.LastSeq, Epoch: c.Epoch}
	if c.LeaseVersion <= 0 {
		// An unusable version no conditional write can match; the lease package's
		// repairs own it (the sweep and the crash path release it as it is).
		return lease.Progress{}, false
	}
	prev, known := earlier[id]
	if !known || prev.version != c.LeaseVersion {
		m.cfg.Metrics.PhantomsFound.Add(1)
		m.cfg.Log.Warn("reconcile: the table names this worker for a connection it does not run",
			"conn", id, "version", c.LeaseVersion, "desired_state", c.DesiredState)
		prev = phantomSeen{version: c.LeaseVersion, at: time.Now()}
	}
	if c.DesiredState != schema.Started {
		// Nobody may deliver it, and no acquire takes it while it is not STARTED:
		// release at once.
		release.Status = "stopped"
		release.Error = fmt.Sprintf("named %s, which ran no session for it (desired_state %s); released", m.cfg.WorkerID, c.DesiredState)
		return release, true
	}
	if time.Since(prev.at) < r.quarantine() {
		seen[id] = prev
		return lease.Progress{}, false
	}
	actx, cancel := context.WithTimeout(ctx, m.cfg.RenewInterval)
	defer cancel()
	res := m.adopt(actx, id, c.LeaseVersion, c.LastSeq, c.Epoch,
		fmt.Sprintf("named this worker for %s without a session here", time.Since(prev.at).Round(time.Millisecond)), true)
	if m.runs(id) {
		m.cfg.Metrics.PhantomsAdopted.Add(1)
	} else {
		m.cfg.Log.Warn("reconcile: could not adopt", "conn", id, "detail", res.Detail)
		seen[id] = prev
	}
	return lease.Progress{}, false
}

// adoptDue adopts, at the work loop's tick rather than at the next pass, each phantom
// whose quarantine has passed, after reading it again: a phantom is then streamed
// within one backstop pass (+ one tick) of its write plus the quarantine. Work loop
// only.
func (r *streamMode) adoptDue(ctx context.Context) {
	m := r.m
	q := r.quarantine()
	for id, p := range maps.Clone(r.phantoms) {
		if time.Since(p.at) < q || ctx.Err() != nil || m.Draining() {
			continue
		}
		delete(r.phantoms, id)
		if m.runs(id) || r.releasePending(id) {
			continue
		}
		gctx, cancel := context.WithTimeout(ctx, m.cfg.RenewInterval)
		c, err := r.store.Get(gctx, id)
		cancel()
		switch {
		case err != nil && !errors.Is(err, lease.ErrNotFound):
			r.phantoms[id] = p // unknown: try again at the next tick
			continue
		case err != nil || c.LeaseOwner != m.cfg.WorkerID || m.runs(id):
			continue
		}
		if rel, ok := r.phantomAction(ctx, id, c, map[string]phantomSeen{id: p}, r.phantoms); ok {
			m.cfg.Metrics.PhantomsReleased.Add(1)
			m.release(ctx, lease.Lease{ID: id, Owner: m.cfg.WorkerID, Version: c.LeaseVersion}, rel)
		}
	}
}

// runs reports whether this worker has a session, an acquire or a standby for id.
func (m *Manager) runs(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.conns[id] != nil || m.acquiring[id] || (m.ho != nil && m.ho.standby[id] != nil)
}

// releasePending reports whether a release of id waits for its retry.
func (r *streamMode) releasePending(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.pending[id]
	return ok
}

// resolveAcquires reads the item of every acquire whose outcome was unknown
// (lease.AmbiguousAcquire) and adopts it at once if it is exactly that acquire's
// write with nothing after it: it names this worker, with status "acquired" and the
// acquire's stamp. Then no one else can have acquired since, so no other worker
// delivers it. An item that cannot be read yet is kept for the next renew; any other
// answer ends the matter (what still names this worker is the reconciliation's).
func (r *streamMode) resolveAcquires(ctx context.Context) {
	m := r.m
	m.mu.Lock()
	list := make(map[string]int64, len(m.unresolved))
	for id, stamp := range m.unresolved {
		list[id] = stamp
	}
	m.mu.Unlock()
	for id, stamp := range list {
		gctx, cancel := context.WithTimeout(ctx, m.cfg.RenewInterval)
		c, err := r.store.Get(gctx, id)
		cancel()
		if err != nil && !errors.Is(err, lease.ErrNotFound) {
			continue
		}
		m.mu.Lock()
		if m.unresolved[id] == stamp {
			delete(m.unresolved, id)
		}
		m.mu.Unlock()
		if err != nil || c.LeaseOwner != m.cfg.WorkerID || c.Status != lease.StatusAcquired || c.StatusAtMs != stamp {
			continue
		}
		res := m.adopt(ctx, id, c.LeaseVersion, c.LastSeq, c.Epoch, "an acquire whose outcome was unknown had landed", false)
		m.cfg.Log.Info("resolved an ambiguous acquire", "conn", id, "version", c.LeaseVersion, "result", res.Result, "detail", res.Detail)
	}
}
