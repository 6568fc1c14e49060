package lease

import (
	"context"
	"fmt"

	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

// StatusHandedOff is the status a Transfer writes: the lease was handed to its new
// owner by the old one (status_error says from whom, at which version).
const StatusHandedOff = "handed_off"

// Transfer hands l to worker to in one write, conditioned on lease_owner = l.Owner AND
// lease_version = l.Version AND desired_state = STARTED (docs/HANDOFF.md): owner = to,
// a new fencing version from the same hybrid logical clock as Acquire (at least
// l.Version + 1 and at least the wall clock in ms), last_seq and epoch from p,
// moved_at_ms = now when rebalance (a rebalance move starts the connection's cooling
// period; a forced move — a drain — leaves moved_at_ms as it was), status handed_off, and the expiry an acquire writes (in stream
// mode schema.LeaseHeldByMember: the lease lasts as long as to's membership). It
// returns the new lease, as to holds it.
//
// The caller must have stopped delivering at p.LastSeq before calling: from the write
// on, only to may deliver. ErrLost: not l's owner at l.Version any more (nothing
// written); ErrNotStarted: the connection was stopped (nothing written: release it as
// for any stop); ErrUnavailable: the outcome is unknown even after a read-back, and
// the caller must assume neither owner holds it safely (see docs/HANDOFF.md).
// An ambiguous outcome is resolved by reading the item back; an operator's edit of
// the lease fields is repaired as for every owner write.
func (s *Store) Transfer(ctx context.Context, l Lease, to string, p Progress, rebalance bool) (Lease, error) {
	if err := validIDs(l.ID, to); err != nil {
		return Lease{}, fmt.Errorf("transfer %s: %w", l.ID, err)
	}
	if to == l.Owner {
		return Lease{}, fmt.Errorf("transfer %s: %w: to its own owner %s", l.ID, ErrInvalid, to)
	}
	now := s.nowMs()
	nv := max(l.Version+1, now)
	exp := s.expiry(now)
	note := fmt.Sprintf("handed off from %s (version %d)", l.Owner, l.Version)
	set := traced(ctx, progress(codec.Item{
		schema.AttrLeaseOwner: codec.S(to), schema.AttrLeaseVersion: codec.N(nv), schema.AttrLeaseExpires: codec.N(exp),
	}, Progress{LastSeq: p.LastSeq, Epoch: p.Epoch, Status: StatusHandedOff, Error: note}, now))
	if rebalance {
		set[schema.AttrMovedAt] = codec.N(now)
	}
	started := nameState.Equal(str(string(schema.Started)))
	c, err := s.ownerWriteIf(ctx, "transfer", l, setAll(set), started, func(c codec.Connection) bool {
		return c.LeaseOwner == to && c.LeaseVersion == nv && c.LastSeq == p.LastSeq
	})
	if err != nil {
		return Lease{}, err
	}
	return Lease{ID: l.ID, Owner: to, Version: nv, ExpiresAtMs: exp, WSURL: c.WSURL, LastSeq: p.LastSeq,
		Spec: c.Spec, Epoch: c.Epoch}, nil
}
