// Package lease takes, keeps and gives up connection leases with conditional writes.
//
// Guarantees:
//   - Every operation is one DynamoDB write (ReleaseAllOwnedBy: one per lease), and
//     every write by an owner is conditioned on lease_owner = me AND lease_version = v.
//     A worker that lost its lease can neither renew, checkpoint nor release it.
//   - Acquire never creates an item and only takes STARTED connections whose lease is
//     absent, released, or expired by more than the skew margin on the caller's clock.
//   - An ambiguous outcome (timeout, 5xx, a dropped response after the write was sent)
//     is resolved by reading the item back, so callers see the true result.
//   - Errors are the sentinels below, wrapped with context; no SDK type leaks out.
//
// Non-guarantees: the store does not stop a caller from streaming after it lost a
// lease. The worker fences itself on its monotonic clock (see worker/internal/owner);
// this package only makes sure the table never believes two owners at once.
package lease

import (
	"context"
	"errors"
	"fmt"
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
}

// Defaults: a 60 s lease renewed every 20 s costs 180 writes per connection-hour,
// against the seed's 2,160 (5 s renew, 3 billed writes each). Failover does not wait
// for expiry (releases and crash events drive it), so a long lease costs nothing there.
const (
	DefaultDuration   = 60 * time.Second
	DefaultSkewMargin = 5 * time.Second
)

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
}

// Progress is what an owner writes with a renew or release: the checkpoint, and the
// observed status if it changed (empty Status leaves the stored one alone).
type Progress struct {
	LastSeq int64
	Status  string
	Error   string
}

// Acquire takes connection id for worker. It increments lease_version and returns the
// lease with the item's ws_url and last_seq.
func (s *Store) Acquire(ctx context.Context, id, worker string) (Lease, error) {
	if err := validIDs(id, worker); err != nil {
		return Lease{}, fmt.Errorf("acquire %s: %w", id, err)
	}
	now := s.nowMs()
	exp := now + s.cfg.Duration.Milliseconds()
	in := &dynamodb.UpdateItemInput{
		TableName:        &s.cfg.Table,
		Key:              key(id),
		UpdateExpression: aws.String("SET #o = :me, #e = :exp, #v = if_not_exists(#v, :zero) + :one, #st = :acq, #sa = :now REMOVE #se"),
		ConditionExpression: aws.String("attribute_exists(#pk) AND #d = :started AND " +
			"(attribute_not_exists(#o) OR attribute_not_exists(#e) OR #e = :zero OR #e < :stale)"),
		ExpressionAttributeNames: names("#pk", schema.AttrPK, "#o", schema.AttrLeaseOwner, "#e", schema.AttrLeaseExpires,
			"#v", schema.AttrLeaseVersion, "#d", schema.AttrDesiredState, "#st", schema.AttrStatus,
			"#sa", schema.AttrStatusAt, "#se", schema.AttrStatusError),
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":me": codec.S(worker), ":exp": codec.N(exp), ":zero": codec.N(0), ":one": codec.N(1),
			":started": codec.S(string(schema.Started)), ":stale": codec.N(now - s.cfg.SkewMargin.Milliseconds()),
			":acq": codec.S("acquired"), ":now": codec.N(now),
		},
		ReturnValues:                        types.ReturnValueAllNew,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}
	// Our own write, seen later (a retry after a dropped response, or a read-back),
	// is recognised by owner and the exact expiry we wrote.
	ours := func(c codec.Connection) bool { return c.LeaseOwner == worker && c.LeaseExpiresAtMs == exp }
	item, err := s.update(ctx, in)
	if err != nil {
		old, cerr := s.resolve(ctx, id, err)
		switch {
		case cerr == nil && ours(old):
			item = codec.EncodeConnection(old)
		case cerr != nil:
			return Lease{}, fmt.Errorf("acquire %s: %w", id, cerr)
		case !isCondition(err) && old.ID != "" && old.DesiredState == schema.Started && !old.Owned():
			// The write failed before it was applied and the lease is still free: the
			// table was unavailable, nobody else holds it.
			return Lease{}, fmt.Errorf("acquire %s: %w: %s", id, ErrUnavailable, translateMsg(err))
		default:
			return Lease{}, fmt.Errorf("acquire %s: %w", id, acquireRefusal(old, now))
		}
	}
	c, derr := codec.DecodeConnection(item)
	if derr != nil {
		// The condition cannot check everything (a ws_url without a host, say), so an
		// unusable item may be won. Give it straight back, recording why; the reconciler
		// decodes the same way and will not wake anyone for it until it is fixed.
		l := Lease{ID: id, Owner: worker, Version: c.LeaseVersion, LastSeq: c.LastSeq}
		if rerr := s.Release(ctx, l, Progress{LastSeq: c.LastSeq, Status: "invalid", Error: derr.Error()}); rerr != nil {
			return Lease{}, fmt.Errorf("acquire %s: %w (and give it back: %v)", id, derr, rerr)
		}
		return Lease{}, fmt.Errorf("acquire %s: %w", id, derr)
	}
	return Lease{ID: id, Owner: worker, Version: c.LeaseVersion, ExpiresAtMs: c.LeaseExpiresAtMs, WSURL: c.WSURL, LastSeq: c.LastSeq}, nil
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
	now := s.nowMs()
	set := "SET #e = :zero, #ls = :seq"
	vals := map[string]types.AttributeValue{":zero": codec.N(0), ":seq": codec.N(p.LastSeq)}
	if p.Status == "" {
		p.Status = "released"
	}
	set, vals = withStatus(set, vals, p, now)
	_, err := s.ownerWrite(ctx, "release", l, set+" REMOVE #o", vals, func(c codec.Connection) bool {
		return c.LeaseOwner == "" && c.LeaseVersion == l.Version && c.LeaseExpiresAtMs == 0 && c.LastSeq == p.LastSeq
	})
	return err
}

func withStatus(set string, vals map[string]types.AttributeValue, p Progress, now int64) (string, map[string]types.AttributeValue) {
	if p.Status == "" {
		return set, vals
	}
	set += ", #st = :st, #sa = :now, #se = :se"
	vals[":st"], vals[":now"], vals[":se"] = codec.S(p.Status), codec.N(now), codec.S(p.Error)
	return set, vals
}

// ownerWrite runs an update conditioned on owner and version. done recognises the
// item as it is after our write, for when a retry or read-back finds it applied.
func (s *Store) ownerWrite(ctx context.Context, op string, l Lease, update string,
	vals map[string]types.AttributeValue, done func(codec.Connection) bool) (codec.Connection, error) {
	if err := validIDs(l.ID, l.Owner); err != nil {
		return codec.Connection{}, fmt.Errorf("%s %s: %w", op, l.ID, err)
	}
	vals[":me"], vals[":v"] = codec.S(l.Owner), codec.N(l.Version)
	in := &dynamodb.UpdateItemInput{
		TableName:           &s.cfg.Table,
		Key:                 key(l.ID),
		UpdateExpression:    aws.String(update),
		ConditionExpression: aws.String("attribute_exists(#pk) AND #o = :me AND #v = :v"),
		ExpressionAttributeNames: names("#pk", schema.AttrPK, "#o", schema.AttrLeaseOwner, "#e", schema.AttrLeaseExpires,
			"#v", schema.AttrLeaseVersion, "#ls", schema.AttrLastSeq),
		ExpressionAttributeValues:           vals,
		ReturnValues:                        types.ReturnValueAllNew,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}
	if _, ok := vals[":st"]; ok {
		in.ExpressionAttributeNames["#st"] = schema.AttrStatus
		in.ExpressionAttributeNames["#sa"] = schema.AttrStatusAt
		in.ExpressionAttributeNames["#se"] = schema.AttrStatusError
	}
	item, err := s.update(ctx, in)
	if err == nil {
		c, _ := codec.DecodeConnection(item) // an operator's bad edit is the caller's to see in c
		return c, nil
	}
	cur, cerr := s.resolve(ctx, l.ID, err)
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
	default:
		return codec.Connection{}, fmt.Errorf("%s %s: %w (now %q version %d, had version %d)",
			op, l.ID, ErrLost, cur.LeaseOwner, cur.LeaseVersion, l.Version)
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
	cur, cerr := s.resolve(ctx, id, err)
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
			cur, err := s.get(ctx, id)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if cur.LeaseOwner != worker {
				continue // index lag: released or re-acquired since
			}
			err = s.Release(ctx, Lease{ID: id, Owner: worker, Version: cur.LeaseVersion}, Progress{LastSeq: cur.LastSeq, Status: "owner stopped"})
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
	c, err := s.get(ctx, id)
	if err == nil && c.ID == "" {
		return c, fmt.Errorf("get %s: %w", id, ErrNotFound)
	}
	return c, err
}

// get returns the item (zero Connection if absent). A decode error is not returned:
// the lease fields are what lease operations need, and they are kept regardless.
func (s *Store) get(ctx context.Context, id string) (codec.Connection, error) {
	out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{TableName: &s.cfg.Table, Key: key(id), ConsistentRead: aws.Bool(true)})
	if err != nil {
		return codec.Connection{}, fmt.Errorf("read %s: %w", id, translate(err))
	}
	if out.Item == nil {
		return codec.Connection{}, nil
	}
	c, _ := codec.DecodeConnection(out.Item)
	c.ID = id
	return c, nil
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
func (s *Store) resolve(ctx context.Context, id string, err error) (codec.Connection, error) {
	var cf conditionFailed
	if errors.As(err, &cf) {
		if cf.item == nil {
			return codec.Connection{}, nil
		}
		c, _ := codec.DecodeConnection(cf.item)
		c.ID = id
		return c, nil
	}
	var api smithy.APIError
	if errors.As(err, &api) && api.ErrorFault() == smithy.FaultClient && !retryableCode(api.ErrorCode()) {
		return codec.Connection{}, fmt.Errorf("%w: %s", ErrInvalid, api.ErrorMessage()) // refused before applying
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ReadBackTimeout)
	defer cancel()
	c, rerr := s.get(rctx, id)
	if rerr != nil {
		return codec.Connection{}, fmt.Errorf("%w: write: %v; read-back: %v", ErrUnavailable, translateMsg(err), rerr)
	}
	return c, nil
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
