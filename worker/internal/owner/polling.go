package owner

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/lease"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/shared/wakeup"
)

// Polling mode reproduces the seed's design for users who cannot deploy the
// reconciler, and as the baseline the benchmarks compare against: every worker
// queries the seed's index for orphans on an interval with jitter and tries to
// acquire each one, and reads each owned connection's desired_state every tick.
// Acquisitions still go through the lease store's conditional writes, so safety is
// the same as in stream mode; what polling costs is time (failover waits for lease
// expiry plus a poll), reads, index writes, and lost races between workers.
//
// pollingMode is that regime: each connection's lease is its own, renewed (with its
// checkpoint) every RenewInterval, and fenced by its own timer at the start of its
// last successful renew plus FenceAfter; the registry item is a plain heartbeat.

// DB is what polling mode reads with.
type DB interface {
	Query(context.Context, *dynamodb.QueryInput, ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error)
	GetItem(context.Context, *dynamodb.GetItemInput, ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error)
}

// QueryOrphans is the seed's reconciliation query: STARTED connections whose
// lease_expires_at_ms is below now − margin (0 means released), on the seed's index,
// with eventually consistent reads as the seed makes them. It returns at most limit.
func QueryOrphans(ctx context.Context, db DB, table string, now time.Time, margin time.Duration, limit int) ([]string, error) {
	var ids []string
	var start map[string]types.AttributeValue
	for {
		out, err := db.Query(ctx, &dynamodb.QueryInput{
			TableName:                &table,
			IndexName:                aws.String(schema.PollingIndex.Name),
			KeyConditionExpression:   aws.String("#d = :s AND #e < :stale"),
			ExpressionAttributeNames: map[string]string{"#d": schema.AttrDesiredState, "#e": schema.AttrLeaseExpires},
			ExpressionAttributeValues: map[string]types.AttributeValue{
				":s": codec.S(string(schema.Started)), ":stale": codec.N(now.Add(-margin).UnixMilli()),
			},
			ExclusiveStartKey: start,
		})
		if err != nil {
			return ids, fmt.Errorf("orphan query: %w", err)
		}
		ids = appendConnIDs(ids, out.Items)
		if len(out.LastEvaluatedKey) == 0 || len(ids) >= limit {
			return ids, nil
		}
		start = out.LastEvaluatedKey
	}
}

// ReadDesiredState is the seed's per-connection check_desired_state read.
func ReadDesiredState(ctx context.Context, db DB, table, id string) (schema.State, error) {
	out, err := db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: &table, Key: map[string]types.AttributeValue{schema.AttrPK: codec.S(schema.ConnKey(id))},
		ProjectionExpression:     aws.String("#d"),
		ExpressionAttributeNames: map[string]string{"#d": schema.AttrDesiredState},
	})
	if err != nil {
		return "", fmt.Errorf("read desired_state of %s: %w", id, err)
	}
	if s, ok := out.Item[schema.AttrDesiredState].(*types.AttributeValueMemberS); ok {
		return schema.State(s.Value), nil
	}
	return "", nil
}

// pollingMode is the polling regime (see the top of this file).
type pollingMode struct {
	m       *Manager
	roundAt atomic.Int64 // since Manager.started: when the last round began
}

func newPollingMode(m *Manager) *pollingMode { return &pollingMode{m: m} }

func (r *pollingMode) join(ctx context.Context) error {
	r.markRound()
	r.refreshRegistry(ctx)
	return nil
}

// keep renews every interval, and polls for orphans, until ctx ends. Nothing in
// polling mode is lost for good.
func (r *pollingMode) keep(ctx context.Context) error {
	var poll sync.WaitGroup
	defer poll.Wait()
	if r.m.cfg.Orphans != nil && r.m.cfg.PollInterval > 0 {
		poll.Go(func() { r.pollOrphans(ctx) })
	}
	t := time.NewTicker(r.m.cfg.RenewInterval)
	defer t.Stop()
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-t.C:
			r.tick(ctx)
		}
	}
	return nil
}

func (r *pollingMode) lastRound() time.Time {
	return r.m.started.Add(time.Duration(r.roundAt.Load()))
}

func (r *pollingMode) markRound() { r.roundAt.Store(int64(time.Since(r.m.started))) }

// valid: a lease about to be acquired (nil) is valid; a held one until the start of
// its last successful renew (or its acquire) plus the fence.
func (r *pollingMode) valid(o *owned) bool {
	return o == nil || r.left(o) > 0
}

// left is how long o's lease has before its fence deadline.
func (r *pollingMode) left(o *owned) time.Duration {
	return time.Duration(o.writtenAt.Load()) + r.m.fence - time.Since(r.m.started)
}

// fence arms a timer at o's fence deadline. A renew moves the deadline without
// touching the timer: when it fires early it sets itself for the new deadline.
func (r *pollingMode) fence(o *owned) func() bool {
	f := &leaseFence{r: r, o: o}
	f.t = time.AfterFunc(time.Hour, f.fire)
	f.t.Reset(r.left(o))
	return f.t.Stop
}

type leaseFence struct {
	r *pollingMode
	o *owned
	t *time.Timer
}

func (f *leaseFence) fire() {
	if left := f.r.left(f.o); left > 0 {
		f.t.Reset(left) // renewed since the timer was set
		return
	}
	f.r.m.fenced(f.o)
}

func (r *pollingMode) checkpoint(ctx context.Context, o *owned, p lease.Progress) (codec.Connection, error) {
	return r.m.cfg.Store.Renew(ctx, o.lease, p)
}

func (r *pollingMode) release(ctx context.Context, l lease.Lease, p lease.Progress) error {
	return r.m.cfg.Store.Release(ctx, l, p)
}

func (r *pollingMode) advertise(ctx context.Context) { r.putRegistry(ctx, r.m.Draining()) }

func (r *pollingMode) leave(ctx context.Context, err error) error {
	if derr := r.m.cfg.Registry.Delete(ctx, r.m.cfg.WorkerID); derr != nil {
		r.m.cfg.Metrics.RegistryErrors.Add(1)
		err = errors.Join(err, derr)
	}
	return err
}

// tick is one renew round plus the registry refresh and the owned-count metric.
func (r *pollingMode) tick(ctx context.Context) {
	r.markRound()
	if r.m.cfg.DesiredState != nil {
		r.readDesiredStates(ctx)
	}
	r.renewAll(ctx)
	r.refreshRegistry(ctx)
	r.m.cfg.EMF.Put(schema.MetricOwned, r.m.cfg.Metrics.Owned.Load())
}

// renewAll renews every owned lease (its checkpoint), RenewConcurrency at a time. A
// lease whose previous renew is still in flight is skipped this round.
func (r *pollingMode) renewAll(ctx context.Context) {
	m := r.m
	list := m.snapshot()
	// Oldest first: when the table is slow and a round outlasts the interval, the
	// leases nearest their fence deadline go first.
	slices.SortFunc(list, func(a, b *owned) int { return cmp.Compare(a.writtenAt.Load(), b.writtenAt.Load()) })
	sem := make(chan struct{}, m.cfg.RenewConcurrency)
	var wg sync.WaitGroup
	for _, o := range list {
		if !o.writeMu.TryLock() {
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			o.writeMu.Unlock()
			wg.Wait()
			return
		}
		wg.Go(func() {
			defer func() { <-sem }()
			defer o.writeMu.Unlock()
			m.checkpoint(ctx, o)
		})
	}
	wg.Wait()
}

// pollOrphans runs until ctx ends: sleep PollInterval ±50 %, list orphans, try each.
func (r *pollingMode) pollOrphans(ctx context.Context) {
	m := r.m
	rnd := m.cfg.Rand
	if rnd == nil {
		rnd = rand.Float64
	}
	for {
		d := time.Duration(float64(m.cfg.PollInterval) * (0.5 + rnd()))
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
		m.cfg.Metrics.OrphanPolls.Add(1)
		ids, err := m.cfg.Orphans(ctx)
		if err != nil {
			m.cfg.Log.Warn("orphan poll failed", "err", err)
			continue
		}
		for _, id := range ids {
			if ctx.Err() != nil {
				return
			}
			if res, _ := m.Acquire(ctx, id); res == wakeup.NoCapacity || res == wakeup.Draining {
				break
			}
		}
	}
}

// readDesiredStates reads every owned connection's desired_state, as the seed does,
// and re-checks (renews and acts on) the ones no longer STARTED.
func (r *pollingMode) readDesiredStates(ctx context.Context) {
	m := r.m
	var wg sync.WaitGroup
	sem := make(chan struct{}, m.cfg.RenewConcurrency)
	for _, o := range m.snapshot() {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			st, err := m.cfg.DesiredState(ctx, o.lease.ID)
			if err == nil && st != schema.Started {
				m.check(ctx, o)
			}
		})
	}
	wg.Wait()
}

func (r *pollingMode) refreshRegistry(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, r.m.cfg.RenewInterval)
	defer cancel()
	r.putRegistry(rctx, r.m.Draining())
}

func (r *pollingMode) putRegistry(ctx context.Context, draining bool) {
	m := r.m
	w := codec.Worker{
		ID: m.cfg.WorkerID, Addr: m.cfg.Addr, Capacity: m.cfg.MaxConnections, Load: m.Load(),
		Draining: draining, HeartbeatExpiresAtMs: time.Now().Add(m.cfg.Lease).UnixMilli(),
	}
	if err := m.cfg.Registry.Put(ctx, w); err != nil {
		m.cfg.Metrics.RegistryErrors.Add(1)
		m.cfg.Log.Warn("registry refresh failed", "err", err)
	}
}
