package registry

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

// Membership errors. Callers branch on them with errors.Is.
var (
	// ErrNotMember: the item is absent, declared dead, or holds another incarnation.
	// A worker that gets it must stop every connection and exit.
	ErrNotMember = errors.New("not a member")
	// ErrInUse: Join found the id held by an item whose lease has not lapsed beyond
	// the skew margin (another incarnation, or a tombstone, may still be running).
	ErrInUse = errors.New("worker id in use")
)

// TombstoneLease is the lease a tombstone carries: a worker whose item was absent may
// still be streaming until its fence deadline, which its configuration keeps within
// MaxMemberLease of its last successful renew (worker config validates it). The
// tombstone's connections are released only once this lease has lapsed beyond the
// skew margin, by which time such a worker has stopped.
const (
	MaxMemberLease = time.Duration(schema.MaxMemberLeaseSeconds) * time.Second
	TombstoneLease = MaxMemberLease
)

// Join writes w as a new incarnation: only if no item exists, or the existing item's
// lease lapsed more than skew before now (its previous holder has self-fenced). It
// reports whether it replaced an item: the caller must then release whatever
// connections still name w.ID as owner, as nobody else will.
func (r *Registry) Join(ctx context.Context, w codec.Worker, now time.Time, skew time.Duration) (replaced bool, err error) {
	if err := validMember(w); err != nil {
		return false, fmt.Errorf("join: %w", err)
	}
	w.DeadAtMs = 0
	w.TTL = time.UnixMilli(w.HeartbeatExpiresAtMs).Add(TTLGrace).Unix()
	out, err := r.DB.PutItem(ctx, &dynamodb.PutItemInput{
		TableName:                &r.Table,
		Item:                     codec.EncodeWorker(w),
		ConditionExpression:      aws.String("attribute_not_exists(#pk) OR #h < :stale"),
		ExpressionAttributeNames: map[string]string{"#pk": schema.AttrPK, "#h": schema.AttrHeartbeatExpires},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":stale": codec.N(now.Add(-skew).UnixMilli()),
		},
		ReturnValues:                        types.ReturnValueAllOld,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	var ccf *types.ConditionalCheckFailedException
	switch {
	case errors.As(err, &ccf):
		old, _ := codec.DecodeWorker(ccf.Item)
		return false, fmt.Errorf("join %s: %w (incarnation %q, lease until %d, now %d)",
			w.ID, ErrInUse, old.Incarnation, old.HeartbeatExpiresAtMs, now.UnixMilli())
	case err != nil:
		return false, fmt.Errorf("join %s: %w", w.ID, err)
	}
	return len(out.Attributes) > 0, nil
}

// Renew extends w's membership lease and refreshes its address, capacity, load and
// draining flag, only if the item holds w.Incarnation and was not declared dead.
// ErrNotMember means it does not: the worker must stop everything and exit. Any other
// error leaves the outcome unknown, and the caller must count the renew as failed.
//
// It never writes the registry index's key (Join did), and the index projects only
// keys, so a renew writes the item alone: 1 write unit while the item is under 1 KB.
func (r *Registry) Renew(ctx context.Context, w codec.Worker) error {
	if err := validMember(w); err != nil {
		return fmt.Errorf("renew membership: %w", err)
	}
	ttl := time.UnixMilli(w.HeartbeatExpiresAtMs).Add(TTLGrace).Unix()
	_, err := r.DB.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:           &r.Table,
		Key:                 workerKey(w.ID),
		UpdateExpression:    aws.String("SET #a = :a, #c = :c, #l = :l, #dr = :dr, #h = :h, #ttl = :ttl"),
		ConditionExpression: aws.String("#inc = :inc AND attribute_not_exists(#dead)"),
		ExpressionAttributeNames: map[string]string{
			"#a": schema.AttrAddr, "#c": schema.AttrCapacity, "#l": schema.AttrLoad, "#dr": schema.AttrDraining,
			"#h": schema.AttrHeartbeatExpires, "#ttl": schema.AttrTTL,
			"#inc": schema.AttrIncarnation, "#dead": schema.AttrDeadAt,
		},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":a": codec.S(w.Addr), ":c": codec.N(int64(w.Capacity)), ":l": codec.N(int64(w.Load)),
			":dr": &types.AttributeValueMemberBOOL{Value: w.Draining}, ":h": codec.N(w.HeartbeatExpiresAtMs),
			":ttl": codec.N(ttl), ":inc": codec.S(w.Incarnation),
		},
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	var ccf *types.ConditionalCheckFailedException
	switch {
	case errors.As(err, &ccf):
		return fmt.Errorf("renew membership %s: %w: %s", w.ID, ErrNotMember, whyNotMember(ccf.Item, w.Incarnation))
	case err != nil:
		return fmt.Errorf("renew membership %s: %w", w.ID, err)
	}
	return nil
}

func whyNotMember(it codec.Item, inc string) string {
	if it == nil {
		return "item absent"
	}
	old, _ := codec.DecodeWorker(it)
	switch {
	case old.Dead():
		return fmt.Sprintf("declared dead at %d", old.DeadAtMs)
	default:
		return fmt.Sprintf("incarnation %q, not %q", old.Incarnation, inc)
	}
}

// Leave marks worker id's item as gone at now, if it still holds incarnation inc
// (the end of a drain, once every connection was stopped and released). The item
// stays, dead and lapsed, until its TTL: an owner that is known to be gone lets the
// reconciler release at once whatever still names it (a console save of an old
// image, say), where an absent owner would need a tombstone's wait. An item that
// holds another incarnation, or is gone, is left alone.
func (r *Registry) Leave(ctx context.Context, id, inc string, now time.Time) error {
	_, err := r.DB.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:           &r.Table,
		Key:                 workerKey(id),
		UpdateExpression:    aws.String("SET #dead = :now, #h = :now, #ttl = :ttl, #dr = :t"),
		ConditionExpression: aws.String("#inc = :inc"),
		ExpressionAttributeNames: map[string]string{"#inc": schema.AttrIncarnation, "#dead": schema.AttrDeadAt,
			"#h": schema.AttrHeartbeatExpires, "#ttl": schema.AttrTTL, "#dr": schema.AttrDraining},
		ExpressionAttributeValues: map[string]types.AttributeValue{":inc": codec.S(inc), ":now": codec.N(now.UnixMilli()),
			":ttl": codec.N(now.Add(TTLGrace).Unix()), ":t": &types.AttributeValueMemberBOOL{Value: true}},
	})
	var ccf *types.ConditionalCheckFailedException
	if err != nil && !errors.As(err, &ccf) {
		return fmt.Errorf("leave %s: %w", id, err)
	}
	return nil
}

// Gone marks worker id dead as of now: its process is known to have exited (the
// container stopped), so nothing it owns is being streamed and its connections may
// be released once the skew margin has passed. Whatever item was there is replaced.
func (r *Registry) Gone(ctx context.Context, id string, now time.Time) error {
	if err := schema.ValidateID(id); err != nil {
		return fmt.Errorf("worker gone: %w", err)
	}
	it := codec.EncodeWorker(codec.Worker{ID: id, HeartbeatExpiresAtMs: now.UnixMilli(), DeadAtMs: now.UnixMilli(),
		TTL: now.Add(TTLGrace).Unix()})
	delete(it, schema.AttrAddr)
	if _, err := r.DB.PutItem(ctx, &dynamodb.PutItemInput{TableName: &r.Table, Item: it}); err != nil {
		return fmt.Errorf("worker %s gone: %w", id, err)
	}
	return nil
}

// DeclareDead marks w dead, only if its item still holds w's incarnation, is not
// dead already, and its lease lapsed more than skew before now. It reports whether it
// wrote; false means the member renewed, left or changed meanwhile.
func (r *Registry) DeclareDead(ctx context.Context, w codec.Worker, now time.Time, skew time.Duration) (bool, error) {
	cond := "attribute_exists(#pk) AND attribute_not_exists(#dead) AND #h < :stale AND "
	vals := map[string]types.AttributeValue{
		":stale": codec.N(now.Add(-skew).UnixMilli()), ":now": codec.N(now.UnixMilli()),
	}
	if w.Incarnation == "" {
		cond += "attribute_not_exists(#inc)"
	} else {
		cond += "#inc = :inc"
		vals[":inc"] = codec.S(w.Incarnation)
	}
	_, err := r.DB.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:           &r.Table,
		Key:                 workerKey(w.ID),
		UpdateExpression:    aws.String("SET #dead = :now"),
		ConditionExpression: aws.String(cond),
		ExpressionAttributeNames: map[string]string{"#pk": schema.AttrPK, "#dead": schema.AttrDeadAt,
			"#h": schema.AttrHeartbeatExpires, "#inc": schema.AttrIncarnation},
		ExpressionAttributeValues: vals,
	})
	var ccf *types.ConditionalCheckFailedException
	switch {
	case errors.As(err, &ccf):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("declare %s dead: %w", w.ID, err)
	}
	return true, nil
}

// Tombstone writes a dead member item for worker id, only if no item exists: id owns
// connections but is not in the registry. The tombstone's lease runs TombstoneLease
// from now, so its connections are released only once a worker that was still
// streaming without an item must have self-fenced; and from now on that worker's
// renews fail, so it exits. It reports whether it wrote.
func (r *Registry) Tombstone(ctx context.Context, id string, now time.Time) (bool, error) {
	if err := schema.ValidateID(id); err != nil {
		return false, fmt.Errorf("tombstone: %w", err)
	}
	exp := now.Add(TombstoneLease)
	it := codec.EncodeWorker(codec.Worker{ID: id, HeartbeatExpiresAtMs: exp.UnixMilli(), DeadAtMs: now.UnixMilli(),
		TTL: exp.Add(TTLGrace).Unix()})
	delete(it, schema.AttrAddr)
	_, err := r.DB.PutItem(ctx, &dynamodb.PutItemInput{
		TableName:                &r.Table,
		Item:                     it,
		ConditionExpression:      aws.String("attribute_not_exists(#pk)"),
		ExpressionAttributeNames: map[string]string{"#pk": schema.AttrPK},
	})
	var ccf *types.ConditionalCheckFailedException
	switch {
	case errors.As(err, &ccf):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("tombstone %s: %w", id, err)
	}
	return true, nil
}

// Releasable reports whether a dead member's connections may be released at now:
// its lease lapsed more than skew ago, so it has stopped streaming.
func Releasable(w codec.Worker, now time.Time, skew time.Duration) bool {
	return w.HeartbeatExpiresAtMs < now.Add(-skew).UnixMilli()
}

func validMember(w codec.Worker) error {
	if err := schema.ValidateID(w.ID); err != nil {
		return err
	}
	if w.Incarnation == "" || w.Addr == "" {
		return fmt.Errorf("%w worker %s: incarnation and address are required", schema.ErrInvalid, w.ID)
	}
	return nil
}

func workerKey(id string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{schema.AttrPK: codec.S(schema.WorkerKey(id))}
}
