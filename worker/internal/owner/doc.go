// Package owner is the worker's ownership loop: it acquires connection leases (on a
// wakeup, or in the one start-up pass), streams each owned connection, keeps the
// right to stream it, fences itself when it cannot, and drains on shutdown.
//
// Two regimes keep that right, each a regime (regime.go) the loop calls without
// knowing which it has. In stream mode (Config.Member set; streammode.go,
// worker/internal/member and docs/MEMBERSHIP.md) the worker renews one membership
// lease, its registry item, and writes each connection only to checkpoint (when
// something changed, at most once per checkpoint interval) and to release. In polling
// mode (the seed's design; polling.go) its checkpoint of a connection is the renew of
// that connection's lease, every interval, carrying the acknowledged last_seq.
//
// Files: config.go the configuration and its timing rules; table.go the table of
// owned connections; regime.go the regime interface and Run (the loop and the
// drain); acquire.go acquisitions and wakeups; session.go one connection's session,
// its fence and its release; checkpoint.go the owner's checkpoint write and what it
// says; polling.go and streammode.go the two regimes; reconcile.go the stream-mode
// reconciliation of the table against this worker; startup.go the start-up pass;
// handoff.go, handoff_source.go and handoff_target.go the two sides of a planned
// handoff.
//
// Guarantees:
//   - A connection streams only under a lease this worker acquired, and stops at once
//     (its context is cancelled) when a renew or checkpoint says the lease is lost or
//     the item is gone, STOPPED or unusable.
//   - Self-fencing: past its local deadline — the start of the last successful renew
//     (the membership's in stream mode, the connection's in polling mode) plus
//     min(RenewDeadline, Lease − SkewMargin), on the monotonic clock — a connection
//     stops and no sink write passes the guard, even if the table cannot be reached
//     at all. The lease in the table runs from a moment after that start, and others
//     take it over (polling) or release it (the reconciler, stream mode) only
//     SkewMargin after it expired on their clocks, so a fenced worker has stopped
//     before anyone else can acquire. SinkWindow bounds the sink writes in flight.
//   - Stream mode: a membership renew refused as "not a member" (declared dead,
//     replaced, deleted) stops every connection and makes Run return an error that
//     wraps ErrExpelled.
//   - Every stop except "lost" and "deleted" ends with one release write that
//     carries the final acknowledged last_seq (lease_expires_at_ms = 0); in stream
//     mode a release the table did not answer is retried after each successful
//     membership renew.
//   - A wakeup about a lease this worker holds is answered after a conditional write
//     that reads the item, never from memory.
//   - No phantom leases (stream mode; reconcile.go): the table does not name this
//     worker for a connection it runs no session for beyond Q + BackstopInterval +
//     2 × RenewInterval, where Q = max(BackstopInterval + 3 × RenewInterval, fence
//     deadline + RenewInterval) is the quarantine. Each backstop pass lists every
//     item the lease_owner index names this worker in (keys only, paginated) and
//     reads each one it runs no session, acquire, standby or pending release for
//     with a consistent read: one that is not STARTED is released at once; a STARTED
//     one that has named this worker at the same version for Q is read again at the
//     first work-loop tick after that and adopted — one write conditioned on exactly
//     that owner and version, which also gives it a new version (lease.Store.Renumber:
//     no earlier session delivered under it), then a session from its last_seq. The triggers the
//     protocol itself can leave have faster paths: an adopt whose confirming write
//     fails releases (never a bare refusal); a standby's timer reads the item even
//     when the standby ended first; an acquire whose write and read-back were both
//     lost (lease.AmbiguousAcquire) is looked up after the next membership renew and
//     adopted at once if the item is exactly that write (owner, status "acquired",
//     its stamp): then nothing was written since, so nobody else can hold it.
//   - Adopting a phantom never makes two deliverers. Suppose worker W delivers the
//     connection under (W, v') while the item names this worker at v. A protocol
//     write replaces W's lease only after W stopped: an acquire needs it released
//     (by W, or by the reconciler once W's membership lapsed beyond the skew margin,
//     past W's fence), a transfer is written by W after its stream returned, a
//     stale-lease release only once W said it no longer holds it or is not live. So
//     an outside write (a console save, a recreated item) put this worker's name
//     there, at some time t, whatever v is against v' — above, below or equal. From
//     t on W is displaced: if it reaches the table, its next backstop pass (started
//     by t + BackstopInterval + RenewInterval) reads the item, sees another owner and
//     makes its conditional checkpoint, which either fails — W stops — or takes the
//     stale lease back (the lease package's repair), after which the item no longer
//     names this worker at v; read and write each take at most RenewInterval. If it
//     cannot reach the table, its fence stops it within the fence deadline of its
//     last renew. Either way W is done by t + Q. This worker first sees the phantom
//     at or after t and adopts only Q later, with a write conditioned on the item
//     being exactly (this worker, v): if W took it back, that write fails and
//     nothing starts. Assumptions, stated: W's backstop pass reaches the item within
//     its interval (a pass over thousands of connections can take longer), and its
//     eventually consistent read reflects a write older than the pass (DynamoDB:
//     typically within a second).
//   - No operator edit yields two deliverers or none. An edit of an owned item
//     reaches its holder by one of two paths, and by either the holder makes one
//     owner write before it decides anything: a check wakeup (the reconciler sends
//     one for every record it can read as an edit: a version that fell or an owner
//     changed without a higher version, an inserted item naming an owner, an expiry
//     deleted or zeroed under an owner), or, where no record passes a filter, the
//     checkpoint of a streaming connection (at most CheckpointInterval plus one renew
//     tick) or the backstop read (BackstopInterval), which compares the owner, the
//     version, the expiry, the spec and the fields no write repairs. The owner write
//     takes the lease back under the lease store's rule (shared/lease: a lease below
//     its version, or at its version under another or no owner, has no session), so
//     the holder keeps streaming and nobody else acquires in between: an acquire
//     needs a free lease, the edits that are not free (a stale owned image, an owner
//     or expiry alone) stay so until the holder's write, and the reconciler frees
//     one without a record that names its holder only after a mark held NudgeAfter
//     (shared/lease ReleaseAllOwnedByAfter, the sweep's nudge), longer than the
//     holder takes. A stale released image is free, and only the reconciler, from
//     the record's old image, knows its holder; so the one acquire no record drives,
//     the start-up pass, takes only a lease that carried that mark for UnheldHold
//     (longer than the holder takes, plus the skew margin; lease.Store.AcquireUnheld).
//     It stops (ErrLost)
//     only under a higher version, which only an acquire or a transfer writes, after
//     the previous session ended; so at no moment do two sessions deliver. An item
//     the named owner does not run (created or duplicated naming it, deleted and
//     recreated after it stopped, an expiry damaged after it stopped) is released by
//     the reconciler once that owner answered the check that it does not hold it,
//     and offered to a worker, within the stream's latency. A field no write repairs
//     (nudged_at_ms, seq_epoch) mistyped on an owned item stops it with status
//     invalid naming the field, found by the same checkpoint or backstop read; the
//     release is not news to the reconciler, so nobody acquires it again until it is
//     fixed.
//   - Run joins every goroutine it started, including connection goroutines.
//   - Planned handoff (stream mode, Config.Handoff; handoff*.go, docs/HANDOFF.md):
//     the old owner stops delivering (its stream returns, everything read delivered)
//     before the one conditional write that transfers the lease, and the new owner
//     delivers only after it learns the new version (the commit, or the item read
//     with a conditional write), dropping what the old owner delivered. So at most
//     one worker delivers a connection at a time, and a handoff skips no sequence and
//     repeats none. Two upstream sockets may be open at once for at most the prepare
//     timeout plus the cut (the old stream's last flush and close). A handoff that
//     cannot be prepared ends in the release above, saying why in status_error; a
//     drain hands off first and releases what is left, within DrainTimeout.
//
// Non-guarantees: an edit the holder finds at its checkpoint or backstop read (a
// stale image whose lease looks live, lease_owner deleted or set to another worker)
// is repaired in the table up to one checkpoint interval later for a streaming
// connection and one backstop interval for an idle one; the holder streams on
// meanwhile, and the reconciler's own repairs of what nobody answers for (the
// dead-member pass's later releases, the sweep's nudges) wait NudgeAfter, which must
// exceed BackstopInterval plus RenewInterval. A stale image naming a member that is
// declared dead by the same pass that releases it (the image written while that
// member was still live, the holder's write not yet made) is released at once; a
// second worker may then deliver until the holder's next owner write.
// Delivery is at least once. Messages delivered after the last
// checkpoint are delivered again by the next owner if this worker dies without
// releasing; that window is one checkpoint interval (stream mode) or one renew
// interval (polling mode) of traffic.
package owner
