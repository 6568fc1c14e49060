package lease

import (
	"context"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

// noteRepair records a repair found at acquire on the item: status_error and
// last_repair carry note, and an unusable last_seq (seq is what was read) is reset to
// 0, only if it is still exactly that value.
func (s *Store) noteRepair(ctx context.Context, l Lease, seq types.AttributeValue, note string) error {
	now := s.nowMs()
	set := codec.Item{schema.AttrStatusError: codec.S(note), schema.AttrLastRepair: codec.S(repairNote(now, note))}
	cond := expression.And(nameOwner.Equal(str(l.Owner)), nameVersion.Equal(num(l.Version)))
	if _, err := codec.Int(codec.Item{schema.AttrLastSeq: seq}, schema.AttrLastSeq); err != nil {
		set[schema.AttrLastSeq] = codec.N(0)
		cond = expression.And(cond, valueIs(name(schema.AttrLastSeq), seq))
	}
	if _, err := s.write(ctx, l.ID, setAll(set), cond, types.ReturnValueNone); err != nil {
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
//   - the item shows a lease no session can be running under: a version below l's
//     (versions strictly increase per connection, so whoever was given a lower
//     version had ended that session before l was acquired or transferred — the
//     older session's release or transfer is what made l's acquire possible), or
//     l's own version under another owner, or with the owner deleted but the lease
//     not released (a release writes expiry 0 and removes the owner; l is l's
//     alone, since versions never repeat). Only an outside write makes such an item
//     (a stale whole-item image, a hand-edited or deleted lease_owner): the lease is
//     taken back, whatever owner the item names and whether or not it looks
//     expired. An unowned item at l's version with expiry 0 is l released (by its
//     owner, the sweep or the crash path) and stays released.
func (s *Store) ownerRepair(ctx context.Context, l Lease, raw codec.Item) (bool, error) {
	if raw == nil {
		return false, nil
	}
	now := s.nowMs()
	owner, _ := raw[schema.AttrLeaseOwner].(*types.AttributeValueMemberS)
	rawV := raw[schema.AttrLeaseVersion]
	v, verr := codec.Int(raw, schema.AttrLeaseVersion)
	var note string
	set := codec.Item{schema.AttrLeaseVersion: codec.N(l.Version)}
	var conds []expression.ConditionBuilder
	switch {
	case owner != nil && owner.Value == l.Owner && (rawV == nil || verr != nil):
		note = fmt.Sprintf("%s %s on the lease of %s: restored to %d", schema.AttrLeaseVersion, codec.Describe(rawV), l.Owner, l.Version)
		conds = append(conds, nameOwner.Equal(str(l.Owner)))
	case verr == nil && rawV != nil && (v < l.Version || (v == l.Version && owner != nil && owner.Value != l.Owner) ||
		(v == l.Version && owner == nil && s.heldByMember(raw))):
		note = fmt.Sprintf("stale image: %s %s at version %d replaced the lease of %s at version %d; reclaimed",
			schema.AttrLeaseOwner, codec.Describe(raw[schema.AttrLeaseOwner]), v, l.Owner, l.Version)
		set[schema.AttrLeaseOwner], set[schema.AttrLeaseExpires] = codec.S(l.Owner), codec.N(s.expiry(now))
		conds = append(conds, valueIs(nameOwner, raw[schema.AttrLeaseOwner]), valueIs(nameExpires, raw[schema.AttrLeaseExpires]))
	default:
		return false, nil
	}
	set[schema.AttrStatusError], set[schema.AttrLastRepair] = codec.S(note), codec.S(repairNote(now, note))
	conds = append(conds, valueIs(nameVersion, rawV))
	_, err := s.write(ctx, l.ID, setAll(set).Remove(nameUnheld), all(append([]expression.ConditionBuilder{namePK.AttributeExists()}, conds...)...),
		types.ReturnValueNone)
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
func (s *Store) releaseUnusable(ctx context.Context, id, owner string, raw codec.Item, cond expression.ConditionBuilder,
	status string) error {
	now := s.nowMs()
	fresh := now + s.cfg.SkewMargin.Milliseconds()
	rawV := raw[schema.AttrLeaseVersion]
	note := fmt.Sprintf("%s %s on the lease of %s: released with version %d", schema.AttrLeaseVersion, codec.Describe(rawV), owner, fresh)
	_, err := s.write(ctx, id, repairedRelease(ctx, fresh, status, now, note), all(heldBy(owner, valueIs(nameVersion, rawV)), cond),
		types.ReturnValueNone)
	switch {
	case err == nil:
		return nil
	case isCondition(err):
		return fmt.Errorf("release %s (unusable version): %w", id, ErrLost)
	default:
		return fmt.Errorf("release %s (unusable version): %w", id, translate(err))
	}
}

// repairedRelease is the update of a release that repairs the lease: owner removed,
// lease_expires_at_ms 0, a fresh version, status (stamped now), and note in
// status_error and last_repair.
func repairedRelease(ctx context.Context, fresh int64, status string, now int64, note string) expression.UpdateBuilder {
	return setAll(traced(ctx, codec.Item{
		schema.AttrLeaseExpires: codec.N(0), schema.AttrLeaseVersion: codec.N(fresh),
		schema.AttrStatus: codec.S(status), schema.AttrStatusAt: codec.N(now),
		schema.AttrStatusError: codec.S(note), schema.AttrLastRepair: codec.S(repairNote(now, note)),
	})).Remove(nameOwner)
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

// heldByMember: raw's expiry is the one only a stream-mode acquire or reclaim writes
// (schema.LeaseHeldByMember); every release writes another.
func (s *Store) heldByMember(raw codec.Item) bool {
	e, err := codec.Int(raw, schema.AttrLeaseExpires)
	return s.cfg.Membership && err == nil && raw[schema.AttrLeaseExpires] != nil && e == schema.LeaseHeldByMember
}
