package owner

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sockfleet/sockfleet/shared/lease"
	"github.com/sockfleet/sockfleet/shared/registry"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

// Membership mode (stream mode). The worker item is this worker's membership lease;
// connection leases carry no expiry of their own (schema.LeaseHeldByMember) and are
// never renewed. Two loops, each ticking every RenewInterval:
//
//   - the renew loop renews the membership (registry.Renew, conditioned on the
//     incarnation and on not being declared dead), and does nothing else, so the
//     renew never waits behind bulk work; ErrNotMember stops every connection and
//     makes Run return ErrExpelled, so the supervisor starts a fresh incarnation;
//   - the work loop retries releases that failed (an outage longer than the lease)
//     once a renew has succeeded since its last retry; checkpoints each connection
//     whose last_seq or status changed, at most once per CheckpointInterval; and
//     every BackstopInterval reads its own connections in BatchGetItem pages
//     (eventually consistent) and confirms any difference with a conditional write.
//     A pass over thousands of connections (a start-up, when every status changed)
//     may take longer than the fence deadline; it delays only the next pass.
//
// One timer fences every connection at the last successful membership renew's start
// plus FenceAfter, on the monotonic clock.

// ErrExpelled: the membership renew found this worker declared dead, replaced by
// another incarnation, or deleted. The process should exit.
var ErrExpelled = errors.New("expelled from the membership")

// MemberConfig configures membership mode.
type MemberConfig struct {
	Incarnation string // new per process start
	Registry    MemberRegistry
	Store       MemberStore
	// CheckpointInterval: a connection's last_seq and status are written at most this
	// often (and always at release). It is the duplicate window after a crash.
	CheckpointInterval time.Duration
	// BackstopInterval: how often owned connections are read back (lost wakeups).
	BackstopInterval time.Duration
	// Now is the wall clock the membership expiry is computed from; default time.Now.
	Now func() time.Time
}

// MemberRegistry is the part of the registry membership mode uses.
type MemberRegistry interface {
	Join(ctx context.Context, w codec.Worker, now time.Time, skew time.Duration) (bool, error)
	Renew(ctx context.Context, w codec.Worker) error
	Leave(ctx context.Context, id, incarnation string, now time.Time) error
}

// MemberStore is the part of the lease store membership mode uses besides Store.
type MemberStore interface {
	Checkpoint(ctx context.Context, l lease.Lease, p lease.Progress) (codec.Connection, error)
	ReadOwned(ctx context.Context, ids []string) (map[string]lease.Snapshot, float64, error)
	ReleaseAllOwnedBy(ctx context.Context, worker string) ([]string, error)
}

type membership struct {
	m     *Manager
	cfg   MemberConfig
	store MemberStore

	renewedAt atomic.Int64 // ns after Manager.started when the last good renew began; -1: none
	timer     *time.Timer  // fences every connection
	expelled  atomic.Bool
	renewed   chan struct{} // a renew succeeded; buffered 1
	lastBack  time.Time     // last backstop pass; work loop only

	mu      sync.Mutex
	pending map[string]pendingRelease
}

type pendingRelease struct {
	l lease.Lease
	p lease.Progress
}

func newMembership(m *Manager, c *MemberConfig) (*membership, error) {
	if c.Incarnation == "" || c.Registry == nil || c.Store == nil {
		return nil, errors.New("owner config: membership needs an incarnation, a registry and a store")
	}
	if c.CheckpointInterval <= 0 || c.BackstopInterval <= 0 {
		return nil, fmt.Errorf("owner config: checkpoint interval %s and backstop interval %s must be positive",
			c.CheckpointInterval, c.BackstopInterval)
	}
	if m.cfg.Lease > registry.MaxMemberLease {
		return nil, fmt.Errorf("owner config: membership lease %s exceeds %s (the tombstone lease)", m.cfg.Lease, registry.MaxMemberLease)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	mem := &membership{m: m, cfg: *c, store: c.Store, pending: map[string]pendingRelease{},
		renewed: make(chan struct{}, 1)}
	mem.renewedAt.Store(-1)
	mem.timer = time.AfterFunc(time.Hour, mem.fenceAll)
	mem.timer.Stop()
	return mem, nil
}

// Joined reports whether the worker can take connections: in membership mode, once
// it has joined (and until it is expelled); always in polling mode.
func (m *Manager) Joined() bool {
	return m.mem == nil || (m.mem.renewedAt.Load() >= 0 && !m.mem.expelled.Load())
}

// valid reports whether the membership lease is before its fence deadline now, on
// the monotonic clock.
func (mem *membership) valid() bool {
	at := mem.renewedAt.Load()
	if at < 0 || mem.expelled.Load() {
		return false
	}
	return time.Since(mem.m.started) < time.Duration(at)+mem.m.fence
}

func (mem *membership) worker(draining bool) codec.Worker {
	m := mem.m
	m.mu.Lock()
	load := m.loadLocked()
	m.mu.Unlock()
	return codec.Worker{
		ID: m.cfg.WorkerID, Addr: m.cfg.Addr, Capacity: m.cfg.MaxConnections, Load: load, Draining: draining,
		Incarnation: mem.cfg.Incarnation,
		// Read after the caller took its start time: the expiry is at least that
		// start plus the lease, which is what the fence is counted from.
		HeartbeatExpiresAtMs: mem.cfg.Now().Add(m.cfg.Lease).UnixMilli(),
	}
}

// succeeded records a good renew (or join) that began at start, and tells the work
// loop the table answers again.
func (mem *membership) succeeded(start time.Time) {
	mem.renewedAt.Store(int64(start.Sub(mem.m.started)))
	mem.timer.Reset(time.Until(start.Add(mem.m.fence)))
	select {
	case mem.renewed <- struct{}{}:
	default:
	}
}

// fenceAll is the membership fence: every connection stops.
func (mem *membership) fenceAll() {
	if mem.valid() {
		return // a renew that began in time landed after the timer fired
	}
	for _, o := range mem.m.snapshot() {
		mem.m.fenced(o)
	}
}

// join registers this incarnation, retrying every RenewInterval until it succeeds or
// ctx ends. If it replaced an older item of the same id (which had lapsed beyond the
// skew margin, so its holder has stopped), it releases the connections that still
// name this id, as no one else will.
func (mem *membership) join(ctx context.Context) error {
	m := mem.m
	for {
		m.lastRound.Store(int64(time.Since(m.started)))
		start := time.Now()
		jctx, cancel := context.WithTimeout(ctx, m.cfg.RenewInterval)
		replaced, err := mem.cfg.Registry.Join(jctx, mem.worker(false), mem.cfg.Now(), m.cfg.SkewMargin)
		cancel()
		switch {
		case err == nil:
			mem.succeeded(start)
			if replaced {
				rctx, rcancel := context.WithTimeout(ctx, m.cfg.DrainTimeout)
				ids, rerr := mem.store.ReleaseAllOwnedBy(rctx, m.cfg.WorkerID)
				rcancel()
				m.cfg.Log.Info("joined over a lapsed item of the same id; released its leftovers", "released", ids, "err", rerr)
			}
			m.cfg.Log.Info("joined", "incarnation", mem.cfg.Incarnation)
			return nil
		case errors.Is(err, registry.ErrInUse):
			return fmt.Errorf("%w: %v", ErrExpelled, err)
		}
		m.cfg.Metrics.MemberRenewFailures.Add(1)
		m.cfg.Log.Warn("join failed; retrying", "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(m.cfg.RenewInterval):
		}
	}
}

// run is Manager.Run in membership mode.
func (mem *membership) run(ctx context.Context) error {
	m := mem.m
	m.lastRound.Store(int64(time.Since(m.started)))
	m.running.Store(true)
	defer m.running.Store(false)
	if err := mem.join(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // stopped before joining: nothing to drain
		}
		return err
	}
	var startup sync.WaitGroup
	if m.cfg.Candidates != nil {
		startup.Go(func() { m.startup(ctx) })
	}
	// The loops outlive ctx: a drain keeps the membership renewed while it stops the
	// connections and releases their leases.
	loopCtx, stopLoop := context.WithCancel(context.Background())
	var loop sync.WaitGroup
	loop.Go(func() { mem.renewLoop(loopCtx) })
	loop.Go(func() { mem.workLoop(loopCtx) })
	select {
	case <-ctx.Done():
	case <-m.base.Done(): // expelled
	}
	startup.Wait()
	err := m.drain()
	stopLoop()
	loop.Wait()
	mem.timer.Stop()
	if mem.expelled.Load() {
		return ErrExpelled
	}
	return err
}

// renewLoop renews the membership every RenewInterval until ctx ends. It makes no
// other call, so bulk work (start-up acquires, checkpoints, the backstop) cannot hold
// it back.
func (mem *membership) renewLoop(ctx context.Context) {
	m := mem.m
	t := time.NewTicker(m.cfg.RenewInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.lastRound.Store(int64(time.Since(m.started)))
			if !mem.expelled.Load() {
				mem.renew(ctx)
			}
		}
	}
}

// workLoop retries failed releases after each successful renew (outside a drain), and every
// RenewInterval checkpoints and (every BackstopInterval) reads back the owned
// connections, until ctx ends.
func (mem *membership) workLoop(ctx context.Context) {
	t := time.NewTicker(mem.m.cfg.RenewInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-mem.renewed:
			m := mem.m
			m.mu.Lock()
			draining := m.draining
			m.mu.Unlock()
			// A drain retries them itself (leave), and must see every failure.
			if !draining && !mem.expelled.Load() {
				mem.retryReleases()
			}
		case <-t.C:
			mem.work(ctx)
		}
	}
}

func (mem *membership) work(ctx context.Context) {
	m := mem.m
	if mem.expelled.Load() {
		return
	}
	mem.checkpoints(ctx)
	if time.Since(mem.lastBack) >= mem.cfg.BackstopInterval {
		mem.lastBack = time.Now()
		mem.backstop(ctx)
	}
	m.cfg.EMF.Put(schema.MetricOwned, m.cfg.Metrics.Owned.Load())
}

// renew renews the membership once and reports whether it succeeded.
func (mem *membership) renew(ctx context.Context) bool {
	m := mem.m
	m.mu.Lock()
	draining := m.draining
	m.mu.Unlock()
	start := time.Now()
	rctx, cancel := context.WithTimeout(ctx, m.cfg.RenewInterval)
	defer cancel()
	err := mem.cfg.Registry.Renew(rctx, mem.worker(draining))
	switch {
	case err == nil:
		mem.succeeded(start)
		m.cfg.Log.Debug("membership renewed")
		return true
	case errors.Is(err, registry.ErrNotMember):
		mem.expel(err)
	default:
		m.cfg.Metrics.MemberRenewFailures.Add(1)
		m.cfg.Metrics.RenewFailures.Add(1)
		m.cfg.EMF.Put(schema.MetricRenewFailures, 1)
		m.cfg.Log.Warn("membership renew failed", "err", err)
	}
	return false
}

// expel stops everything: this worker is no longer a member.
func (mem *membership) expel(err error) {
	if mem.expelled.Swap(true) {
		return
	}
	mem.m.cfg.Log.Error("no longer a member; stopping every connection and exiting", "err", err)
	for _, o := range mem.m.snapshot() {
		o.cancel(errExpelled)
	}
	mem.m.cancelBase(errExpelled)
}

func (mem *membership) retryLater(l lease.Lease, p lease.Progress) {
	mem.mu.Lock()
	defer mem.mu.Unlock()
	mem.pending[l.ID] = pendingRelease{l: l, p: p}
}

// retryReleases retries the releases that failed, now that the table answered.
func (mem *membership) retryReleases() {
	mem.mu.Lock()
	list := make([]pendingRelease, 0, len(mem.pending))
	for _, r := range mem.pending {
		list = append(list, r)
	}
	clear(mem.pending)
	mem.mu.Unlock()
	for _, r := range list {
		mem.m.cfg.Metrics.ReleaseRetries.Add(1)
		mem.m.release(r.l, r.p) // a failure puts it back
	}
}

// pendingCount is how many releases still wait for a retry.
func (mem *membership) pendingCount() int {
	mem.mu.Lock()
	defer mem.mu.Unlock()
	return len(mem.pending)
}

// checkpoints writes the checkpoint of every connection whose last_seq or status
// changed and whose last checkpoint is at least CheckpointInterval old.
func (mem *membership) checkpoints(ctx context.Context) {
	m := mem.m
	now := int64(time.Since(m.started))
	every := int64(mem.cfg.CheckpointInterval)
	sem := make(chan struct{}, m.cfg.RenewConcurrency)
	var wg sync.WaitGroup
	for _, o := range m.snapshot() {
		if !o.renewMu.TryLock() {
			continue
		}
		due := now-o.checkpointAt >= every && (o.s.LastSeq() != o.writtenSeq || o.s.Status() != o.written)
		if !due || o.ctx.Err() != nil {
			o.renewMu.Unlock()
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			defer o.renewMu.Unlock()
			m.renew(ctx, o)
		})
	}
	wg.Wait()
}

// backstop reads every owned connection back and confirms, with a conditional
// checkpoint that returns the item, each one that looks different from what this
// worker holds: a STOPPED or ws_url change whose wakeup was lost, or a lease lost.
func (mem *membership) backstop(ctx context.Context) {
	m := mem.m
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
		snaps, units, err := mem.store.ReadOwned(rctx, page)
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

func differs(o *owned, sn lease.Snapshot, me string) bool {
	return !sn.Found || sn.LeaseOwner != me || sn.LeaseVersion != o.lease.Version ||
		sn.DesiredState != schema.Started || sn.WSURL != o.s.URL()
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

// retryable reports whether a failed release may succeed later: the table was not
// reached, rather than the lease being gone.
func retryable(err error) bool {
	return !errors.Is(err, lease.ErrLost) && !errors.Is(err, lease.ErrNotFound) && !errors.Is(err, lease.ErrInvalid)
}

// leave ends a drain: releases that failed are retried once, and the membership item
// is marked gone (registry.Leave) only if every lease was given back. Otherwise it is left to lapse, so
// the reconciler declares this incarnation dead and releases what remains, which is
// faster than the tombstone an absent owner would need.
func (mem *membership) leave(ctx context.Context, err error) error {
	m := mem.m
	if mem.expelled.Load() {
		m.cfg.Log.Info("drained after expulsion", "err", err)
		return err
	}
	if mem.pendingCount() > 0 {
		mem.retryReleases()
	}
	if n := mem.pendingCount(); n > 0 {
		err = errors.Join(err, fmt.Errorf("drain: %d releases failed; leaving the membership to lapse", n))
	} else if lerr := mem.cfg.Registry.Leave(ctx, m.cfg.WorkerID, mem.cfg.Incarnation, mem.cfg.Now()); lerr != nil {
		m.cfg.Metrics.RegistryErrors.Add(1)
		err = errors.Join(err, lerr)
	}
	m.cfg.Log.Info("drained", "err", err)
	return err
}
