package lease

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

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

// unusableVersion: the item names an owner but its lease_version is absent or will
// not decode, so no owner-and-version condition can match it.
func unusableVersion(raw codec.Item) bool {
	if raw == nil || raw[schema.AttrLeaseOwner] == nil {
		return false
	}
	_, err := codec.Int(raw, schema.AttrLeaseVersion)
	return raw[schema.AttrLeaseVersion] == nil || err != nil
}

// repairNote is the last_repair value: when, and what.
func repairNote(nowMs int64, note string) string {
	return time.UnixMilli(nowMs).UTC().Format(time.RFC3339) + " " + note
}
