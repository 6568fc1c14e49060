package lease

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

// Acquire takes connection id for worker and returns the lease with the item's
// ws_url and last_seq. The new lease_version comes from a hybrid logical clock: at
// least the stored version + 1 and at least the wall clock in ms (see package doc).
//
// The common case is one write: the wall-clock floor, conditioned on the stored
// version being below it. If the condition failed only because of the version (it is
// at or above the floor, or an operator made it unusable) a second write follows,
// conditioned on the version exactly as it was read.
func (s *Store) Acquire(ctx context.Context, id, worker string) (Lease, error) {
	return s.AcquireAbove(ctx, id, worker, 0)
}

// AcquireAbove is Acquire writing a version above floor too: a version the caller
// knows was issued for this connection (a wakeup's, from a stream record's old
// image), which an outside write may have rolled the item back below. It closes
// the window in which a clock lagging the issuer's could hand out a version below
// one already issued (see package doc). floor 0: none.
func (s *Store) AcquireAbove(ctx context.Context, id, worker string, floor int64) (Lease, error) {
	return s.acquire(ctx, id, worker, floor, 0)
}

// AcquireUnheld is Acquire of a lease that has carried the reconciler's mark
// (unheld_since_ms, schema.AttrUnheldSince) since sinceMs or earlier: an acquire
// that no stream record drove (the start-up pass). Such an acquirer cannot tell a
// release from a stale released image written back over a live holder's lease, and
// the mark is how the reconciler tells them apart too: written on an unowned item,
// removed by any acquire or reclaim, so a mark older than the longest a holder takes
// to find an edit (its checkpoint or backstop read) says nobody is taking the lease
// back. A free lease without such a mark is refused with ErrHeld.
func (s *Store) AcquireUnheld(ctx context.Context, id, worker string, sinceMs int64) (Lease, error) {
	if sinceMs <= 0 {
		return Lease{}, fmt.Errorf("acquire %s: %w: unheld since %d", id, ErrInvalid, sinceMs)
	}
	return s.acquire(ctx, id, worker, 0, sinceMs)
}

// acquire is AcquireAbove; with unheldMs > 0, AcquireUnheld too.
func (s *Store) acquire(ctx context.Context, id, worker string, floor, unheldMs int64) (Lease, error) {
	if err := validIDs(id, worker); err != nil {
		return Lease{}, fmt.Errorf("acquire %s: %w", id, err)
	}
	if floor < 0 {
		return Lease{}, fmt.Errorf("acquire %s: %w: negative version floor %d", id, ErrInvalid, floor)
	}
	now := s.nowMs()
	first := max(now, floor+1)
	try := versionTry{version: first, cond: expression.Or(nameVersion.AttributeNotExists(), nameVersion.LessThan(num(first)))}
	var extra expression.ConditionBuilder
	if unheldMs > 0 {
		extra = unheldSince(unheldMs)
	}
	for attempt := 0; ; attempt++ {
		try.cond = all(try.cond, extra)
		it, old, err := s.acquireOnce(ctx, id, worker, now, try)
		if err == nil {
			return s.acquired(ctx, id, worker, it, old, try.note != "")
		}
		next, retry := s.versionRetry(old, now, first)
		if unheldMs > 0 && errors.Is(err, ErrHeld) && !markedSince(old, unheldMs) && free(old, now-s.cfg.SkewMargin.Milliseconds()) {
			return Lease{}, fmt.Errorf("acquire %s: %w: free, but not marked %s at %d or earlier", id, ErrHeld, schema.AttrUnheldSince, unheldMs)
		}
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
	cond    expression.ConditionBuilder
	note    string // a repair to record, naming the field and its value
}

// acquireOnce makes one acquire write. It returns the item as it is after the write,
// and the item as it was before it when known; on a refusal, the item as it was.
func (s *Store) acquireOnce(ctx context.Context, id, worker string, now int64, try versionTry) (after, before codec.Item, err error) {
	exp := s.expiry(now)
	set := codec.Item{
		schema.AttrLeaseOwner: codec.S(worker), schema.AttrLeaseExpires: codec.N(exp), schema.AttrLeaseVersion: codec.N(try.version),
		schema.AttrStatus: codec.S(StatusAcquired), schema.AttrStatusAt: codec.N(now),
	}
	if try.note != "" {
		set[schema.AttrStatusError], set[schema.AttrLastRepair] = codec.S(try.note), codec.S(repairNote(now, try.note))
	}
	upd := setAll(set).Remove(nameUnheld)
	if try.note == "" {
		upd = upd.Remove(nameStatusError)
	}
	in, err := s.updateInput(id, upd, all(startedCondition(), FreeCondition(now-s.cfg.SkewMargin.Milliseconds()), try.cond),
		types.ReturnValueAllOld)
	if err != nil {
		return nil, nil, fmt.Errorf("acquire %s: %w", id, err)
	}
	old, err := s.update(ctx, in)
	if err == nil {
		after := make(codec.Item, len(old)+len(set))
		maps.Copy(after, old)
		delete(after, schema.AttrUnheldSince)
		if try.note == "" {
			delete(after, schema.AttrStatusError)
		}
		maps.Copy(after, set)
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
	case cerr != nil && !isCondition(err) && errors.Is(cerr, ErrUnavailable):
		// The write may have landed, naming us: say so, with what tells it apart.
		return nil, nil, &AmbiguousAcquire{StampMs: now, err: fmt.Errorf("acquire %s: %w", id, cerr)}
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
// or above first (the first try's version); for an unusable one (a string, a
// non-integer), a fresh floor raised by the skew margin (the destroyed value cannot
// be read, and a version handed out by a worker whose clock runs ahead by up to the
// margin stays below it), and above first.
func (s *Store) versionRetry(old codec.Item, now, first int64) (versionTry, bool) {
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
	case err == nil && v >= first:
		return versionTry{version: v + 1, cond: nameVersion.Equal(expression.Value(raw))}, true
	case err == nil:
		return versionTry{}, false
	}
	fresh := max(now+s.cfg.SkewMargin.Milliseconds(), first)
	t := versionTry{version: fresh, note: fmt.Sprintf("%s %s unusable: replaced with %d", schema.AttrLeaseVersion, codec.Describe(raw), fresh)}
	t.cond = valueIs(nameVersion, raw)
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
