package lease

import (
	"errors"
	"fmt"
	"time"

	"github.com/sockfleet/sockfleet/shared/schema"
)

// Sentinel errors. Callers branch on them with errors.Is.
var (
	ErrHeld       = errors.New("lease held by another worker")
	ErrLost       = errors.New("lease lost: not the owner at this version")
	ErrNotStarted = errors.New("connection is not STARTED")
	ErrNotFound   = errors.New("connection not found")
	// ErrInvalid: the item or an argument is unusable (bad id, bad ws_url, bad state).
	ErrInvalid = schema.ErrInvalid
	// ErrUnavailable: the table could not be reached and the outcome is unknown even
	// after a read-back. The caller must assume nothing changed in its favour.
	ErrUnavailable = errors.New("lease store unavailable")
)

// AmbiguousAcquire is the error of an acquire whose write may have landed but could
// not be read back (it wraps ErrUnavailable). The write, if it landed, stamped
// status_at_ms = StampMs with status "acquired": an item that still shows both and
// names the caller is that write with nothing after it, so the caller holds the
// lease and no one else can have acquired since.
type AmbiguousAcquire struct {
	StampMs int64
	err     error
}

func (e *AmbiguousAcquire) Error() string { return e.err.Error() }
func (e *AmbiguousAcquire) Unwrap() error { return e.err }

// StatusAcquired is the status an acquire writes.
const StatusAcquired = "acquired"

// Config configures a Store.
type Config struct {
	Table string
	// Duration is how long an acquired or renewed lease lasts.
	Duration time.Duration
	// SkewMargin is the most two workers' wall clocks may disagree. A lease is taken
	// over only once it expired more than SkewMargin ago on the taker's clock.
	SkewMargin time.Duration
	// Now is the wall clock (tests inject skew). Default time.Now.
	Now func() time.Time
	// ReadBackTimeout bounds the read that resolves an ambiguous write. Default 2s.
	ReadBackTimeout time.Duration
	// InvalidRetry, if positive, is how long an unusable item that an acquire won and
	// gave back stays out of the seed's orphan query (its lease_expires_at_ms is set
	// that far ahead instead of 0), so polling workers do not take and give it back on
	// every poll. Stream mode leaves it 0: the reconciler wakes nobody for an unusable
	// item, and the operator's fix must pass the event filter (a released lease).
	InvalidRetry time.Duration
	// Membership (stream mode): a lease lasts as long as its owner's membership, so
	// Acquire writes schema.LeaseHeldByMember as its expiry and nothing renews it;
	// owners checkpoint with Checkpoint. Duration is then unused. See docs/MEMBERSHIP.md.
	Membership bool
}

// Defaults of a Config that sets none, for callers that renew per connection. The
// fleet's workers and reconciler set their margin explicitly, from EnvSkewMargin or
// schema.DefaultSkewMargin (2 s); this 5 s fallback is not theirs.
const (
	DefaultDuration   = 60 * time.Second
	DefaultSkewMargin = 5 * time.Second
)

// DefaultInvalidRetry is the InvalidRetry polling mode uses: an unusable item is tried
// again (and given back again) about once per 2 minutes by the whole fleet, instead of
// by every worker on every poll. An operator's fix is picked up within that time.
const DefaultInvalidRetry = 2 * time.Minute

// Validate checks the config and fills defaults.
func (c *Config) Validate() error {
	if c.Table == "" {
		return errors.New("lease config: table name is empty")
	}
	if c.Duration == 0 {
		c.Duration = DefaultDuration
	}
	if c.SkewMargin == 0 {
		c.SkewMargin = DefaultSkewMargin
	}
	if c.Duration <= 0 || c.SkewMargin < 0 {
		return fmt.Errorf("lease config: duration %s and skew margin %s must be positive", c.Duration, c.SkewMargin)
	}
	if c.SkewMargin >= c.Duration {
		return fmt.Errorf("lease config: skew margin %s must be less than the lease %s", c.SkewMargin, c.Duration)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.ReadBackTimeout == 0 {
		c.ReadBackTimeout = 2 * time.Second
	}
	return nil
}

// Store performs lease operations on one table.
type Store struct {
	db  DynamoDB
	cfg Config
}

// New returns a Store.
func New(db DynamoDB, cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Store{db: db, cfg: cfg}, nil
}

// Config returns the validated configuration.
func (s *Store) Config() Config { return s.cfg }

// Lease is a held lease: what an owner needs to renew, checkpoint and release it.
type Lease struct {
	ID          string
	Owner       string
	Version     int64
	ExpiresAtMs int64
	WSURL       string
	LastSeq     int64
	Spec        schema.Spec // the connection's own settings, as acquired
	Epoch       int64       // sequence epoch, as acquired
}

// Progress is what an owner writes with a renew or release: the checkpoint, and the
// observed status if it changed (empty Status leaves the stored one alone).
type Progress struct {
	LastSeq int64
	Epoch   int64 // sequence epoch of LastSeq; written when not 0 (it only grows)
	// Stop (release only) also sets desired_state = STOPPED: the stream halted for the
	// operator (a sequence reset under seq_reset=halt), and no other worker must
	// take it up until the operator starts it again.
	Stop   bool
	Status string
	Error  string
}

func (s *Store) nowMs() int64 { return s.cfg.Now().UnixMilli() }

// expiry is the lease_expires_at_ms an acquire (or a reclaim) writes at nowMs: the
// lease duration ahead, or, in membership mode, schema.LeaseHeldByMember.
func (s *Store) expiry(nowMs int64) int64 {
	if s.cfg.Membership {
		return schema.LeaseHeldByMember
	}
	return nowMs + s.cfg.Duration.Milliseconds()
}

func validIDs(id, worker string) error {
	if err := schema.ValidateID(id); err != nil {
		return fmt.Errorf("connection %w", err)
	}
	if err := schema.ValidateID(worker); err != nil {
		return fmt.Errorf("worker %w", err)
	}
	return nil
}
