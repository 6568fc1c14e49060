// Package member is this worker's membership session (docs/MEMBERSHIP.md): one lease
// per worker process, held as its registry item, that covers every connection the
// worker owns in stream mode. A Session joins (Join), renews every RenewInterval (Run,
// or one Renew), fences itself when its renews stop succeeding, ends for good when the
// registry says it is no longer a member (Done, Err), and leaves (Leave). It is the
// counterpart of etcd's concurrency.Session; what the worker does with its connections
// when the session fences or ends is the ownership loop's business (worker/internal/owner).
//
// Guarantees:
//   - Every write is conditional (registry.Join, Renew and Leave): a renew succeeds only
//     for this incarnation, not declared dead.
//   - Self-fence: Valid is false, and Ctx is cancelled (cause ErrFenced), from the
//     start of the last successful renew (or the join) plus Config.Fence, on the
//     monotonic clock, whether or not the table can be reached. The item's expiry is
//     computed after that start, so it ends no earlier than start + Lease. A renew
//     that succeeds later makes the session valid again with a fresh Ctx.
//   - A renew refused as "not a member" (declared dead, replaced, deleted) ends the
//     session for good: Valid turns false at once, Ctx is cancelled and Done closed,
//     and Err wraps ErrExpelled. Nothing revives it.
//   - Run makes no call other than the renew, so no other work can delay it, and it
//     joins everything it started before it returns.
//
// Non-guarantees: the session does not stop anyone's delivery by itself; holders of
// Ctx do that when it is cancelled, and check Valid before each sink write.
package member

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sockfleet/sockfleet/shared/registry"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/worker/internal/metrics"
)

// ErrExpelled: the registry found this worker declared dead, replaced by another
// incarnation, or deleted, or a live item holds its id at join. The process should
// exit.
var ErrExpelled = errors.New("expelled from the membership")

// ErrFenced is the cause of Ctx when the membership was not renewed in time.
var ErrFenced = errors.New("membership lease not renewed in time")

// Registry is the part of the worker registry a session uses.
type Registry interface {
	Join(ctx context.Context, w codec.Worker, now time.Time, skew time.Duration) (bool, error)
	Renew(ctx context.Context, w codec.Worker) error
	Leave(ctx context.Context, id, incarnation string, now time.Time) error
}

// Config configures a Session.
type Config struct {
	WorkerID    string
	Incarnation string // new per process start
	Addr        string // advertised host:port of the worker's endpoint
	Capacity    int
	Registry    Registry

	// Lease is the membership lease each write sets; RenewInterval how often Run
	// renews (and bounds one write); Fence how long after the start of a successful
	// renew the session stays valid (less than Lease by at least the skew margin);
	// SkewMargin how long after its expiry a lapsed item of the same id may be
	// replaced at join.
	Lease         time.Duration
	RenewInterval time.Duration
	Fence         time.Duration
	SkewMargin    time.Duration

	// State returns what the item carries at each write: the worker's load and
	// whether it is draining.
	State func() (load int, draining bool)
	// Now is the wall clock the expiry is computed from; default time.Now.
	Now func() time.Time

	Metrics *metrics.Counters // default: counted nowhere
	EMF     *metrics.EMF      // may be nil
	Log     *slog.Logger      // default: discarded
}

// Session is one incarnation's membership.
type Session struct {
	cfg     Config
	started time.Time // monotonic base of the offsets below

	renewedAt atomic.Int64 // since started: start of the last good renew; -1 before the join
	triedAt   atomic.Int64 // since started: start of the last join or renew attempt
	ended     atomic.Bool  // expelled; set before err
	renewed   chan struct{}

	mu     sync.Mutex
	ctx    context.Context // this validity period's; cancelled at the fence or expulsion
	cancel context.CancelCauseFunc
	timer  *time.Timer
	err    error         // set once, before done is closed
	done   chan struct{} // closed on expulsion
}

// New checks cfg and returns a session that has not joined yet.
func New(cfg Config) (*Session, error) {
	switch {
	case cfg.WorkerID == "" || cfg.Incarnation == "" || cfg.Registry == nil || cfg.State == nil:
		return nil, errors.New("membership config: worker id, incarnation, registry and state are required")
	case !(cfg.Lease > cfg.Fence && cfg.Fence > 0 && cfg.RenewInterval > 0):
		return nil, fmt.Errorf("membership config: want lease %s > fence %s > 0 and a positive renew interval %s",
			cfg.Lease, cfg.Fence, cfg.RenewInterval)
	case cfg.Lease > registry.MaxMemberLease:
		return nil, fmt.Errorf("membership config: lease %s exceeds %s (the tombstone lease)", cfg.Lease, registry.MaxMemberLease)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Metrics == nil {
		cfg.Metrics = new(metrics.Counters)
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &Session{cfg: cfg, started: time.Now(), renewed: make(chan struct{}, 1), done: make(chan struct{})}
	s.renewedAt.Store(-1)
	s.ctx, s.cancel = context.WithCancelCause(context.Background())
	s.cancel(errors.New("membership not joined yet"))
	s.timer = time.AfterFunc(time.Hour, s.fence)
	s.timer.Stop()
	return s, nil
}

// Valid reports whether the membership is before its fence deadline now, on the
// monotonic clock, and the session has not ended.
func (s *Session) Valid() bool {
	at := s.renewedAt.Load()
	if at < 0 || s.ended.Load() {
		return false
	}
	return time.Since(s.started) < time.Duration(at)+s.cfg.Fence
}

// Ctx is cancelled when the current validity period ends: at the fence deadline
// (cause ErrFenced) or on expulsion (cause wrapping ErrExpelled). Before the join,
// and while fenced, it is already cancelled; a later successful renew starts a new
// one, so take Ctx anew for each thing that begins.
func (s *Session) Ctx() context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ctx
}

// Done is closed when the session has ended for good (expelled).
func (s *Session) Done() <-chan struct{} { return s.done }

// Err is nil until Done is closed, then wraps ErrExpelled and the registry's reason.
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Renewed receives after a renew (or the join) succeeded: the table answers again.
// It holds at most one notification.
func (s *Session) Renewed() <-chan struct{} { return s.renewed }

// LastAttempt is when the last join or renew attempt began (on the monotonic clock),
// for health checks.
func (s *Session) LastAttempt() time.Time {
	return s.started.Add(time.Duration(s.triedAt.Load()))
}

// Join registers this incarnation, retrying every RenewInterval until it succeeds or
// ctx ends. replaced says it took over a lapsed item of the same id (whose holder
// has fenced): the connections still naming this id are then the caller's to release.
// A live item of the same id ends the session with ErrExpelled.
func (s *Session) Join(ctx context.Context) (replaced bool, err error) {
	for {
		start := s.attempt()
		jctx, cancel := context.WithTimeout(ctx, s.cfg.RenewInterval)
		replaced, err := s.cfg.Registry.Join(jctx, s.worker(), s.cfg.Now(), s.cfg.SkewMargin)
		cancel()
		switch {
		case err == nil:
			s.succeeded(start)
			s.cfg.Log.Info("joined", "incarnation", s.cfg.Incarnation)
			return replaced, nil
		case errors.Is(err, registry.ErrInUse):
			return false, s.expel(err)
		}
		s.cfg.Metrics.MemberRenewFailures.Add(1)
		s.cfg.Log.Warn("join failed; retrying", "err", err)
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(s.cfg.RenewInterval):
		}
	}
}

// Run renews the membership every RenewInterval until ctx ends or the session ends.
// It makes no other call, so bulk work elsewhere cannot hold it back. When it
// returns, the fence timer is stopped (nothing renews the session any more; Valid
// alone still says whether it is before its deadline).
func (s *Session) Run(ctx context.Context) {
	t := time.NewTicker(s.cfg.RenewInterval)
	defer t.Stop()
	defer func() {
		s.mu.Lock()
		s.timer.Stop()
		s.mu.Unlock()
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.done:
			return
		case <-t.C:
			_ = s.Renew(ctx) // said in the log and the metrics
		}
	}
}

// Renew renews the membership once, carrying the load and draining flag State
// reports now. A refusal as "not a member" ends the session; other failures are
// counted, and the next renew tries again.
func (s *Session) Renew(ctx context.Context) error {
	if err := s.Err(); err != nil {
		return err
	}
	start := s.attempt()
	rctx, cancel := context.WithTimeout(ctx, s.cfg.RenewInterval)
	defer cancel()
	err := s.cfg.Registry.Renew(rctx, s.worker())
	switch {
	case err == nil:
		s.succeeded(start)
		s.cfg.Log.Debug("membership renewed")
		return nil
	case errors.Is(err, registry.ErrNotMember):
		return s.expel(err)
	}
	s.cfg.Metrics.MemberRenewFailures.Add(1)
	s.cfg.Metrics.RenewFailures.Add(1)
	s.cfg.EMF.Put(schema.MetricRenewFailures, 1)
	s.cfg.Log.Warn("membership renew failed", "err", err)
	return fmt.Errorf("renew membership: %w", err)
}

// Leave marks the item gone (registry.Leave), so that what still names this worker
// is released at once, and stops the fence timer. Call it once nothing is held.
func (s *Session) Leave(ctx context.Context) error {
	s.mu.Lock()
	s.timer.Stop()
	s.mu.Unlock()
	if err := s.cfg.Registry.Leave(ctx, s.cfg.WorkerID, s.cfg.Incarnation, s.cfg.Now()); err != nil {
		s.cfg.Metrics.RegistryErrors.Add(1)
		return fmt.Errorf("leave membership: %w", err)
	}
	return nil
}

// attempt records the start of a join or renew attempt and returns it.
func (s *Session) attempt() time.Time {
	now := time.Now()
	s.triedAt.Store(int64(now.Sub(s.started)))
	return now
}

func (s *Session) worker() codec.Worker {
	load, draining := s.cfg.State()
	return codec.Worker{
		ID: s.cfg.WorkerID, Addr: s.cfg.Addr, Capacity: s.cfg.Capacity, Load: load, Draining: draining,
		Incarnation: s.cfg.Incarnation,
		// Read after the caller took its start time: the expiry is at least that
		// start plus the lease, which is what the fence is counted from.
		HeartbeatExpiresAtMs: s.cfg.Now().Add(s.cfg.Lease).UnixMilli(),
	}
}

// succeeded records a good renew (or join) that began at start: the fence moves to
// start + Fence, a fenced session is valid again with a fresh Ctx, and Renewed is
// told.
func (s *Session) succeeded(start time.Time) {
	s.mu.Lock()
	if s.err == nil {
		s.renewedAt.Store(int64(start.Sub(s.started)))
		if s.ctx.Err() != nil {
			s.ctx, s.cancel = context.WithCancelCause(context.Background())
		}
		s.timer.Reset(time.Until(start.Add(s.cfg.Fence)))
	}
	s.mu.Unlock()
	select {
	case s.renewed <- struct{}{}:
	default:
	}
}

// fence is the fence timer's action.
func (s *Session) fence() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.Valid() {
		return // a renew that began in time landed after the timer fired
	}
	s.cancel(ErrFenced)
}

// expel ends the session for good and returns its error.
func (s *Session) expel(reason error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	s.ended.Store(true)
	s.err = fmt.Errorf("%w: %v", ErrExpelled, reason)
	s.timer.Stop()
	s.cancel(s.err)
	close(s.done)
	s.cfg.Log.Error("no longer a member", "err", reason)
	return s.err
}
