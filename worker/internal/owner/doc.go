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
// Non-guarantees: delivery is at least once. Messages delivered after the last
// checkpoint are delivered again by the next owner if this worker dies without
// releasing; that window is one checkpoint interval (stream mode) or one renew
// interval (polling mode) of traffic.
package owner
