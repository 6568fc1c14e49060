package lease

import (
	"context"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/shared/tracing"
)

// Renew extends l, stores p's checkpoint, and returns the item as it now is, so the
// caller sees a STOPPED desired_state or a changed ws_url. ErrNotFound means the
// item was deleted; ErrLost means someone else holds it now.
func (s *Store) Renew(ctx context.Context, l Lease, p Progress) (codec.Connection, error) {
	now := s.nowMs()
	exp := now + s.cfg.Duration.Milliseconds()
	set := progress(codec.Item{schema.AttrLeaseExpires: codec.N(exp)}, p, now)
	return s.ownerWrite(ctx, "renew", l, setAll(set), func(c codec.Connection) bool {
		return c.LeaseOwner == l.Owner && c.LeaseVersion == l.Version && c.LeaseExpiresAtMs == exp
	})
}

// Checkpoint stores p's checkpoint (and status, if set) without touching the lease's
// expiry, and returns the item as it now is, like Renew. It is the owner's write in
// stream mode, where the lease lasts as long as the owner's membership. ErrNotFound
// means the item was deleted; ErrLost means someone else holds it now.
func (s *Store) Checkpoint(ctx context.Context, l Lease, p Progress) (codec.Connection, error) {
	now := s.nowMs()
	set := progress(codec.Item{}, p, now)
	if s.cfg.Membership {
		// The same value the acquire wrote: it puts back an expiry an operator deleted
		// or zeroed on a lease this owner still holds.
		set[schema.AttrLeaseExpires] = codec.N(s.expiry(now))
	}
	return s.ownerWrite(ctx, "checkpoint", l, setAll(set), func(c codec.Connection) bool {
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
	if p.Status == "" {
		p.Status = "released"
	}
	set := traced(ctx, progress(codec.Item{schema.AttrLeaseExpires: codec.N(exp)}, p, s.nowMs()))
	if p.Stop {
		set[schema.AttrDesiredState] = codec.S(string(schema.Stopped))
	}
	_, err := s.ownerWrite(ctx, "release", l, setAll(set).Remove(nameOwner), func(c codec.Connection) bool {
		return c.LeaseOwner == "" && c.LeaseVersion == l.Version && c.LeaseExpiresAtMs == exp && c.LastSeq == p.LastSeq
	})
	return err
}

// traced adds the traceparent of ctx's span to set as trace_parent, when there is
// one: a write that causes a stream record (a release, a transfer) carries what the
// reconciler's span for that record needs to join the trace, in the write itself.
func traced(ctx context.Context, set codec.Item) codec.Item {
	if tp := tracing.TraceParent(ctx); tp != "" {
		set[tracing.AttrTraceParent] = codec.S(tp)
	}
	return set
}

// progress adds what every owner write stores of p to set and returns it: last_seq,
// the epoch when not 0, and the status (stamped now) when p carries one.
func progress(set codec.Item, p Progress, now int64) codec.Item {
	set[schema.AttrLastSeq] = codec.N(p.LastSeq)
	if p.Epoch != 0 {
		set[schema.AttrEpoch] = codec.N(p.Epoch)
	}
	if p.Status != "" {
		set[schema.AttrStatus], set[schema.AttrStatusAt], set[schema.AttrStatusError] = codec.S(p.Status), codec.N(now), codec.S(p.Error)
	}
	return set
}

// ownerWrite runs an update conditioned on owner and version. done recognises the
// item as it is after our write, for when a retry or read-back finds it applied.
//
// When the condition fails because of an operator's edit that no acquire could have
// made, the lease is repaired once and the write retried (see ownerRepair).
func (s *Store) ownerWrite(ctx context.Context, op string, l Lease, upd expression.UpdateBuilder,
	done func(codec.Connection) bool) (codec.Connection, error) {
	return s.ownerWriteIf(ctx, op, l, upd, expression.ConditionBuilder{}, done)
}

// ownerWriteIf is ownerWrite with a further condition (cond; the zero value for
// none): a write refused by it alone, the lease still l's, is ErrNotStarted when cond
// is on the desired state (the only one used), else ErrLost.
func (s *Store) ownerWriteIf(ctx context.Context, op string, l Lease, upd expression.UpdateBuilder,
	cond expression.ConditionBuilder, done func(codec.Connection) bool) (codec.Connection, error) {
	if err := validIDs(l.ID, l.Owner); err != nil {
		return codec.Connection{}, fmt.Errorf("%s %s: %w", op, l.ID, err)
	}
	in, err := s.updateInput(l.ID, upd, all(ownerCondition(l), cond), types.ReturnValueAllNew)
	if err != nil {
		return codec.Connection{}, fmt.Errorf("%s %s: %w", op, l.ID, err)
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
		case cond.IsSet() && isCondition(err) && cur.LeaseOwner == l.Owner && cur.LeaseVersion == l.Version && !unusableVersion(raw):
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

// Renumber gives l a new fencing version, from the same hybrid logical clock as
// Acquire (at least l.Version + 1 and at least the wall clock in ms), storing p's
// checkpoint, in one write conditioned on l's owner and version, and returns the
// lease under its new version with the item as it now is. An owner that takes up a
// lease it did not acquire itself in this session (a phantom lease the table names
// it in, whatever wrote it) renumbers it, so that what it delivers carries a version
// no earlier session of the connection delivered under. ErrLost, ErrNotFound: as
// for Checkpoint.
func (s *Store) Renumber(ctx context.Context, l Lease, p Progress) (Lease, codec.Connection, error) {
	nv := max(l.Version+1, s.nowMs())
	set := progress(codec.Item{schema.AttrLeaseVersion: codec.N(nv)}, p, s.nowMs())
	c, err := s.ownerWrite(ctx, "renumber", l, setAll(set), func(c codec.Connection) bool {
		return c.LeaseOwner == l.Owner && c.LeaseVersion == nv && c.LastSeq == p.LastSeq
	})
	if err != nil {
		return Lease{}, codec.Connection{}, err
	}
	l.Version, l.LastSeq, l.WSURL, l.Spec = nv, p.LastSeq, c.WSURL, c.Spec
	return l, c, nil
}
