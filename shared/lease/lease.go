// Package lease takes, keeps and gives up connection leases with conditional writes.
//
// Two ways to hold a lease. In polling mode (the seed's design) a lease has an
// expiry and its owner renews it (Renew). In stream mode (Config.Membership) a lease
// lasts as long as its owner's membership (docs/MEMBERSHIP.md): Acquire writes
// schema.LeaseHeldByMember as its expiry, nothing renews it, the owner writes its
// checkpoint with Checkpoint, and only a release frees it — the owner's, or the
// reconciler's once the owner's membership lapsed beyond the skew margin.
//
// Guarantees:
//   - Every operation is one DynamoDB write (ReleaseAllOwnedBy: one per lease; ReadOwned
//     is one read), and every write by an owner (renew, checkpoint, release) is
//     conditioned on lease_owner = me AND lease_version = v. A worker that lost its
//     lease can neither renew, checkpoint nor release it.
//   - Transfer (a planned handoff, docs/HANDOFF.md) changes the owner in the same one
//     conditional write as every owner write (lease_owner = me AND lease_version = v,
//     and desired_state = STARTED), with the checkpoint, and gives the new owner a
//     version from the same clock as Acquire: the old owner can write nothing after
//     it, and the lease is never unowned in between.
//   - Acquire never creates an item and only takes STARTED connections whose lease is
//     absent, released, or expired by more than the skew margin on the caller's clock;
//     a membership lease never expires, so it is taken only once released.
//   - An ambiguous outcome (timeout, 5xx, a dropped response after the write was sent)
//     is resolved by reading the item back, so callers see the true result.
//   - ReadOwned is eventually consistent and never writes: callers confirm what it
//     shows with a conditional write before acting on it.
//   - Errors are the sentinels below, wrapped with context; no SDK type leaks out.
//   - Fencing versions never repeat. Each acquire writes a version from a hybrid
//     logical clock: at least the stored version + 1 and at least the wall clock in
//     ms. An outside write that rolls the stored version back (a console save of an
//     old image) cannot make a later acquire hand out a version again, unless the
//     acquirer's clock is behind the clock that issued it by more than the time since.
//     Since every owner write is conditioned on owner AND version, a repeat would also
//     need the same worker id.
//   - An operator's edit of a lease field never strands a connection (see
//     docs/MEMBERSHIP.md, "Operator edits"). A lease_version that is absent or not an
//     integer is repaired: restored by its owner's next write, replaced by a fresh
//     version at acquire (the wall clock plus the skew margin), and matched as it is
//     by the sweep's and the crash path's releases. A stale image that rolled the lease
//     back (a lower version, or the holder's version under another owner) is taken
//     back by the holder's next write when the stale lease is free by the acquire rule
//     (released, or expired beyond the margin) or names the holder itself — then nobody
//     can be streaming under it. An undecodable last_seq is reset to 0 at acquire. Every
//     repair is conditioned on the item being exactly as read, and is said on the item:
//     status_error and last_repair name the field and the value.
//
// Non-guarantees: the store does not stop a caller from streaming after it lost a
// lease. The worker fences itself on its monotonic clock (see worker/internal/owner);
// this package only makes sure the table never believes two owners at once. A stale
// image whose lease still looks live and names another worker is not provably stale
// to the holder: it stops (ErrLost), and the stale lease is released by the
// reconciler when its record passes the filter, or by the sweep at its expiry.
package lease

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
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

// DynamoDB is the part of the SDK client the store uses.
type DynamoDB interface {
	UpdateItem(context.Context, *dynamodb.UpdateItemInput, ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
	GetItem(context.Context, *dynamodb.GetItemInput, ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error)
	BatchGetItem(context.Context, *dynamodb.BatchGetItemInput, ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error)
	Query(context.Context, *dynamodb.QueryInput, ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error)
}

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
	// owners checkpoint with Checkpoint. Duration is then unused. See membership.go.
	Membership bool
}

// Defaults, for callers that renew per connection (stream mode instead sets
// Membership and never renews; its workers and the reconciler use a 2 s margin,
// membership.DefaultSkew).
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

// Acquire takes connection id for worker and returns the lease with the item's
// ws_url and last_seq. The new lease_version comes from a hybrid logical clock: at
// least the stored version + 1 and at least the wall clock in ms (see package doc).
//
// The common case is one write: the wall-clock floor, conditioned on the stored
// version being below it. If the condition failed only because of the version (it is
// at or above the floor, or an operator made it unusable) a second write follows,
// conditioned on the version exactly as it was read.
func (s *Store) Acquire(ctx context.Context, id, worker string) (Lease, error) {
	if err := validIDs(id, worker); err != nil {
		return Lease{}, fmt.Errorf("acquire %s: %w", id, err)
	}
	now := s.nowMs()
	try := versionTry{version: now, cond: "(attribute_not_exists(#v) OR #v < :nv)"}
	for attempt := 0; ; attempt++ {
		it, old, err := s.acquireOnce(ctx, id, worker, now, try)
		if err == nil {
			return s.acquired(ctx, id, worker, it, old, try.note != "")
		}
		next, retry := s.versionRetry(old, now)
		if attempt > 0 || !retry {
			return Lease{}, err
		}
		try = next
	}
}

// versionTry is the lease_version an acquire writes and the condition on the stored
// one that makes it right.
type versionTry struct {
	version int64
	cond    string
	vals    map[string]types.AttributeValue
	note    string // a repair to record, naming the field and its value
}

// acquireOnce makes one acquire write. It returns the item as it is after the write,
// and the item as it was before it when known; on a refusal, the item as it was.
func (s *Store) acquireOnce(ctx context.Context, id, worker string, now int64, try versionTry) (after, before codec.Item, err error) {
	exp := s.expiry(now)
	set := "SET #o = :me, #e = :exp, #v = :nv, #st = :acq, #sa = :now"
	vals := map[string]types.AttributeValue{
		":me": codec.S(worker), ":exp": codec.N(exp), ":zero": codec.N(0), ":nv": codec.N(try.version),
		":started": codec.S(string(schema.Started)), ":stale": codec.N(now - s.cfg.SkewMargin.Milliseconds()),
		":acq": codec.S("acquired"), ":now": codec.N(now),
	}
	names := names("#pk", schema.AttrPK, "#o", schema.AttrLeaseOwner, "#e", schema.AttrLeaseExpires,
		"#v", schema.AttrLeaseVersion, "#d", schema.AttrDesiredState, "#st", schema.AttrStatus,
		"#sa", schema.AttrStatusAt, "#se", schema.AttrStatusError)
	if try.note != "" {
		set += ", #se = :note, #lr = :lr"
		vals[":note"], vals[":lr"] = codec.S(try.note), codec.S(repairNote(now, try.note))
		names["#lr"] = schema.AttrLastRepair
	} else {
		set += " REMOVE #se"
	}
	for k, v := range try.vals {
		vals[k] = v
	}
	in := &dynamodb.UpdateItemInput{
		TableName:        &s.cfg.Table,
		Key:              key(id),
		UpdateExpression: aws.String(set),
		ConditionExpression: aws.String("attribute_exists(#pk) AND #d = :started AND " +
			"(attribute_not_exists(#o) OR attribute_not_exists(#e) OR #e = :zero OR #e < :stale) AND " + try.cond),
		ExpressionAttributeNames:            names,
		ExpressionAttributeValues:           vals,
		ReturnValues:                        types.ReturnValueAllOld,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}
	old, err := s.update(ctx, in)
	if err == nil {
		after := maps.Clone(old)
		after[schema.AttrLeaseOwner], after[schema.AttrLeaseExpires], after[schema.AttrLeaseVersion] = vals[":me"], vals[":exp"], vals[":nv"]
		after[schema.AttrStatus], after[schema.AttrStatusAt] = vals[":acq"], vals[":now"]
		delete(after, schema.AttrStatusError)
		if try.note != "" {
			after[schema.AttrStatusError], after[schema.AttrLastRepair] = vals[":note"], vals[":lr"]
		}
		return after, old, nil
	}
	// Our own write, seen later (a retry after a dropped response, or a read-back),
	// is recognised by owner and the exact expiry we wrote; in membership mode the
	// expiry is a constant, so the acquire time stamped in status_at_ms tells this
	// attempt apart.
	cur, raw, cerr := s.resolve(ctx, id, err)
	switch {
	case cerr == nil && cur.LeaseOwner == worker && cur.LeaseExpiresAtMs == exp && (!s.cfg.Membership || cur.StatusAtMs == now):
		return raw, nil, nil
	case cerr != nil:
		return nil, nil, fmt.Errorf("acquire %s: %w", id, cerr)
	case !isCondition(err) && cur.ID != "" && cur.DesiredState == schema.Started && !cur.Owned():
		// The write failed before it was applied and the lease is still free: the
		// table was unavailable, nobody else holds it.
		return nil, nil, fmt.Errorf("acquire %s: %w: %s", id, ErrUnavailable, translateMsg(err))
	default:
		return nil, raw, fmt.Errorf("acquire %s: %w", id, acquireRefusal(cur, now))
	}
}

// versionRetry decides, from the item a refused acquire saw, whether only the version
// condition failed, and if so what the second try writes: stored + 1 for a version at
// or above the floor; for an unusable one (a string, a non-integer), a fresh floor
// raised by the skew margin (the destroyed value cannot be read, and a version handed
// out by a worker whose clock runs ahead by up to the margin stays below it).
func (s *Store) versionRetry(old codec.Item, now int64) (versionTry, bool) {
	if old == nil || !free(old, now-s.cfg.SkewMargin.Milliseconds()) {
		return versionTry{}, false
	}
	if st, _ := old[schema.AttrDesiredState].(*types.AttributeValueMemberS); st == nil || st.Value != string(schema.Started) {
		return versionTry{}, false
	}
	raw := old[schema.AttrLeaseVersion]
	v, err := codec.Int(old, schema.AttrLeaseVersion)
	switch {
	case raw == nil:
		return versionTry{}, false // the first try's condition held for it: a race
	case err == nil && v >= now:
		return versionTry{version: v + 1, cond: "#v = :ov", vals: map[string]types.AttributeValue{":ov": raw}}, true
	case err == nil:
		return versionTry{}, false
	}
	fresh := now + s.cfg.SkewMargin.Milliseconds()
	t := versionTry{version: fresh, note: fmt.Sprintf("%s %s unusable: replaced with %d", schema.AttrLeaseVersion, codec.Describe(raw), fresh)}
	t.cond, t.vals = valueIs("#v", ":ov", raw)
	return t, true
}

// acquired finishes an acquire: it repairs an unusable checkpoint (reset to 0, and
// said so on the item), gives back an item that cannot be run, and returns the lease.
// noted: the acquire write itself recorded the version's repair.
func (s *Store) acquired(ctx context.Context, id, worker string, it, old codec.Item, noted bool) (Lease, error) {
	c, _ := codec.DecodeConnection(it)
	l := Lease{ID: id, Owner: worker, Version: c.LeaseVersion, ExpiresAtMs: c.LeaseExpiresAtMs, WSURL: c.WSURL, LastSeq: c.LastSeq}
	var notes []string
	if ov, err := codec.Int(old, schema.AttrLeaseVersion); noted {
	} else if err != nil {
		notes = append(notes, fmt.Sprintf("%s %s unusable: replaced with %d", schema.AttrLeaseVersion, codec.Describe(old[schema.AttrLeaseVersion]), l.Version))
	} else if ov == 0 && old[schema.AttrLeaseVersion] == nil && old[schema.AttrLeaseOwner] != nil {
		notes = append(notes, fmt.Sprintf("%s absent on an item owned by %s: replaced with %d", schema.AttrLeaseVersion, codec.Describe(old[schema.AttrLeaseOwner]), l.Version))
	}
	if _, err := codec.Int(it, schema.AttrLastSeq); err != nil {
		// The resume point is gone; starting from 0 replays rather than skips. Say so.
		notes = append(notes, fmt.Sprintf("%s %s unusable: checkpoint reset to 0, resuming from the start", schema.AttrLastSeq, codec.Describe(it[schema.AttrLastSeq])))
	}
	if len(notes) > 0 {
		note := strings.Join(notes, "; ")
		if err := s.noteRepair(ctx, l, it[schema.AttrLastSeq], note); err != nil {
			// Not recorded (the item changed again, or the table failed): do not keep
			// a lease this worker will not run.
			p := Progress{LastSeq: l.LastSeq, Status: "released", Error: "repair not recorded: " + note}
			if rerr := s.releaseAt(ctx, l, p, 0); rerr != nil {
				err = errors.Join(err, rerr)
			}
			return Lease{}, fmt.Errorf("acquire %s: record repair: %w", id, err)
		}
		if _, err := codec.Int(it, schema.AttrLastSeq); err != nil {
			it = maps.Clone(it)
			it[schema.AttrLastSeq] = codec.N(0)
			l.LastSeq = 0
		}
	}
	if _, derr := codec.DecodeConnection(it); derr != nil {
		// The condition cannot check everything (a ws_url without a host, say), so an
		// unusable item may be won. Give it back, recording why; the reconciler decodes
		// the same way and will not wake anyone for it until it is fixed.
		p := Progress{LastSeq: l.LastSeq, Status: "invalid", Error: derr.Error()}
		if c, _ := codec.DecodeConnection(it); c.Unrunnable() != nil {
			p.Error = c.Unrunnable().Error() // as the reconciler and the sweep word it
		}
		exp := int64(0)
		if s.cfg.InvalidRetry > 0 {
			exp = s.nowMs() + s.cfg.InvalidRetry.Milliseconds()
		}
		if rerr := s.releaseAt(ctx, l, p, exp); rerr != nil {
			return Lease{}, fmt.Errorf("acquire %s: %w (and give it back: %v)", id, derr, rerr)
		}
		return Lease{}, fmt.Errorf("acquire %s: %w", id, derr)
	}
	got, _ := codec.DecodeConnection(it) // valid: checked just above
	l.Spec, l.Epoch = got.Spec, got.Epoch
	return l, nil
}

// noteRepair records a repair found at acquire on the item: status_error and
// last_repair carry note, and an unusable last_seq (seq is what was read) is reset to
// 0, only if it is still exactly that value.
func (s *Store) noteRepair(ctx context.Context, l Lease, seq types.AttributeValue, note string) error {
	now := s.nowMs()
	set := "SET #se = :note, #lr = :lr"
	cond := "#o = :me AND #v = :v"
	vals := map[string]types.AttributeValue{":me": codec.S(l.Owner), ":v": codec.N(l.Version),
		":note": codec.S(note), ":lr": codec.S(repairNote(now, note))}
	nm := names("#o", schema.AttrLeaseOwner, "#v", schema.AttrLeaseVersion, "#se", schema.AttrStatusError, "#lr", schema.AttrLastRepair)
	if _, err := codec.Int(codec.Item{schema.AttrLastSeq: seq}, schema.AttrLastSeq); err != nil {
		c, v := valueIs("#ls", ":ols", seq)
		set += ", #ls = :zero"
		cond += " AND " + c
		maps.Copy(vals, v)
		vals[":zero"] = codec.N(0)
		nm["#ls"] = schema.AttrLastSeq
	}
	_, err := s.update(ctx, &dynamodb.UpdateItemInput{
		TableName: &s.cfg.Table, Key: key(l.ID), UpdateExpression: aws.String(set),
		ConditionExpression: aws.String(cond), ExpressionAttributeNames: nm, ExpressionAttributeValues: vals,
	})
	if err != nil {
		return translate(err)
	}
	return nil
}

// acquireRefusal says why the acquire condition failed, from the item as it was.
func acquireRefusal(old codec.Connection, now int64) error {
	switch {
	case old.ID == "":
		return ErrNotFound
	case old.DesiredState != schema.Started:
		return ErrNotStarted
	default:
		return fmt.Errorf("%w: %s, version %d, expires in %dms", ErrHeld, old.LeaseOwner, old.LeaseVersion, old.LeaseExpiresAtMs-now)
	}
}

// Renew extends l, stores p's checkpoint, and returns the item as it now is, so the
// caller sees a STOPPED desired_state or a changed ws_url. ErrNotFound means the
// item was deleted; ErrLost means someone else holds it now.
func (s *Store) Renew(ctx context.Context, l Lease, p Progress) (codec.Connection, error) {
	now := s.nowMs()
	exp := now + s.cfg.Duration.Milliseconds()
	set := "SET #e = :exp, #ls = :seq"
	vals := map[string]types.AttributeValue{":exp": codec.N(exp), ":seq": codec.N(p.LastSeq)}
	set, vals = withStatus(set, vals, p, now)
	c, err := s.ownerWrite(ctx, "renew", l, set, vals, func(c codec.Connection) bool {
		return c.LeaseOwner == l.Owner && c.LeaseVersion == l.Version && c.LeaseExpiresAtMs == exp
	})
	return c, err
}

// Release gives l up (lease_expires_at_ms = 0, owner removed) and stores the final
// checkpoint, in one write.
func (s *Store) Release(ctx context.Context, l Lease, p Progress) error {
	return s.releaseAt(ctx, l, p, 0)
}

// releaseAt is Release leaving lease_expires_at_ms = exp: 0, or, for an unusable item
// given back in polling mode, the time before which the seed's orphan query skips it.
func (s *Store) releaseAt(ctx context.Context, l Lease, p Progress, exp int64) error {
	now := s.nowMs()
	set := "SET #e = :rexp, #ls = :seq"
	vals := map[string]types.AttributeValue{":rexp": codec.N(exp), ":seq": codec.N(p.LastSeq)}
	if p.Status == "" {
		p.Status = "released"
	}
	if p.Stop {
		set += ", #d = :stopped"
		vals[":stopped"] = codec.S(string(schema.Stopped))
	}
	set, vals = withStatus(set, vals, p, now)
	_, err := s.ownerWrite(ctx, "release", l, set+" REMOVE #o", vals, func(c codec.Connection) bool {
		return c.LeaseOwner == "" && c.LeaseVersion == l.Version && c.LeaseExpiresAtMs == exp && c.LastSeq == p.LastSeq
	})
	return err
}

func withStatus(set string, vals map[string]types.AttributeValue, p Progress, now int64) (string, map[string]types.AttributeValue) {
	if p.Epoch != 0 {
		set += ", #qe = :qe"
		vals[":qe"] = codec.N(p.Epoch)
	}
	if p.Status == "" {
		return set, vals
	}
	set += ", #st = :st, #sa = :now, #se = :se"
	vals[":st"], vals[":now"], vals[":se"] = codec.S(p.Status), codec.N(now), codec.S(p.Error)
	return set, vals
}

// ownerWrite runs an update conditioned on owner and version. done recognises the
// item as it is after our write, for when a retry or read-back finds it applied.
//
// When the condition fails because of an operator's edit that no acquire could have
// made, the lease is repaired once and the write retried (see ownerRepair).
func (s *Store) ownerWrite(ctx context.Context, op string, l Lease, update string,
	vals map[string]types.AttributeValue, done func(codec.Connection) bool) (codec.Connection, error) {
	return s.ownerWriteIf(ctx, op, l, update, "", vals, done)
}

// ownerWriteIf is ownerWrite with a further condition (cond, "" for none): a write
// refused by it alone, the lease still l's, is ErrNotStarted when cond is on the
// desired state (the only one used), else ErrLost.
func (s *Store) ownerWriteIf(ctx context.Context, op string, l Lease, update, cond string,
	vals map[string]types.AttributeValue, done func(codec.Connection) bool) (codec.Connection, error) {
	if err := validIDs(l.ID, l.Owner); err != nil {
		return codec.Connection{}, fmt.Errorf("%s %s: %w", op, l.ID, err)
	}
	vals[":me"], vals[":v"] = codec.S(l.Owner), codec.N(l.Version)
	in := &dynamodb.UpdateItemInput{
		TableName:           &s.cfg.Table,
		Key:                 key(l.ID),
		UpdateExpression:    aws.String(update),
		ConditionExpression: aws.String(ownerCond(cond)),
		ExpressionAttributeNames: names("#pk", schema.AttrPK, "#o", schema.AttrLeaseOwner, "#e", schema.AttrLeaseExpires,
			"#v", schema.AttrLeaseVersion, "#ls", schema.AttrLastSeq),
		ExpressionAttributeValues:           vals,
		ReturnValues:                        types.ReturnValueAllNew,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}
	if !strings.Contains(update, "#e") {
		delete(in.ExpressionAttributeNames, "#e") // a checkpoint leaves the expiry alone
	}
	if _, ok := vals[":stopped"]; ok || strings.Contains(cond, "#d") {
		in.ExpressionAttributeNames["#d"] = schema.AttrDesiredState
	}
	if strings.Contains(update, "#ma") {
		in.ExpressionAttributeNames["#ma"] = schema.AttrMovedAt
	}
	if _, ok := vals[":qe"]; ok {
		in.ExpressionAttributeNames["#qe"] = schema.AttrEpoch
	}
	if _, ok := vals[":st"]; ok {
		in.ExpressionAttributeNames["#st"] = schema.AttrStatus
		in.ExpressionAttributeNames["#sa"] = schema.AttrStatusAt
		in.ExpressionAttributeNames["#se"] = schema.AttrStatusError
	}
	for attempt := 0; ; attempt++ {
		item, err := s.update(ctx, in)
		if err == nil {
			c, _ := codec.DecodeConnection(item) // an operator's bad edit is the caller's to see in c
			return c, nil
		}
		cur, raw, cerr := s.resolve(ctx, l.ID, err)
		switch {
		case cerr != nil:
			return codec.Connection{}, fmt.Errorf("%s %s: %w", op, l.ID, cerr)
		case done(cur):
			return cur, nil
		case !isCondition(err) && cur.LeaseOwner == l.Owner && cur.LeaseVersion == l.Version:
			// Not applied, and still ours: the table was unavailable, the lease is not lost.
			return codec.Connection{}, fmt.Errorf("%s %s: %w: %s", op, l.ID, ErrUnavailable, translateMsg(err))
		case cur.ID == "":
			return codec.Connection{}, fmt.Errorf("%s %s: %w", op, l.ID, ErrNotFound)
		case cond != "" && isCondition(err) && cur.LeaseOwner == l.Owner && cur.LeaseVersion == l.Version && !unusableVersion(raw):
			// Still ours: only the further condition failed.
			return codec.Connection{}, fmt.Errorf("%s %s: %w (desired_state %q)", op, l.ID, ErrNotStarted, cur.DesiredState)
		}
		if attempt == 0 && isCondition(err) {
			repaired, rerr := s.ownerRepair(ctx, l, raw)
			if rerr != nil {
				return codec.Connection{}, fmt.Errorf("%s %s: repair: %w", op, l.ID, rerr)
			}
			if repaired {
				continue
			}
		}
		return codec.Connection{}, fmt.Errorf("%s %s: %w (now %q version %s, had version %d)",
			op, l.ID, ErrLost, cur.LeaseOwner, codec.Describe(raw[schema.AttrLeaseVersion]), l.Version)
	}
}

// ownerRepair puts l back on the item when the item shows an ownership that no acquire
// made, and reports whether it did. Two cases, each written conditioned on the item
// being exactly as read:
//
//   - lease_version is absent or unusable while lease_owner is l's owner: an acquire
//     always writes a number and its own owner, so nobody acquired since; the version
//     is restored.
//   - a stale whole-item image rolled the lease back: a version below l's (acquires
//     only raise it), or l's version under another owner (versions never repeat; an
//     unowned item at l's version is l released, by its owner, the sweep or the crash
//     path, and stays released). It
//     is taken back only if the stale lease is one anybody could acquire now
//     (released, or expired beyond the skew margin) or names this same worker: then
//     no one streams under it, as an acquire would assume. A stale image with a live
//     lease of another worker is left alone: l is lost, and the sweep releases the
//     stale lease at its expiry (its next acquire gets a version above l's).
func (s *Store) ownerRepair(ctx context.Context, l Lease, raw codec.Item) (bool, error) {
	if raw == nil {
		return false, nil
	}
	now := s.nowMs()
	owner, _ := raw[schema.AttrLeaseOwner].(*types.AttributeValueMemberS)
	rawV := raw[schema.AttrLeaseVersion]
	v, verr := codec.Int(raw, schema.AttrLeaseVersion)
	var set, note string
	vals := map[string]types.AttributeValue{":me": codec.S(l.Owner), ":mine": codec.N(l.Version)}
	conds := []string{}
	switch {
	case owner != nil && owner.Value == l.Owner && (rawV == nil || verr != nil):
		note = fmt.Sprintf("%s %s on the lease of %s: restored to %d", schema.AttrLeaseVersion, codec.Describe(rawV), l.Owner, l.Version)
		set = "SET #v = :mine"
		conds = append(conds, "#o = :me")
	case verr == nil && rawV != nil && (v < l.Version || (v == l.Version && owner != nil && owner.Value != l.Owner)) &&
		(free(raw, now-s.cfg.SkewMargin.Milliseconds()) || (owner != nil && owner.Value == l.Owner)):
		note = fmt.Sprintf("stale image: %s %s at version %d replaced the lease of %s at version %d; reclaimed",
			schema.AttrLeaseOwner, codec.Describe(raw[schema.AttrLeaseOwner]), v, l.Owner, l.Version)
		set = "SET #o = :me, #v = :mine, #e = :exp"
		vals[":exp"] = codec.N(s.expiry(now))
		c, cv := valueIs("#o", ":oo", raw[schema.AttrLeaseOwner])
		conds = append(conds, c)
		maps.Copy(vals, cv)
		c, cv = valueIs("#e", ":oe", raw[schema.AttrLeaseExpires])
		conds = append(conds, c)
		maps.Copy(vals, cv)
	default:
		return false, nil
	}
	c, cv := valueIs("#v", ":ov", rawV)
	conds = append(conds, c)
	maps.Copy(vals, cv)
	vals[":note"], vals[":lr"] = codec.S(note), codec.S(repairNote(now, note))
	nm := names("#pk", schema.AttrPK, "#o", schema.AttrLeaseOwner, "#v", schema.AttrLeaseVersion,
		"#se", schema.AttrStatusError, "#lr", schema.AttrLastRepair)
	if strings.Contains(set, "#e") {
		nm["#e"] = schema.AttrLeaseExpires
	}
	_, err := s.update(ctx, &dynamodb.UpdateItemInput{
		TableName:                 &s.cfg.Table,
		Key:                       key(l.ID),
		UpdateExpression:          aws.String(set + ", #se = :note, #lr = :lr"),
		ConditionExpression:       aws.String("attribute_exists(#pk) AND " + strings.Join(conds, " AND ")),
		ExpressionAttributeNames:  nm,
		ExpressionAttributeValues: vals,
	})
	switch {
	case err == nil:
		return true, nil
	case isCondition(err):
		return false, nil // it changed again; judge the retry's refusal as it comes
	default:
		return false, translate(err)
	}
}

// ReleaseExpired is the sweep's release: it succeeds only if the lease is still
// owner's at version and expired more than the skew margin before now.
func (s *Store) ReleaseExpired(ctx context.Context, id, owner string, version int64, now time.Time) error {
	if err := validIDs(id, owner); err != nil {
		return fmt.Errorf("release expired %s: %w", id, err)
	}
	stale := now.UnixMilli() - s.cfg.SkewMargin.Milliseconds()
	in := &dynamodb.UpdateItemInput{
		TableName:           &s.cfg.Table,
		Key:                 key(id),
		UpdateExpression:    aws.String("SET #e = :zero, #st = :st, #sa = :now REMOVE #o"),
		ConditionExpression: aws.String("attribute_exists(#pk) AND #o = :o AND #v = :v AND #e > :zero AND #e < :stale"),
		ExpressionAttributeNames: names("#pk", schema.AttrPK, "#o", schema.AttrLeaseOwner, "#e", schema.AttrLeaseExpires,
			"#v", schema.AttrLeaseVersion, "#st", schema.AttrStatus, "#sa", schema.AttrStatusAt),
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":o": codec.S(owner), ":v": codec.N(version), ":zero": codec.N(0), ":stale": codec.N(stale),
			":st": codec.S("expired"), ":now": codec.N(now.UnixMilli()),
		},
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}
	_, err := s.update(ctx, in)
	if err == nil {
		return nil
	}
	cur, raw, cerr := s.resolve(ctx, id, err)
	if cerr == nil && isCondition(err) && cur.LeaseOwner == owner && unusableVersion(raw) {
		// The version cannot be matched: release on owner and expiry, and the version
		// exactly as it is, writing a fresh one (as an acquire would).
		return s.releaseUnusable(ctx, id, owner, raw, "#e > :zero AND #e < :stale", "expired",
			map[string]types.AttributeValue{":zero": codec.N(0), ":stale": codec.N(stale)})
	}
	switch {
	case cerr != nil:
		return fmt.Errorf("release expired %s: %w", id, cerr)
	case cur.ID == "":
		return fmt.Errorf("release expired %s: %w", id, ErrNotFound)
	case cur.LeaseOwner == "" && cur.LeaseVersion == version:
		return nil // released already, by us on a retry or by its owner
	case !isCondition(err) && cur.LeaseOwner == owner && cur.LeaseVersion == version:
		return fmt.Errorf("release expired %s: %w: %s", id, ErrUnavailable, translateMsg(err))
	case cur.LeaseOwner != owner || cur.LeaseVersion != version:
		return fmt.Errorf("release expired %s: %w", id, ErrLost)
	default:
		return fmt.Errorf("release expired %s: %w (expires %d, now %d)", id, ErrHeld, cur.LeaseExpiresAtMs, now.UnixMilli())
	}
}

// ReleaseStale releases the lease a stale whole-item image left on id (owner at
// version, as the stream record showed it), conditioned on exactly that, once the
// displaced holder (at holderVersion) has said it no longer holds the connection or is
// not a live member. Safe without asking owner: a holder at a higher version exists,
// so the stale lease's session had ended before that acquire (see package doc). It
// writes a version above both, and a status_error saying what happened.
// ErrLost: the item changed since the record (the holder took it back, say).
func (s *Store) ReleaseStale(ctx context.Context, id, owner string, version, holderVersion int64) error {
	if err := validIDs(id, owner); err != nil {
		return fmt.Errorf("release stale %s: %w", id, err)
	}
	now := s.nowMs()
	fresh := max(holderVersion+1, now+s.cfg.SkewMargin.Milliseconds())
	note := fmt.Sprintf("stale image: %s %q at version %d replaced a lease at version %d; released with version %d",
		schema.AttrLeaseOwner, owner, version, holderVersion, fresh)
	cond := "#v = :ov"
	if version == 0 { // what a record shows for an absent or unusable version
		cond = "(attribute_not_exists(#v) OR #v = :ov OR NOT attribute_type(#v, :tn))"
	}
	_, err := s.update(ctx, &dynamodb.UpdateItemInput{
		TableName:           &s.cfg.Table,
		Key:                 key(id),
		UpdateExpression:    aws.String("SET #e = :zero, #v = :fresh, #st = :st, #sa = :now, #se = :note, #lr = :lr REMOVE #o"),
		ConditionExpression: aws.String("attribute_exists(#pk) AND #o = :o AND " + cond),
		ExpressionAttributeNames: names("#pk", schema.AttrPK, "#o", schema.AttrLeaseOwner, "#e", schema.AttrLeaseExpires,
			"#v", schema.AttrLeaseVersion, "#st", schema.AttrStatus, "#sa", schema.AttrStatusAt,
			"#se", schema.AttrStatusError, "#lr", schema.AttrLastRepair),
		ExpressionAttributeValues: withTypeN(cond, map[string]types.AttributeValue{
			":o": codec.S(owner), ":ov": codec.N(version), ":zero": codec.N(0), ":fresh": codec.N(fresh),
			":st": codec.S("repaired"), ":now": codec.N(now), ":note": codec.S(note), ":lr": codec.S(repairNote(now, note)),
		}),
	})
	switch {
	case err == nil:
		return nil
	case isCondition(err):
		return fmt.Errorf("release stale %s: %w", id, ErrLost)
	default:
		return fmt.Errorf("release stale %s: %w", id, translate(err))
	}
}

func withTypeN(cond string, vals map[string]types.AttributeValue) map[string]types.AttributeValue {
	if strings.Contains(cond, ":tn") {
		vals[":tn"] = codec.S("N")
	}
	return vals
}

// ReportInvalid writes status "invalid" and status_error problem (naming the field and
// the value) on connection id, so a console user sees why it does not run. It writes
// only to an unowned item (an owner stops its item and says why itself) whose
// status_error does not say so already, so the record it causes is not news again.
func (s *Store) ReportInvalid(ctx context.Context, id, problem string) error {
	if err := schema.ValidateID(id); err != nil {
		return fmt.Errorf("report invalid %s: %w", id, err)
	}
	if problem == "" {
		return fmt.Errorf("report invalid %s: %w: empty problem", id, ErrInvalid)
	}
	_, err := s.update(ctx, &dynamodb.UpdateItemInput{
		TableName:        &s.cfg.Table,
		Key:              key(id),
		UpdateExpression: aws.String("SET #st = :st, #sa = :now, #se = :p"),
		ConditionExpression: aws.String("attribute_exists(#pk) AND (attribute_not_exists(#o) OR attribute_not_exists(#e) OR #e = :zero) AND " +
			"(attribute_not_exists(#se) OR #se <> :p)"),
		ExpressionAttributeNames: names("#pk", schema.AttrPK, "#o", schema.AttrLeaseOwner, "#e", schema.AttrLeaseExpires,
			"#st", schema.AttrStatus, "#sa", schema.AttrStatusAt, "#se", schema.AttrStatusError),
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":st": codec.S("invalid"), ":now": codec.N(s.nowMs()), ":p": codec.S(problem), ":zero": codec.N(0),
		},
	})
	switch {
	case err == nil, isCondition(err):
		return nil // written, or nothing to write (owned, gone, or said already)
	default:
		return fmt.Errorf("report invalid %s: %w", id, translate(err))
	}
}

// ReleaseAllOwnedBy releases every lease worker holds (the crash path). It finds them
// through the lease_owner index and conditions each release on owner and version,
// so a lease re-acquired meanwhile is left alone. It returns the ids it released.
func (s *Store) ReleaseAllOwnedBy(ctx context.Context, worker string) ([]string, error) {
	if err := schema.ValidateID(worker); err != nil {
		return nil, fmt.Errorf("release all of %s: %w", worker, err)
	}
	var released []string
	var errs []error
	var start map[string]types.AttributeValue
	for {
		out, err := s.db.Query(ctx, &dynamodb.QueryInput{
			TableName:                 &s.cfg.Table,
			IndexName:                 aws.String(schema.IndexLeaseOwner),
			KeyConditionExpression:    aws.String("#o = :w"),
			ExpressionAttributeNames:  map[string]string{"#o": schema.AttrLeaseOwner},
			ExpressionAttributeValues: map[string]types.AttributeValue{":w": codec.S(worker)},
			ExclusiveStartKey:         start,
		})
		if err != nil {
			return released, fmt.Errorf("release all of %s: query: %w", worker, translate(err))
		}
		for _, k := range out.Items {
			pk, _ := k[schema.AttrPK].(*types.AttributeValueMemberS)
			if pk == nil {
				continue
			}
			id, ok := schema.ConnID(pk.Value)
			if !ok {
				continue
			}
			cur, raw, err := s.get(ctx, id)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if cur.LeaseOwner != worker {
				continue // index lag: released or re-acquired since
			}
			if unusableVersion(raw) {
				err = s.releaseUnusable(ctx, id, worker, raw, "", "owner stopped", nil)
			} else {
				err = s.Release(ctx, Lease{ID: id, Owner: worker, Version: cur.LeaseVersion}, Progress{LastSeq: cur.LastSeq, Status: "owner stopped"})
			}
			switch {
			case err == nil:
				released = append(released, id)
			case errors.Is(err, ErrLost), errors.Is(err, ErrNotFound):
			default:
				errs = append(errs, err)
			}
		}
		if len(out.LastEvaluatedKey) == 0 {
			break
		}
		start = out.LastEvaluatedKey
	}
	return released, errors.Join(errs...)
}

// Get reads connection id with a strongly consistent read.
func (s *Store) Get(ctx context.Context, id string) (codec.Connection, error) {
	if err := schema.ValidateID(id); err != nil {
		return codec.Connection{}, fmt.Errorf("get %s: %w", id, err)
	}
	c, _, err := s.get(ctx, id)
	if err == nil && c.ID == "" {
		return c, fmt.Errorf("get %s: %w", id, ErrNotFound)
	}
	return c, err
}

// get returns the item decoded (zero Connection if absent) and raw. A decode error is
// not returned: the lease fields are what lease operations need, and they are kept
// regardless; the raw item says which of them were unusable.
func (s *Store) get(ctx context.Context, id string) (codec.Connection, codec.Item, error) {
	out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{TableName: &s.cfg.Table, Key: key(id), ConsistentRead: aws.Bool(true)})
	if err != nil {
		return codec.Connection{}, nil, fmt.Errorf("read %s: %w", id, translate(err))
	}
	if out.Item == nil {
		return codec.Connection{}, nil, nil
	}
	c, _ := codec.DecodeConnection(out.Item)
	c.ID = id
	return c, out.Item, nil
}

// releaseUnusable releases owner's lease on id whose lease_version is absent or
// unusable (raw is the item as read), conditioned on the owner, on cond, and on the
// version being exactly as read. It writes a fresh version (the wall clock raised by
// the skew margin, as an acquire repairing it would) and a status_error naming the
// field and its value.
func (s *Store) releaseUnusable(ctx context.Context, id, owner string, raw codec.Item, cond, status string,
	vals map[string]types.AttributeValue) error {
	now := s.nowMs()
	fresh := now + s.cfg.SkewMargin.Milliseconds()
	rawV := raw[schema.AttrLeaseVersion]
	note := fmt.Sprintf("%s %s on the lease of %s: released with version %d", schema.AttrLeaseVersion, codec.Describe(rawV), owner, fresh)
	vc, vv := valueIs("#v", ":ov", rawV)
	if vals == nil {
		vals = map[string]types.AttributeValue{}
	}
	maps.Copy(vals, vv)
	vals[":o"], vals[":rz"], vals[":fresh"], vals[":st"], vals[":now"] = codec.S(owner), codec.N(0), codec.N(fresh), codec.S(status), codec.N(now)
	vals[":note"], vals[":lr"] = codec.S(note), codec.S(repairNote(now, note))
	full := "attribute_exists(#pk) AND #o = :o AND " + vc
	if cond != "" {
		full += " AND " + cond
	}
	_, err := s.update(ctx, &dynamodb.UpdateItemInput{
		TableName:           &s.cfg.Table,
		Key:                 key(id),
		UpdateExpression:    aws.String("SET #e = :rz, #v = :fresh, #st = :st, #sa = :now, #se = :note, #lr = :lr REMOVE #o"),
		ConditionExpression: aws.String(full),
		ExpressionAttributeNames: names("#pk", schema.AttrPK, "#o", schema.AttrLeaseOwner, "#e", schema.AttrLeaseExpires,
			"#v", schema.AttrLeaseVersion, "#st", schema.AttrStatus, "#sa", schema.AttrStatusAt,
			"#se", schema.AttrStatusError, "#lr", schema.AttrLastRepair),
		ExpressionAttributeValues: vals,
	})
	switch {
	case err == nil:
		return nil
	case isCondition(err):
		return fmt.Errorf("release %s (unusable version): %w", id, ErrLost)
	default:
		return fmt.Errorf("release %s (unusable version): %w", id, translate(err))
	}
}

// ownerCond is the owner-and-version condition, with cond if not empty.
func ownerCond(cond string) string {
	c := "attribute_exists(#pk) AND #o = :me AND #v = :v"
	if cond != "" {
		c += " AND " + cond
	}
	return c
}

// unusableVersion: the item names an owner but its lease_version is absent or will
// not decode, so no owner-and-version condition can match it.
func unusableVersion(raw codec.Item) bool {
	if raw == nil || raw[schema.AttrLeaseOwner] == nil {
		return false
	}
	_, err := codec.Int(raw, schema.AttrLeaseVersion)
	return raw[schema.AttrLeaseVersion] == nil || err != nil
}

// free mirrors the acquire condition on a raw item: no owner, or a lease that is
// absent, released, or expired before stale.
func free(raw codec.Item, stale int64) bool {
	if raw[schema.AttrLeaseOwner] == nil || raw[schema.AttrLeaseExpires] == nil {
		return true
	}
	e, err := codec.Int(raw, schema.AttrLeaseExpires)
	return err == nil && (e == 0 || e < stale)
}

// valueIs is a condition that the attribute (name ref) is exactly v as read: absent,
// the same number or string, or, for any other type, still not a number or string.
func valueIs(ref, val string, v types.AttributeValue) (string, map[string]types.AttributeValue) {
	switch v.(type) {
	case nil:
		return "attribute_not_exists(" + ref + ")", nil
	case *types.AttributeValueMemberN, *types.AttributeValueMemberS:
		return ref + " = " + val, map[string]types.AttributeValue{val: v}
	}
	return fmt.Sprintf("attribute_exists(%[1]s) AND NOT attribute_type(%[1]s, %[2]sn) AND NOT attribute_type(%[1]s, %[2]ss)", ref, val),
		map[string]types.AttributeValue{val + "n": codec.S("N"), val + "s": codec.S("S")}
}

// repairNote is the last_repair value: when, and what.
func repairNote(nowMs int64, note string) string {
	return time.UnixMilli(nowMs).UTC().Format(time.RFC3339) + " " + note
}

// conditionFailed carries the item as it was when a condition failed.
type conditionFailed struct{ item codec.Item }

func (conditionFailed) Error() string { return "condition failed" }

// update runs in, turning a condition failure into conditionFailed.
func (s *Store) update(ctx context.Context, in *dynamodb.UpdateItemInput) (codec.Item, error) {
	out, err := s.db.UpdateItem(ctx, in)
	if err == nil {
		return out.Attributes, nil
	}
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		return nil, conditionFailed{item: ccf.Item}
	}
	return nil, err
}

func isCondition(err error) bool {
	var cf conditionFailed
	return errors.As(err, &cf)
}

// resolve turns a failed write into the item as it now is. A condition failure
// carries the item; anything else is ambiguous (the write may have been applied), so
// the item is read back on a fresh context in case ctx is what expired.
func (s *Store) resolve(ctx context.Context, id string, err error) (codec.Connection, codec.Item, error) {
	var cf conditionFailed
	if errors.As(err, &cf) {
		if cf.item == nil {
			return codec.Connection{}, nil, nil
		}
		c, _ := codec.DecodeConnection(cf.item)
		c.ID = id
		return c, cf.item, nil
	}
	var api smithy.APIError
	if errors.As(err, &api) && api.ErrorFault() == smithy.FaultClient && !retryableCode(api.ErrorCode()) {
		return codec.Connection{}, nil, fmt.Errorf("%w: %s", ErrInvalid, api.ErrorMessage()) // refused before applying
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ReadBackTimeout)
	defer cancel()
	c, raw, rerr := s.get(rctx, id)
	if rerr != nil {
		return codec.Connection{}, nil, fmt.Errorf("%w: write: %v; read-back: %v", ErrUnavailable, translateMsg(err), rerr)
	}
	return c, raw, nil
}

func retryableCode(code string) bool {
	switch code {
	case "ThrottlingException", "ProvisionedThroughputExceededException", "RequestLimitExceeded",
		"TransactionConflictException", "RequestTimeout", "RequestTimeoutException":
		return true
	}
	return false
}

// translate hides SDK error types behind ErrUnavailable, keeping the message.
func translate(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrUnavailable, translateMsg(err))
}

func translateMsg(err error) string {
	var api smithy.APIError
	if errors.As(err, &api) {
		return api.ErrorCode() + ": " + api.ErrorMessage()
	}
	return err.Error()
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

func key(id string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{schema.AttrPK: codec.S(schema.ConnKey(id))}
}

func names(kv ...string) map[string]string {
	m := make(map[string]string, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
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
