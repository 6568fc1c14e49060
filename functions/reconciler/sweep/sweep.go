// Package sweep is the reconciler's low-rate backstop. Events drive failover (releases
// and crash events flow through the stream); the sweep only turns what no event
// reported into a write that the stream then carries:
//
//   - a lease expired more than the skew margin ago is released (lease.ReleaseExpired,
//     conditioned on owner and version): a hung or partitioned worker;
//   - a STARTED connection that has sat unowned longer than NudgeAfter is nudged: a
//     conditional write of nudged_at_ms (and lease_expires_at_ms = 0) that the stream
//     filters pass and the classifier reads as "needs an owner". The time is counted
//     from the first pass that saw it unowned (it marks unheld_since_ms), not from the
//     item's own timestamps, which a stale whole-item image brings back: its holder
//     takes such a lease back within NudgeAfter, so a nudge never offers a connection
//     someone still delivers (NudgeAfter must exceed the workers' backstop interval
//     plus a renew tick);
//   - a WORKER# item whose heartbeat lapsed more than WorkerClearAfter ago (default
//     an hour, as the TTL) is deleted, conditioned on the heartbeat still being that
//     old (TTL would, but lazily), and only while some worker is live. An outage of the
//     table lapses every heartbeat at once; deleting those items would leave the
//     wakeups that follow the outage with no live worker to find, and workers whose
//     membership renew needs their item with nothing to renew. Kept, the items come
//     back to life with the workers' first heartbeat after the outage.
//   - an unowned connection an operator made unusable (codec.Connection.Unrunnable)
//     whose status_error does not say so gets status "invalid" and the problem,
//     naming the field and the value, on the item — in case the stream record that
//     made it so was never reported (the reconciler normally does this first).
//
// It also counts orphans: STARTED connections with no live owner, including those an
// operator made unusable (a desired_state that is not STOPPED, a bad ws_url), which no
// worker will ever run until someone fixes them; Unusable counts those alone.
//
// Read cost. There is no index keyed on expiry (every heartbeat would write to it), so
// the sweep is a paginated, eventually consistent Scan, which costs 0.5 read request
// unit per 4 KB read. A connection item is about 300 bytes, so a 10,000-connection
// table is about 3 MB: about 370 read units per full pass, in 10 pages of 1,000 items,
// plus one registry Query. At one run every 5 minutes that is about 107,000 read units
// a day. Writes happen only for items that need one. Each run reads at most MaxItems
// items; a table larger than that is split into Segments (parallel-scan segments), one
// segment per Period, so every item is visited once per Segments × Period.
//
// Non-guarantees: the orphan metric describes the items this run read (one segment
// when Segments > 1); an item that changes during the scan is judged on what the scan
// saw, which is safe because every write is conditional.
package sweep

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/lease"
	"github.com/sockfleet/sockfleet/shared/registry"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/shared/tracing"
)

// DynamoDB is the part of the SDK client the sweep uses.
type DynamoDB interface {
	Scan(context.Context, *dynamodb.ScanInput, ...func(*dynamodb.Options)) (*dynamodb.ScanOutput, error)
	UpdateItem(context.Context, *dynamodb.UpdateItemInput, ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
	DeleteItem(context.Context, *dynamodb.DeleteItemInput, ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error)
}

// Leases releases expired leases (*lease.Store).
type Leases interface {
	ReleaseExpired(ctx context.Context, id, owner string, version int64, now time.Time) error
	ReportInvalid(ctx context.Context, id, problem string) error
}

// Workers lists the registry (*registry.Registry).
type Workers interface {
	List(ctx context.Context) ([]codec.Worker, []error, error)
}

// Config configures a Sweeper.
type Config struct {
	Table string
	// SkewMargin: a lease or heartbeat counts as lapsed only this long after its
	// expiry. Default lease.DefaultSkewMargin.
	SkewMargin time.Duration
	// NudgeAfter: an unowned STARTED item is nudged only once it has been unowned (or
	// last nudged) this long ago, so the sweep does not race fresh wakeups. Default 2m.
	NudgeAfter time.Duration
	// PageSize is the Scan page limit. Default 1000.
	PageSize int32
	// MaxItems bounds the items read per run. Default 50,000.
	MaxItems int
	// Segments splits the table into parallel-scan segments; each run reads one,
	// chosen by the clock (one per Period). Default 1.
	Segments int
	// Period is the sweep schedule's period. Default 5m.
	Period time.Duration
	// WorkerClearAfter: a worker item is deleted only once its heartbeat lapsed this
	// long ago. Default registry.TTLGrace (1h); it must exceed the skew margin.
	WorkerClearAfter time.Duration
}

// Defaults.
const (
	DefaultNudgeAfter = 2 * time.Minute
	DefaultPageSize   = 1000
	DefaultMaxItems   = 50_000
	DefaultPeriod     = 5 * time.Minute
)

// Validate checks c and fills defaults.
func (c *Config) Validate() error {
	if c.Table == "" {
		return errors.New("sweep config: table name is empty")
	}
	if c.SkewMargin == 0 {
		c.SkewMargin = lease.DefaultSkewMargin
	}
	if c.NudgeAfter == 0 {
		c.NudgeAfter = DefaultNudgeAfter
	}
	if c.PageSize == 0 {
		c.PageSize = DefaultPageSize
	}
	if c.MaxItems == 0 {
		c.MaxItems = DefaultMaxItems
	}
	if c.Segments == 0 {
		c.Segments = 1
	}
	if c.Period == 0 {
		c.Period = DefaultPeriod
	}
	if c.WorkerClearAfter == 0 {
		c.WorkerClearAfter = registry.TTLGrace
	}
	switch {
	case c.SkewMargin < 0 || c.NudgeAfter < 0 || c.Period < 0:
		return fmt.Errorf("sweep config: durations must be positive")
	case c.PageSize < 1 || c.MaxItems < 1:
		return fmt.Errorf("sweep config: page size %d and max items %d must be positive", c.PageSize, c.MaxItems)
	case c.Segments < 1 || c.Segments > 1_000_000:
		return fmt.Errorf("sweep config: segments %d: want 1 to 1,000,000", c.Segments)
	case c.NudgeAfter <= c.SkewMargin:
		return fmt.Errorf("sweep config: nudge-after %s must exceed the skew margin %s", c.NudgeAfter, c.SkewMargin)
	case c.WorkerClearAfter <= c.SkewMargin:
		return fmt.Errorf("sweep config: worker clear-after %s must exceed the skew margin %s", c.WorkerClearAfter, c.SkewMargin)
	}
	return nil
}

// Sweeper runs sweeps.
type Sweeper struct {
	db      DynamoDB
	leases  Leases
	workers Workers
	cfg     Config
	log     *slog.Logger
}

// New returns a Sweeper.
func New(db DynamoDB, leases Leases, workers Workers, cfg Config, log *slog.Logger) (*Sweeper, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Sweeper{db: db, leases: leases, workers: workers, cfg: cfg, log: log}, nil
}

// Report is what one run did.
type Report struct {
	Segment, Segments int
	Pages, Scanned    int
	Complete          bool // the segment was read to its end within MaxItems
	Released          int  // expired leases released
	Nudged            int
	WorkersCleared    int
	Orphaned          int           // STARTED connections with no live owner (Unusable included)
	Unusable          int           // of those, items an operator made unusable
	Reported          int           // unusable items whose problem this run wrote on them
	OldestOrphan      time.Duration // how long the oldest known orphan has been one
	Errors            int
	// NotLiveOwners are the owners of owned connections that are not live members
	// (each once): the caller hands them to the membership reaper.
	NotLiveOwners []string
}

// Run sweeps once, at now. It returns the report and the errors it met; one bad item
// never stops the run.
func (s *Sweeper) Run(ctx context.Context, now time.Time) (Report, error) {
	seg := 0
	if s.cfg.Segments > 1 {
		seg = int((now.UnixNano() / int64(s.cfg.Period)) % int64(s.cfg.Segments))
	}
	r := Report{Segment: seg, Segments: s.cfg.Segments}
	live := map[string]codec.Worker{}
	if ws, _, err := s.workers.List(ctx); err != nil {
		s.log.WarnContext(ctx, "sweep: list workers; judging orphans by lease only", "err", err)
		live = nil
	} else {
		for _, w := range ws {
			if w.Live(now.UnixMilli()) {
				live[w.ID] = w
			}
		}
	}
	anyLive := len(live) > 0 // nil (unknown) counts as none: keep every worker item
	var errs []error
	var start map[string]types.AttributeValue
	for {
		in := &dynamodb.ScanInput{
			TableName:         &s.cfg.Table,
			Limit:             aws.Int32(min(s.cfg.PageSize, int32(s.cfg.MaxItems-r.Scanned))),
			ExclusiveStartKey: start,
		}
		if s.cfg.Segments > 1 {
			in.Segment, in.TotalSegments = aws.Int32(int32(seg)), aws.Int32(int32(s.cfg.Segments))
		}
		page, err := s.db.Scan(ctx, in)
		if err != nil {
			return r, errors.Join(append(errs, fmt.Errorf("sweep: scan: %w", err))...)
		}
		r.Pages++
		r.Scanned += len(page.Items)
		for _, it := range page.Items {
			if err := s.item(ctx, it, now, live, anyLive, &r); err != nil {
				r.Errors++
				errs = append(errs, err)
			}
		}
		if len(page.LastEvaluatedKey) == 0 {
			r.Complete = true
			break
		}
		if r.Scanned >= s.cfg.MaxItems {
			s.log.WarnContext(ctx, "sweep: item budget reached before the end of the segment; raise the segment count",
				"scanned", r.Scanned, "segment", seg, "segments", s.cfg.Segments)
			break
		}
		start = page.LastEvaluatedKey
	}
	return r, errors.Join(errs...)
}

func (s *Sweeper) item(ctx context.Context, it codec.Item, now time.Time, live map[string]codec.Worker, anyLive bool, r *Report) error {
	pk, _ := it[schema.AttrPK].(*types.AttributeValueMemberS)
	if pk == nil {
		return nil
	}
	if id, ok := schema.WorkerID(pk.Value); ok {
		w, _ := codec.DecodeWorker(it) // the heartbeat is read even from an item with a bad field
		w.ID = id
		if !anyLive {
			return nil // no worker is live: an outage, or a fleet stopped; keep every item
		}
		return s.worker(ctx, w, now, r)
	}
	if _, ok := schema.ConnID(pk.Value); !ok {
		return nil
	}
	c, derr := codec.DecodeConnection(it)
	nowMs, margin := now.UnixMilli(), s.cfg.SkewMargin.Milliseconds()
	if c.Expired(nowMs, margin) {
		// Released whatever the desired state: a STOPPED item can keep a dead owner's
		// lease too, and releasing it wakes nobody (the filters do not pass it).
		err := s.leases.ReleaseExpired(ctx, c.ID, c.LeaseOwner, c.LeaseVersion, now)
		switch {
		case err == nil:
			r.Released++
			s.log.InfoContext(ctx, "sweep: released expired lease", "id", c.ID, "owner", c.LeaseOwner, "version", c.LeaseVersion,
				"expired_ms_ago", nowMs-c.LeaseExpiresAtMs)
		case errors.Is(err, lease.ErrLost), errors.Is(err, lease.ErrHeld), errors.Is(err, lease.ErrNotFound):
			// changed since the scan read it
		default:
			return err
		}
	}
	if problem := c.Unrunnable(); problem != nil {
		return s.unusable(ctx, c, problem, now, r)
	}
	if c.DesiredState != schema.Started || (derr != nil && c.ID == "") {
		return nil
	}
	// A bad lease_version or last_seq is the acquire's to repair: judge the rest.
	if age, orphan := orphaned(c, now, live); orphan {
		r.Orphaned++
		r.OldestOrphan = max(r.OldestOrphan, age)
	}
	if c.Owned() {
		_, ok := live[c.LeaseOwner]
		if live != nil && !ok && !c.Expired(nowMs, margin) && !slices.Contains(r.NotLiveOwners, c.LeaseOwner) {
			r.NotLiveOwners = append(r.NotLiveOwners, c.LeaseOwner)
		}
		return nil
	}
	since := max(c.StatusAtMs, c.NudgedAtMs)
	if since != 0 && nowMs-since < s.cfg.NudgeAfter.Milliseconds() {
		return nil
	}
	if due, err := s.seenUnowned(ctx, c.ID, it, now); !due {
		return err
	}
	ok, err := Nudge(ctx, s.db, s.cfg.Table, c.ID, now)
	if err != nil {
		return err
	}
	if ok {
		r.Nudged++
		s.log.InfoContext(ctx, "sweep: nudged unowned connection", "id", c.ID, "unowned_since_ms", since)
	}
	return nil
}

// seenUnowned reports whether an unowned STARTED item (it, as scanned) has carried the
// sweep's mark (unheld_since_ms) for NudgeAfter, and marks it if it carries none.
// status_at_ms and nudged_at_ms cannot say how long an item has been unowned: a stale
// whole-item image brings back old ones, and its holder (woken by the stream record,
// see functions/reconciler/records) is taking the lease back right now. A nudge then
// would offer the connection to a second worker. NudgeAfter must exceed the workers'
// backstop interval plus a renew tick, the longest a holder takes to act.
func (s *Sweeper) seenUnowned(ctx context.Context, id string, it codec.Item, now time.Time) (bool, error) {
	nowMs := now.UnixMilli()
	raw := it[schema.AttrUnheldSince]
	if mark, err := codec.Int(it, schema.AttrUnheldSince); raw != nil && err == nil && mark > 0 && mark <= nowMs {
		return nowMs-mark >= s.cfg.NudgeAfter.Milliseconds(), nil
	}
	nowV := expression.Value(codec.N(nowMs))
	marked := expression.Name(schema.AttrUnheldSince).AttributeNotExists()
	if raw != nil {
		marked = expression.Name(schema.AttrUnheldSince).Equal(expression.Value(raw))
	}
	cond := expression.And(expression.Name(schema.AttrDesiredState).Equal(expression.Value(codec.S(string(schema.Started)))),
		lease.ReleasedCondition(), marked)
	e, err := expression.NewBuilder().WithUpdate(expression.Set(expression.Name(schema.AttrUnheldSince), nowV)).
		WithCondition(cond).Build()
	if err != nil {
		return false, fmt.Errorf("mark %s: %w", id, err)
	}
	_, err = s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 &s.cfg.Table,
		Key:                       map[string]types.AttributeValue{schema.AttrPK: codec.S(schema.ConnKey(id))},
		UpdateExpression:          e.Update(),
		ConditionExpression:       e.Condition(),
		ExpressionAttributeNames:  e.Names(),
		ExpressionAttributeValues: e.Values(),
	})
	var ccf *types.ConditionalCheckFailedException
	if err != nil && !errors.As(err, &ccf) {
		return false, fmt.Errorf("mark %s: %w", id, err)
	}
	return false, nil
}

// orphaned reports whether a STARTED connection has no live owner, and since when
// (zero if unknown: an item never owned carries no timestamp).
func orphaned(c codec.Connection, now time.Time, live map[string]codec.Worker) (time.Duration, bool) {
	nowMs := now.UnixMilli()
	ago := func(ms int64) time.Duration {
		if ms <= 0 || ms > nowMs {
			return 0
		}
		return time.Duration(nowMs-ms) * time.Millisecond
	}
	switch {
	case !c.Owned() && c.StatusAtMs > 0:
		// status_at_ms is when it was released or expired (or first nudged, for an
		// item never owned); nudges do not move it, so the age keeps growing.
		return ago(c.StatusAtMs), true
	case !c.Owned():
		return ago(c.NudgedAtMs), true
	case c.LeaseExpiresAtMs < nowMs:
		return ago(c.LeaseExpiresAtMs), true
	case live != nil:
		if _, ok := live[c.LeaseOwner]; !ok {
			return 0, true // the crash handler has yet to release it; age unknown
		}
	}
	return 0, false
}

func (s *Sweeper) worker(ctx context.Context, w codec.Worker, now time.Time, r *Report) error {
	cutoff := now.Add(-s.cfg.WorkerClearAfter).UnixMilli()
	if w.HeartbeatExpiresAtMs >= cutoff {
		return nil
	}
	_, err := s.db.DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName:                &s.cfg.Table,
		Key:                      map[string]types.AttributeValue{schema.AttrPK: codec.S(schema.WorkerKey(w.ID))},
		ConditionExpression:      aws.String("attribute_not_exists(#h) OR #h < :cutoff"),
		ExpressionAttributeNames: map[string]string{"#h": schema.AttrHeartbeatExpires},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":cutoff": codec.N(cutoff),
		},
	})
	var ccf *types.ConditionalCheckFailedException
	switch {
	case err == nil:
		r.WorkersCleared++
		s.log.InfoContext(ctx, "sweep: cleared lapsed worker", "worker", w.ID, "heartbeat_expired_ms_ago", now.UnixMilli()-w.HeartbeatExpiresAtMs)
		return nil
	case errors.As(err, &ccf):
		return nil // it heartbeat meanwhile
	default:
		return fmt.Errorf("sweep: clear worker %s: %w", w.ID, err)
	}
}

// unusable counts an item an operator made unusable as an orphan (unless an owner
// holds it: it stops it and says why) and writes the problem on it if it does not say
// so yet.
func (s *Sweeper) unusable(ctx context.Context, c codec.Connection, problem error, now time.Time, r *Report) error {
	if c.Owned() && !c.Expired(now.UnixMilli(), s.cfg.SkewMargin.Milliseconds()) {
		return nil
	}
	r.Orphaned++
	r.Unusable++
	if c.StatusAtMs > 0 && c.StatusAtMs <= now.UnixMilli() {
		r.OldestOrphan = max(r.OldestOrphan, time.Duration(now.UnixMilli()-c.StatusAtMs)*time.Millisecond)
	}
	msg := problem.Error()
	if c.StatusError == msg {
		return nil
	}
	if err := s.leases.ReportInvalid(ctx, c.ID, msg); err != nil {
		return err
	}
	r.Reported++
	s.log.InfoContext(ctx, "sweep: reported unusable connection", "id", c.ID, "problem", msg)
	return nil
}

// Nudge makes the stream carry connection id again so the reconciler looks for an
// owner: it writes nudged_at_ms = now and lease_expires_at_ms = 0, only if the item
// exists, is STARTED and is unowned (no lease_owner, or a released lease). An item
// never owned also gets status_at_ms = now, so the orphan age has a start. It reports
// whether it wrote; false means the item changed and needs no nudge.
func Nudge(ctx context.Context, db DynamoDB, table, id string, now time.Time) (bool, error) {
	if err := schema.ValidateID(id); err != nil {
		return false, fmt.Errorf("nudge: %w", err)
	}
	nowV := expression.Value(codec.N(now.UnixMilli()))
	upd := expression.Set(expression.Name(schema.AttrNudgedAt), nowV).
		Set(expression.Name(schema.AttrLeaseExpires), expression.Value(codec.N(0))).
		Set(expression.Name(schema.AttrStatusAt), expression.IfNotExists(expression.Name(schema.AttrStatusAt), nowV))
	if tp := tracing.TraceParent(ctx); tp != "" {
		// The record this write causes joins the sweep's trace (docs/TRACING.md).
		upd = upd.Set(expression.Name(tracing.AttrTraceParent), expression.Value(codec.S(tp)))
	}
	cond := expression.And(expression.Name(schema.AttrPK).AttributeExists(),
		expression.Name(schema.AttrDesiredState).Equal(expression.Value(codec.S(string(schema.Started)))),
		lease.ReleasedCondition())
	e, err := expression.NewBuilder().WithUpdate(upd).WithCondition(cond).Build()
	if err != nil {
		return false, fmt.Errorf("nudge %s: %w", id, err)
	}
	_, err = db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 &table,
		Key:                       map[string]types.AttributeValue{schema.AttrPK: codec.S(schema.ConnKey(id))},
		UpdateExpression:          e.Update(),
		ConditionExpression:       e.Condition(),
		ExpressionAttributeNames:  e.Names(),
		ExpressionAttributeValues: e.Values(),
	})
	var ccf *types.ConditionalCheckFailedException
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &ccf):
		return false, nil
	default:
		return false, fmt.Errorf("nudge %s: %w", id, err)
	}
}
