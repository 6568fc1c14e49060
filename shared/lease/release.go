package lease

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

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
