package owner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/sockfleet/sockfleet/shared/lease"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/worker/internal/metrics"
	"github.com/sockfleet/sockfleet/worker/internal/stream"
)

// Store is the part of the lease store the loop uses.
type Store interface {
	Acquire(ctx context.Context, id, worker string) (lease.Lease, error)
	Renew(ctx context.Context, l lease.Lease, p lease.Progress) (codec.Connection, error)
	Release(ctx context.Context, l lease.Lease, p lease.Progress) error
}

// Registry is the part of the worker registry polling mode uses.
type Registry interface {
	Put(ctx context.Context, w codec.Worker) error
	Delete(ctx context.Context, id string) error
}

// Stream runs one connection (see package stream).
type Stream interface {
	Run(ctx context.Context)
	LastSeq() int64
	Status() stream.Status
	SetURL(url string)
	URL() string
}

// Config configures a Manager.
type Config struct {
	WorkerID       string
	Addr           string // advertised host:port of the wakeup endpoint
	MaxConnections int

	Lease         time.Duration
	RenewInterval time.Duration
	RenewDeadline time.Duration
	SkewMargin    time.Duration
	DrainTimeout  time.Duration

	RenewConcurrency  int           // checkpoints in flight at once; default 32
	WakeupConcurrency int           // ids of one wakeup handled at once; default 16
	ReleaseTimeout    time.Duration // one release write; default 10s, at most DrainTimeout/2

	Store    Store
	Registry Registry
	// Candidates, if set, lists connections to try in the one start-up pass (see
	// ScanCandidates), so a fleet that starts cold is not idle until the next event.
	Candidates func(ctx context.Context) ([]string, error)
	// NewStream makes a connection's stream; valid reports, on the monotonic clock,
	// whether the lease is still before its fence deadline.
	NewStream func(l lease.Lease, valid func() bool) Stream

	// Polling mode (the seed's design; nil in stream mode). Orphans lists STARTED
	// connections whose lease is released or expired; it is called every PollInterval
	// with ±50 % jitter from Rand, and every id found is tried. DesiredState is the
	// seed's per-connection desired_state read, made for every owned connection on
	// every renew tick.
	Orphans      func(ctx context.Context) ([]string, error)
	PollInterval time.Duration
	Rand         func() float64 // [0,1); default math/rand/v2
	DesiredState func(ctx context.Context, id string) (schema.State, error)
	Metrics      *metrics.Counters
	EMF          *metrics.EMF // may be nil
	Log          *slog.Logger

	// Membership (stream mode; nil in polling mode): Lease, RenewInterval and
	// RenewDeadline then time the worker's membership lease, not its connections',
	// which are never renewed. See streammode.go.
	Member *MemberConfig
	// Handoff (stream mode; nil: drain releases, handoff wakeups are refused):
	// planned handoffs make-before-break, see handoff.go and docs/HANDOFF.md.
	Handoff *HandoffConfig
}

// New checks cfg and returns a Manager in the regime cfg names.
func New(cfg Config) (*Manager, error) {
	if cfg.WorkerID == "" || cfg.Store == nil || cfg.Registry == nil || cfg.NewStream == nil {
		return nil, errors.New("owner config: worker id, store, registry and stream factory are required")
	}
	if cfg.MaxConnections <= 0 {
		return nil, fmt.Errorf("owner config: max connections %d must be positive", cfg.MaxConnections)
	}
	if err := schema.CheckTimings(cfg.Lease, cfg.RenewDeadline, cfg.RenewInterval, cfg.SkewMargin); err != nil {
		return nil, fmt.Errorf("owner config: %w", err)
	}
	if cfg.DrainTimeout <= 0 {
		return nil, fmt.Errorf("owner config: drain timeout %s must be positive", cfg.DrainTimeout)
	}
	if cfg.RenewConcurrency <= 0 {
		cfg.RenewConcurrency = 32
	}
	if cfg.WakeupConcurrency <= 0 {
		cfg.WakeupConcurrency = 16
	}
	if cfg.ReleaseTimeout <= 0 {
		cfg.ReleaseTimeout = min(10*time.Second, cfg.DrainTimeout/2)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = new(metrics.Counters)
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	m := &Manager{
		cfg:       cfg,
		fence:     FenceAfter(cfg.Lease, cfg.RenewDeadline, cfg.SkewMargin),
		conns:     map[string]*owned{},
		acquiring: map[string]bool{}, unresolved: map[string]int64{},
		started: time.Now(),
	}
	m.base, m.cancelBase = context.WithCancelCause(context.Background())
	if cfg.Member != nil {
		sm, err := newStreamMode(m, cfg.Member)
		if err != nil {
			return nil, err
		}
		m.rg = sm
	} else {
		m.rg = newPollingMode(m)
	}
	if cfg.Handoff != nil {
		// A handoff transfers a lease whose expiry is the membership's
		// (schema.LeaseHeldByMember): polling mode keeps release-then-acquire.
		if cfg.Member == nil {
			return nil, errors.New("owner config: planned handoffs need stream mode (membership)")
		}
		ho, err := newHandoffs(cfg.Handoff)
		if err != nil {
			return nil, err
		}
		m.ho = ho
	}
	return m, nil
}

// FenceAfter is how long after the start of a successful renew (or acquire) a lease
// may go unrenewed before its connection must stop: the renew deadline, and never
// later than the lease less the skew margin.
func FenceAfter(leaseDur, renewDeadline, margin time.Duration) time.Duration {
	return min(renewDeadline, leaseDur-margin)
}

// SinkWindow is the longest a sink write may take when it passed the fence guard
// just before the fence deadline: from the fence deadline to the earliest moment
// another worker may acquire (the lease less the skew margin, counted from the same
// renew start). The sink timeout must not exceed it, or a write could land after
// another worker took the connection over.
func SinkWindow(leaseDur, renewDeadline, margin time.Duration) time.Duration {
	return leaseDur - margin - FenceAfter(leaseDur, renewDeadline, margin)
}
