package lease

import (
	"context"
	"fmt"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

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

// Checkpoint stores p's checkpoint (and status, if set) without touching the lease's
// expiry, and returns the item as it now is, like Renew. It is the owner's write in
// stream mode, where the lease lasts as long as the owner's membership. ErrNotFound
// means the item was deleted; ErrLost means someone else holds it now.
func (s *Store) Checkpoint(ctx context.Context, l Lease, p Progress) (codec.Connection, error) {
	now := s.nowMs()
	set, vals := withStatus("SET #ls = :seq", map[string]types.AttributeValue{":seq": codec.N(p.LastSeq)}, p, now)
	return s.ownerWrite(ctx, "checkpoint", l, set, vals, func(c codec.Connection) bool {
		return c.LeaseOwner == l.Owner && c.LeaseVersion == l.Version && c.LastSeq == p.LastSeq
	})
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

// ownerCond is the owner-and-version condition, with cond if not empty.
func ownerCond(cond string) string {
	c := "attribute_exists(#pk) AND #o = :me AND #v = :v"
	if cond != "" {
		c += " AND " + cond
	}
	return c
}
