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
//     absent, released, or expired by more than the skew margin on the caller's clock;
//     a membership lease never expires, so it is taken only once released.
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
//     by the sweep's and the crash path's releases. A stale image that rolled the lease
//     back (a lower version, or the holder's version under another owner) is taken
//     back by the holder's next write when the stale lease is free by the acquire rule
//     (released, or expired beyond the margin) or names the holder itself — then nobody
//     can be streaming under it. An undecodable last_seq is reset to 0 at acquire. Every
//     repair is conditioned on the item being exactly as read, and is said on the item:
//     status_error and last_repair name the field and the value.
//
// Non-guarantees: the store does not stop a caller from streaming after it lost a
// lease. The worker fences itself on its monotonic clock (see worker/internal/owner);
// this package only makes sure the table never believes two owners at once. A stale
// image whose lease still looks live and names another worker is not provably stale
// to the holder: it stops (ErrLost), and the stale lease is released by the
// reconciler when its record passes the filter, or by the sweep at its expiry.
package lease
