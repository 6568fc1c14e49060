package lease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

// Writes by others than the owner: the sweep's release of an expired lease, the
// release of a stale image's lease, the crash path's release of a dead worker's
// leases, and the sweep's report on an unusable item. Each is conditioned on the
// item being exactly what the caller judged.

// ReleaseExpired is the sweep's release: it succeeds only if the lease is still
// owner's at version and expired more than the skew margin before now.
func (s *Store) ReleaseExpired(ctx context.Context, id, owner string, version int64, now time.Time) error {
	if err := validIDs(id, owner); err != nil {
		return fmt.Errorf("release expired %s: %w", id, err)
	}
	stale := now.UnixMilli() - s.cfg.SkewMargin.Milliseconds()
	upd := setAll(traced(ctx, codec.Item{
		schema.AttrLeaseExpires: codec.N(0), schema.AttrStatus: codec.S("expired"), schema.AttrStatusAt: codec.N(now.UnixMilli()),
	})).Remove(nameOwner)
	in, err := s.updateInput(id, upd, all(heldBy(owner, nameVersion.Equal(num(version))), expiredBefore(stale)), types.ReturnValueNone)
	if err != nil {
		return fmt.Errorf("release expired %s: %w", id, err)
	}
	_, err = s.update(ctx, in)
	if err == nil {
		return nil
	}
	cur, raw, cerr := s.resolve(ctx, id, err)
	if cerr == nil && isCondition(err) && cur.LeaseOwner == owner && unusableVersion(raw) {
		// The version cannot be matched: release on owner and expiry, and the version
		// exactly as it is, writing a fresh one (as an acquire would).
		return s.releaseUnusable(ctx, id, owner, raw, expiredBefore(stale), "expired")
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
	note := fmt.Sprintf("%s %q at version %d runs no session (a stale image, a hand-made item or a hand-edited lease); released with version %d",
		schema.AttrLeaseOwner, owner, version, fresh)
	atVersion := nameVersion.Equal(num(version))
	if version == 0 { // what a record shows for an absent or unusable version
		atVersion = expression.Or(nameVersion.AttributeNotExists(), atVersion, expression.Not(nameVersion.AttributeType(expression.Number)))
	}
	_, err := s.write(ctx, id, repairedRelease(ctx, fresh, "repaired", now, note), heldBy(owner, atVersion), types.ReturnValueNone)
	switch {
	case err == nil:
		return nil
	case isCondition(err):
		return fmt.Errorf("release stale %s: %w", id, ErrLost)
	default:
		return fmt.Errorf("release stale %s: %w", id, translate(err))
	}
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
	upd := setAll(codec.Item{
		schema.AttrStatus: codec.S("invalid"), schema.AttrStatusAt: codec.N(s.nowMs()), schema.AttrStatusError: codec.S(problem),
	})
	cond := expression.And(namePK.AttributeExists(), ReleasedCondition(),
		expression.Or(nameStatusError.AttributeNotExists(), nameStatusError.NotEqual(str(problem))))
	_, err := s.write(ctx, id, upd, cond, types.ReturnValueNone)
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
	return s.releaseOwnedBy(ctx, worker, 0)
}

// ReleaseAllOwnedByAfter is ReleaseAllOwnedBy for a worker that died a while ago (the
// dead-member pass's retries, an owner the sweep found): a lease naming it now may be
// a stale image written back over a live holder's lease, which the table cannot tell
// from a lease the dead worker left. So each lease is released only once it has
// carried, for at least hold, a mark (unheld_since_ms) this call wrote under the same
// owner and version; a first call writes the mark and releases nothing. A holder
// whose version is above the image's takes the lease back at its next owner write
// (see the package doc), which changes the owner and removes the mark; with hold at
// least that holder's detection bound (its backstop interval and a renew tick), the
// release finds no holder left to overlap.
func (s *Store) ReleaseAllOwnedByAfter(ctx context.Context, worker string, hold time.Duration) ([]string, error) {
	if hold <= 0 {
		return nil, fmt.Errorf("release all of %s after %s: %w: hold must be positive", worker, hold, ErrInvalid)
	}
	return s.releaseOwnedBy(ctx, worker, hold)
}

func (s *Store) releaseOwnedBy(ctx context.Context, worker string, hold time.Duration) ([]string, error) {
	if err := schema.ValidateID(worker); err != nil {
		return nil, fmt.Errorf("release all of %s: %w", worker, err)
	}
	var released []string
	var errs []error
	_, err := OwnedBy(ctx, s.db, s.cfg.Table, worker, func(ids []string) {
		for _, id := range ids {
			cur, raw, err := s.get(ctx, id)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if cur.LeaseOwner != worker {
				continue // index lag: released or re-acquired since
			}
			switch {
			case unusableVersion(raw):
				err = s.releaseUnusable(ctx, id, worker, raw, expression.ConditionBuilder{}, "owner stopped")
			case hold > 0:
				var done bool
				done, err = s.releaseMarked(ctx, id, worker, cur.LeaseVersion, raw, hold)
				if err == nil && !done {
					continue
				}
			default:
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
	})
	if err != nil {
		return released, fmt.Errorf("release all of %s: query: %w", worker, err)
	}
	return released, errors.Join(errs...)
}

// releaseMarked releases worker's lease on id at version if it carries a mark at
// least hold old (raw is the item as read), or marks it; it reports whether it
// released. Both writes are conditioned on owner, version and the mark as read.
func (s *Store) releaseMarked(ctx context.Context, id, worker string, version int64, raw codec.Item, hold time.Duration) (bool, error) {
	now := s.nowMs()
	mark, merr := codec.Int(raw, schema.AttrUnheldSince)
	cond := all(heldBy(worker, nameVersion.Equal(num(version))), valueIs(nameUnheld, raw[schema.AttrUnheldSince]))
	var upd expression.UpdateBuilder
	release := raw[schema.AttrUnheldSince] != nil && merr == nil && mark > 0 && now-mark >= hold.Milliseconds() && mark <= now
	if release {
		upd = setAll(codec.Item{schema.AttrLeaseExpires: codec.N(0), schema.AttrStatus: codec.S("owner stopped"),
			schema.AttrStatusAt: codec.N(now)}).Remove(nameOwner).Remove(nameUnheld)
	} else {
		if raw[schema.AttrUnheldSince] != nil && merr == nil && mark > 0 && mark <= now {
			return false, nil // marked, not long enough ago
		}
		upd = setAll(codec.Item{schema.AttrUnheldSince: codec.N(now)})
	}
	_, err := s.write(ctx, id, upd, cond, types.ReturnValueNone)
	switch {
	case err == nil:
		return release, nil
	case isCondition(err):
		return false, fmt.Errorf("release %s of %s: %w", id, worker, ErrLost)
	default:
		return false, fmt.Errorf("release %s of %s: %w", id, worker, translate(err))
	}
}

// MarkUnheld restarts the unheld mark (unheld_since_ms = now) of an unowned lease
// at exactly version: what the reconciler does when a record shows a stale image
// left the item unowned over a holder's lease. The image carries the mark it had
// when it was saved, which may be old enough for the start-up pass and the sweep's
// nudge to take it at once, before the displaced holder's next owner write takes it
// back. Restarted, the mark holds every acquire but a wakeup's for the hold: longer
// than the holder takes (docs/MEMBERSHIP.md). ErrLost: the item changed since (the
// holder took it back, or a worker acquired it).
func (s *Store) MarkUnheld(ctx context.Context, id string, version int64, now time.Time) error {
	cond := expression.And(namePK.AttributeExists(), nameOwner.AttributeNotExists(), nameVersion.Equal(num(version)))
	_, err := s.write(ctx, id, setAll(codec.Item{schema.AttrUnheldSince: codec.N(now.UnixMilli())}), cond, types.ReturnValueNone)
	if isCondition(err) {
		return fmt.Errorf("mark %s unheld at version %d: %w", id, version, ErrLost)
	}
	if err != nil {
		return fmt.Errorf("mark %s unheld: %w", id, err)
	}
	return nil
}
