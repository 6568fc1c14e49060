package owner

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"time"

	"github.com/sockfleet/sockfleet/shared/lease"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/worker/internal/member"
)

// Stream mode. The worker's registry item is its membership lease, held by a
// member.Session; connection leases carry no expiry of their own
// (schema.LeaseHeldByMember) and are never renewed. Two loops, each ticking every
// RenewInterval:
//
//   - the session's renew loop (member.Session.Run) renews the membership and does
//     nothing else, so the renew never waits behind bulk work; "not a member" ends
//     the session, which stops every connection and makes Run return ErrExpelled,
//     so the supervisor starts a fresh incarnation;
//   - the work loop retries releases that failed (an outage longer than the lease)
//     once a renew has succeeded since its last retry; checkpoints each connection
//     whose last_seq or status changed, at most once per CheckpointInterval; and
//     every BackstopInterval reads its own connections in BatchGetItem pages
//     (eventually consistent) and confirms any difference with a conditional write.
//     A pass over thousands of connections (a start-up, when every status changed)
//     may take longer than the fence deadline; it delays only the next pass.
//
// Every connection's fence is the session's: its context is cancelled when the
// session's is (member.Session.Ctx), at the last successful membership renew's start
// plus FenceAfter, on the monotonic clock.

// ErrExpelled: the membership renew found this worker declared dead, replaced by
// another incarnation, or deleted (or its id is held by a live item at start). The
// process should exit.
var ErrExpelled = member.ErrExpelled

// MemberConfig configures stream mode.
type MemberConfig struct {
	Incarnation string // new per process start
	Registry    member.Registry
	Store       MemberStore
	// CheckpointInterval: a connection's last_seq and status are written at most this
	// often (and always at release). It is the duplicate window after a crash.
	CheckpointInterval time.Duration
	// BackstopInterval: how often owned connections are read back (lost wakeups).
	BackstopInterval time.Duration
	// Now is the wall clock the membership expiry is computed from; default time.Now.
	Now func() time.Time
}

// MemberStore is the part of the lease store stream mode uses besides Store.
type MemberStore interface {
	Checkpoint(ctx context.Context, l lease.Lease, p lease.Progress) (codec.Connection, error)
	ReadOwned(ctx context.Context, ids []string) (map[string]lease.Snapshot, float64, error)
	ReleaseAllOwnedBy(ctx context.Context, worker string) ([]string, error)
	// Naming lists the connections the lease_owner index names worker in (keys only).
	Naming(ctx context.Context, worker string) ([]string, float64, error)
	Get(ctx context.Context, id string) (codec.Connection, error)
	// Renumber gives a lease taken up from the table a new version (reconcile.go).
	Renumber(ctx context.Context, l lease.Lease, p lease.Progress) (lease.Lease, codec.Connection, error)
	// AcquireUnheld acquires a lease that carried the reconciler's unheld mark since
	// sinceMs (the start-up pass, startup.go).
	AcquireUnheld(ctx context.Context, id, worker string, sinceMs int64) (lease.Lease, error)
}

// streamMode is the stream-mode regime.
type streamMode struct {
	m     *Manager
	cfg   MemberConfig
	store MemberStore
	sess  *member.Session

	stopLoops context.CancelFunc // set by keep
	loops     sync.WaitGroup
	lastBack  time.Time              // last backstop pass; work loop only
	phantoms  map[string]phantomSeen // reconcile.go; work loop only

	mu      sync.Mutex
	pending map[string]pendingRelease
}

type pendingRelease struct {
	l lease.Lease
	p lease.Progress
}

func newStreamMode(m *Manager, c *MemberConfig) (*streamMode, error) {
	if c.Incarnation == "" || c.Registry == nil || c.Store == nil {
		return nil, errors.New("owner config: membership needs an incarnation, a registry and a store")
	}
	if c.CheckpointInterval <= 0 || c.BackstopInterval <= 0 {
		return nil, fmt.Errorf("owner config: checkpoint interval %s and backstop interval %s must be positive",
			c.CheckpointInterval, c.BackstopInterval)
	}
	sess, err := member.New(member.Config{
		WorkerID: m.cfg.WorkerID, Incarnation: c.Incarnation, Addr: m.cfg.Addr, Capacity: m.cfg.MaxConnections,
		Registry: c.Registry, Lease: m.cfg.Lease, RenewInterval: m.cfg.RenewInterval, Fence: m.fence,
		SkewMargin: m.cfg.SkewMargin, Now: c.Now, Metrics: m.cfg.Metrics, EMF: m.cfg.EMF, Log: m.cfg.Log,
		State: func() (int, bool) {
			m.mu.Lock()
			defer m.mu.Unlock()
			return m.loadLocked(), m.draining
		},
	})
	if err != nil {
		return nil, fmt.Errorf("owner config: %w", err)
	}
	return &streamMode{m: m, cfg: *c, store: c.Store, sess: sess, pending: map[string]pendingRelease{}}, nil
}

// join joins the membership. If it replaced an older item of the same id (which had
// lapsed beyond the skew margin, so its holder has stopped), it releases the
// connections that still name this id, as no one else will.
func (r *streamMode) join(ctx context.Context) error {
	replaced, err := r.sess.Join(ctx)
	if err != nil {
		return err
	}
	if replaced {
		m := r.m
		rctx, cancel := context.WithTimeout(ctx, m.cfg.DrainTimeout)
		ids, rerr := r.store.ReleaseAllOwnedBy(rctx, m.cfg.WorkerID)
		cancel()
		m.cfg.Log.Info("joined over a lapsed item of the same id; released its leftovers", "released", ids, "err", rerr)
	}
	return nil
}

// keep starts the renew and work loops, which outlive ctx (a drain keeps the
// membership renewed while it stops the connections and releases their leases), and
// returns when ctx ends or the session ends.
func (r *streamMode) keep(ctx context.Context) error {
	loopCtx, stop := context.WithCancel(context.Background())
	r.stopLoops = stop
	r.loops.Go(func() { r.sess.Run(loopCtx) })
	r.loops.Go(func() { r.workLoop(loopCtx) })
	select {
	case <-ctx.Done():
		return nil
	case <-r.sess.Done():
		return r.sess.Err()
	}
}

func (r *streamMode) lastRound() time.Time { return r.sess.LastAttempt() }

// valid: the membership covers every connection, and any about to be acquired.
func (r *streamMode) valid(*owned) bool { return r.sess.Valid() }

// fence stops o when the session's current validity ends: a fence (errFenced, via
// m.fenced) or the session's end (errExpelled).
func (r *streamMode) fence(o *owned) func() bool {
	ctx := r.sess.Ctx()
	return context.AfterFunc(ctx, func() {
		if errors.Is(context.Cause(ctx), member.ErrExpelled) {
			o.cancel(errExpelled)
			return
		}
		r.m.fenced(o)
	})
}

func (r *streamMode) checkpoint(ctx context.Context, o *owned, p lease.Progress) (codec.Connection, error) {
	c, err := r.store.Checkpoint(ctx, o.lease, p)
	if err == nil {
		r.m.cfg.Metrics.Checkpoints.Add(1)
	}
	return c, err
}

// release gives l back; one the table did not answer is kept and retried after the
// next successful membership renew.
func (r *streamMode) release(ctx context.Context, l lease.Lease, p lease.Progress) error {
	err := r.m.cfg.Store.Release(ctx, l, p)
	if err != nil && retryable(err) {
		r.mu.Lock()
		r.pending[l.ID] = pendingRelease{l: l, p: p}
		r.mu.Unlock()
	}
	return err
}

// retryable reports whether a failed release may succeed later: the table was not
// reached, rather than the lease being gone.
func retryable(err error) bool {
	return !errors.Is(err, lease.ErrLost) && !errors.Is(err, lease.ErrNotFound) && !errors.Is(err, lease.ErrInvalid)
}

// advertise renews the membership now, carrying the draining flag.
func (r *streamMode) advertise(ctx context.Context) {
	if r.sess.Err() == nil {
		_ = r.sess.Renew(ctx) // said in the log and the metrics
	}
}

// leave ends a drain: it stops the loops, retries once the releases that failed,
// and marks the membership item gone (member.Session.Leave) only if every lease was
// given back. Otherwise it is left to lapse, so the reconciler declares this
// incarnation dead and releases what remains, which is faster than the tombstone an
// absent owner would need.
func (r *streamMode) leave(ctx context.Context, err error) error {
	if r.stopLoops != nil {
		r.stopLoops()
	}
	r.loops.Wait()
	if serr := r.sess.Err(); serr != nil {
		return serr // expelled: the item is the reconciler's to go by
	}
	if r.pendingCount() > 0 {
		r.retryReleases()
	}
	if n := r.pendingCount(); n > 0 {
		return errors.Join(err, fmt.Errorf("drain: %d releases failed; leaving the membership to lapse", n))
	}
	return errors.Join(err, r.sess.Leave(ctx))
}

// workLoop retries failed releases after each successful renew (outside a drain),
// and every RenewInterval checkpoints and (every BackstopInterval) reads back the
// owned connections, until ctx ends.
func (r *streamMode) workLoop(ctx context.Context) {
	t := time.NewTicker(r.m.cfg.RenewInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.sess.Renewed():
			// A drain retries them itself (leave), and must see every failure.
			if !r.m.Draining() && r.sess.Err() == nil {
				r.retryReleases()
				r.resolveAcquires(ctx)
			}
		case <-t.C:
			r.work(ctx)
		}
	}
}

func (r *streamMode) work(ctx context.Context) {
	if r.sess.Err() != nil {
		return
	}
	r.checkpoints(ctx)
	if time.Since(r.lastBack) >= r.cfg.BackstopInterval {
		r.lastBack = time.Now()
		r.backstop(ctx)
		r.reconcile(ctx)
	} else if len(r.phantoms) > 0 {
		r.adoptDue(ctx)
	}
	r.m.cfg.EMF.Put(schema.MetricOwned, r.m.cfg.Metrics.Owned.Load())
}

// retryReleases retries the releases that failed, now that the table answered.
func (r *streamMode) retryReleases() {
	r.mu.Lock()
	list := make([]pendingRelease, 0, len(r.pending))
	for _, p := range r.pending {
		list = append(list, p)
	}
	clear(r.pending)
	r.mu.Unlock()
	for _, p := range list {
		r.m.cfg.Metrics.ReleaseRetries.Add(1)
		r.m.release(context.Background(), p.l, p.p) // a failure puts it back
	}
}

// pendingCount is how many releases still wait for a retry.
func (r *streamMode) pendingCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.pending)
}

// checkpoints writes the checkpoint of every connection whose last_seq or status
// changed and whose last checkpoint is at least CheckpointInterval old.
func (r *streamMode) checkpoints(ctx context.Context) {
	m := r.m
	now := int64(time.Since(m.started))
	every := int64(r.cfg.CheckpointInterval)
	sem := make(chan struct{}, m.cfg.RenewConcurrency)
	var wg sync.WaitGroup
	for _, o := range m.snapshot() {
		if !o.writeMu.TryLock() {
			continue
		}
		due := now-o.writtenAt.Load() >= every && (o.s.LastSeq() != o.writtenSeq || o.s.Status() != o.written)
		if !due || o.ctx.Err() != nil {
			o.writeMu.Unlock()
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			defer o.writeMu.Unlock()
			m.checkpoint(ctx, o)
		})
	}
	wg.Wait()
}

// backstop reads every owned connection back and confirms, with a conditional
// checkpoint that returns the item, each one that looks different from what this
// worker holds: a STOPPED or ws_url change whose wakeup was lost, a spec edit, or a
// lease lost.
func (r *streamMode) backstop(ctx context.Context) {
	m := r.m
	list := m.snapshot()
	byID := make(map[string]*owned, len(list))
	ids := make([]string, 0, len(list))
	for _, o := range list {
		if o.ctx.Err() == nil {
			byID[o.lease.ID] = o
			ids = append(ids, o.lease.ID)
		}
	}
	for len(ids) > 0 && ctx.Err() == nil {
		n := min(len(ids), lease.BatchGetLimit)
		page := ids[:n]
		ids = ids[n:]
		rctx, cancel := context.WithTimeout(ctx, m.cfg.RenewInterval)
		snaps, units, err := r.store.ReadOwned(rctx, page)
		cancel()
		m.cfg.Metrics.BackstopReads.Add(1)
		m.cfg.Metrics.BackstopReadUnits.Add(int64(units * 1000))
		if err != nil {
			m.cfg.Log.Warn("backstop read failed", "err", err)
			continue
		}
		for id, sn := range snaps {
			o := byID[id]
			if o == nil || !differs(o, sn, m.cfg.WorkerID) {
				continue
			}
			m.cfg.Log.Info("backstop: item differs from what is held; confirming", "conn", id)
			m.check(ctx, o)
		}
	}
}

// differs says whether sn is not what o holds. The spec, the expiry and the fields
// no write repairs count: no stream record reports their edits on an owned item,
// and an idle connection has no checkpoint to read them.
func differs(o *owned, sn lease.Snapshot, me string) bool {
	return !sn.Found || sn.LeaseOwner != me || sn.LeaseVersion != o.lease.Version || sn.ExpiresAtMs != schema.LeaseHeldByMember ||
		sn.DesiredState != schema.Started || sn.WSURL != o.s.URL() ||
		sn.SpecErr != nil || sn.Unrunnable != nil || !reflect.DeepEqual(sn.Spec, o.lease.Spec)
}
