// Package lease takes, keeps and gives up connection leases with conditional writes.
//
// Two ways to hold a lease. In polling mode (the seed's design) a lease has an
// expiry and its owner renews it (Renew). In stream mode (Config.Membership) a lease
// lasts as long as its owner's membership (docs/MEMBERSHIP.md): Acquire writes
// schema.LeaseHeldByMember as its expiry, nothing renews it, the owner writes its
// checkpoint with Checkpoint, and only a release frees it — the owner's, or the
// reconciler's once the owner's membership lapsed beyond the skew margin.
//
// Guarantees:
//   - Every operation is one DynamoDB write (ReleaseAllOwnedBy: one per lease; ReadOwned
//     is one read; Naming one keys-only index Query per page), and every write by an owner (renew, checkpoint, release) is
//     conditioned on lease_owner = me AND lease_version = v. A worker that lost its
//     lease can neither renew, checkpoint nor release it.
//   - Transfer (a planned handoff, docs/HANDOFF.md) changes the owner in the same one
//     conditional write as every owner write (lease_owner = me AND lease_version = v,
//     and desired_state = STARTED), with the checkpoint, and gives the new owner a
//     version from the same clock as Acquire: the old owner can write nothing after
//     it, and the lease is never unowned in between.
//   - Acquire never creates an item and only takes STARTED connections whose lease is
//     free: no owner and no expiry or expiry 0 (released), or an expiry other than 0
//     that passed more than the skew margin ago on the caller's clock. A lease with
//     one of its two fields missing (an owner with no or a zero expiry, an expiry
//     with no owner) is not free: every release writes both, so only an operator
//     makes one, over a lease someone may still hold. A membership lease never
//     expires, so it is taken only once released.
//   - An ambiguous outcome (timeout, 5xx, a dropped response after the write was sent)
//     is resolved by reading the item back, so callers see the true result.
//   - ReadOwned is eventually consistent and never writes: callers confirm what it
//     shows with a conditional write before acting on it.
//   - Errors are the package's sentinels (ErrHeld, ErrLost, …), wrapped with context;
//     no SDK error type leaks out. (FreeCondition and ReleasedCondition are SDK
//     expression builders on purpose: other packages embed them in their own
//     requests.)
//   - Fencing versions strictly increase per connection, within one stated bound.
//     Every write that gives a lease a new version (acquire, transfer, renumber, a
//     repair's release) writes above the stored version, conditioned on it, and at least the
//     writer's wall clock in ms (acquire, transfer, renumber) or that plus the skew margin (the
//     repair of an unusable or stale version). Protocol writes never lower it
//     (releases keep it), so while only they write, each new version is above every
//     earlier one. An outside write that rolls the stored version back (a console
//     save of an old image, an item deleted and re-created) erases that record;
//     then the next version is still above every version issued more than
//     2 × SkewMargin earlier, because the writer's clock is at most the margin behind
//     the issuer's and a version is at most the issuer's clock plus the margin.
//     Within that window the caller closes it with a floor: AcquireAbove writes above
//     a version it knows was issued (a needs-owner wakeup carries the version the
//     reconciler saw in the stream record), and a holder that takes a stale image
//     back restores its own version. Residual, under the assumption that clocks
//     disagree by at most SkewMargin: an acquire with no floor (the start-up pass, a
//     sweep nudge, a wakeup that carried the rolled-back version) less than
//     2 × SkewMargin (4 s by default) after the issue of a rolled-back-over version,
//     by a worker whose clock lags the issuer's, can write a version at or below it.
//     Since every owner write is conditioned on owner AND version, a repeat matters
//     to the table only for the same worker id; to a consumer following the rule in
//     docs/SINKS.md it makes that owner's records look stale until the next change
//     of owner.
//   - An acquire whose write may have landed but whose read-back failed too says so
//     (AmbiguousAcquire, wrapping ErrUnavailable) with the stamp the write carries
//     (status "acquired", status_at_ms), so the caller can recognise its own write
//     later; an item still showing both names the caller with nothing written since.
//   - An operator's edit of a lease field never strands a connection (see
//     docs/MEMBERSHIP.md, "Operator edits"). A lease_version that is absent or not an
//     integer is repaired: restored by its owner's next write, replaced by a fresh
//     version at acquire (the wall clock plus the skew margin), and matched as it is
//     by the sweep's and the crash path's releases. An undecodable last_seq is reset
//     to 0 at acquire. Every repair is conditioned on the item being exactly as read,
//     and is said on the item: status_error and last_repair name the field and the
//     value.
//   - One runner per lease, whatever an operator writes (the holder's half of the
//     invariant "no operator edit yields two deliverers or none"). The holder of l
//     (owner o, version v) takes the lease back at its next owner write (checkpoint,
//     renew, release, or the write a check wakeup makes) when the item shows a version
//     below v, or v under another owner, or v with the owner deleted and the
//     membership expiry still set; and its stream-mode checkpoint writes the expiry
//     back. Proof that nobody else can be running under what it overwrites: versions
//     strictly increase per connection (the fencing invariant), and a lease at
//     version u is acquired only when free, or transferred only by its holder after it
//     stopped delivering; so a session at u < v ended (released, fenced, or handed
//     over) before v was issued, and a version is issued once, so v under any other
//     name is v itself, edited. Only an outside write can put such a lease on the
//     item, and no session runs under it. Conversely a version above v is a real
//     acquire or transfer and the holder stops (ErrLost) before writing anything.
//     The reclaim is conditioned on owner, expiry and version exactly as read, so it
//     cannot overwrite an acquire that raced it.
//
// Non-guarantees: the store does not stop a caller from streaming after it lost a
// lease. The worker fences itself on its monotonic clock (see worker/internal/owner);
// this package only makes sure the table never believes two owners at once. The
// reclaim rests on versions strictly increasing: an acquire writes at least the wall
// clock in ms, so after a console rollback of the version an acquirer whose clock is
// behind the holder's by more than the time since the holder's acquire could be
// handed a lower version. That takes a release of the rolled-back lease between the
// edit and the holder's next owner write (the reconciler asks the holder first, and
// its releases and nudges of leases nobody answers for wait NudgeAfter:
// ReleaseAllOwnedByAfter) and a clock off by more than the skew margin.
// The holder finds an edit only at its next owner write: its checkpoint, or its
// backstop read for an idle connection; that is the bound where no stream record
// passes a filter (docs/MEMBERSHIP.md).
package lease
