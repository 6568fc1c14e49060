// Package reaper is the reconciler's side of the membership protocol (see
// docs/MEMBERSHIP.md): it finds members whose membership lease lapsed, declares them
// dead, and releases their connections so that the stream hands them to live
// workers. No loop polls for this: the reconciler calls Reap when a heartbeat record
// arrives (at most once per Every), and from the backstop sweep.
//
// Guarantees:
//   - A member is declared dead only by a conditional write: its item still holds the
//     incarnation read, is not dead already, and its lease lapsed more than the skew
//     margin ago. A member that renewed meanwhile is left alone.
//   - A member's connections are released only once its lease lapsed more than the
//     skew margin ago (registry.Releasable), by which time it has self-fenced; each
//     release is conditioned on owner and version (lease.ReleaseAllOwnedBy).
//   - The call that declares a member dead releases its connections at once (the
//     failover). Any later call (a retry, an owner a stream record or the sweep
//     shows) releases a lease still naming it only after it carried a mark for Hold
//     (lease.ReleaseAllOwnedByAfter): such a lease may be a stale image written back
//     over a live holder's, and the holder takes it back within Hold, so the
//     release never gives a second worker a connection someone still delivers.
//   - A connection whose owner has no registry item is never released at once: a
//     tombstone is written (conditionally, only if no item exists), which fails that
//     worker's next renew, and its connections are released once the tombstone's
//     lease (registry.TombstoneLease, at least any member's lease) lapsed beyond the
//     margin.
//   - Only membership items (with an incarnation) and tombstones are declared dead or
//     reaped: a registry item without an incarnation (a polling-mode worker, or one
//     of an older version during a rolling deploy) keeps leases that expire on their
//     own, which the sweep releases. An owner with no item at all is tombstoned
//     whatever its lease's expiry says: the reconciler serves stream mode, where
//     every owner is a member (polling-mode fleets run without it).
//   - Releases that fail are retried on later calls while the dead member's item is
//     within RetryFor of its lapse; after that the sweep's pass over the table finds
//     what is left.
//   - After a quiet spell (no heartbeat batch for longer than Quiet, which is what an
//     outage of the table or of its stream looks like: every member lapses at once),
//     nobody is declared dead until Grace after the first heartbeat that ends it, so
//     that members that are alive renew first instead of being expelled. A reap in
//     the spell that no heartbeat started (the sweep's) opens the same grace, once
//     per spell. Only a warm instance knows of a quiet spell; a cold one acts at
//     once.
//
// Non-guarantees: the registry is listed through its index, which is eventually
// consistent; a stale listing only delays a declaration (the conditional write
// decides), it never causes a wrong one.
package reaper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/sockfleet/sockfleet/shared/registry"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/shared/tracing"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Registry is the part of the registry the reaper uses (*registry.Registry).
type Registry interface {
	List(ctx context.Context) ([]codec.Worker, []error, error)
	DeclareDead(ctx context.Context, w codec.Worker, now time.Time, skew time.Duration) (bool, error)
	Tombstone(ctx context.Context, id string, now time.Time) (bool, error)
}

// Leases releases a dead member's connections (*lease.Store).
type Leases interface {
	ReleaseAllOwnedBy(ctx context.Context, worker string) ([]string, error)
	ReleaseAllOwnedByAfter(ctx context.Context, worker string, hold time.Duration) ([]string, error)
}

// Defaults.
const (
	// DefaultEvery: heartbeats arrive every renew interval per worker, so a lapse is
	// acted on within about this long after it passes the skew margin.
	DefaultEvery = 2 * time.Second
	// DefaultRetryFor: how long after a dead member's lapse its releases are retried.
	DefaultRetryFor = 2 * time.Minute
	// DefaultQuiet: heartbeat batches arrive every renew interval (3 s) divided by the
	// number of members, so a gap this long means no member could renew (or the
	// stream stalled), not that one died.
	DefaultQuiet = 10 * time.Second
	// DefaultGrace: one renew interval (3 s) plus the skew margin, time for every
	// member that is alive to renew once the table is back.
	DefaultGrace = 5 * time.Second
	// DefaultHold: the sweep's default NudgeAfter, above the workers' default backstop
	// interval (1 min) plus a renew tick.
	DefaultHold = 2 * time.Minute
)

// Reaper declares lapsed members dead and releases their connections.
type Reaper struct {
	Registry Registry
	Leases   Leases
	Skew     time.Duration // the skew margin (schema.DefaultSkewMargin); the workers' must not exceed it
	Every    time.Duration // default DefaultEvery
	RetryFor time.Duration // default DefaultRetryFor
	Quiet    time.Duration // default DefaultQuiet
	Grace    time.Duration // default DefaultGrace
	// Hold: a lease naming a member that was dead already (not declared by the same
	// call) is released only after it carried a mark this long (see
	// lease.Store.ReleaseAllOwnedByAfter). It must be at least the workers' backstop
	// interval plus a renew tick; the reconciler uses the sweep's NudgeAfter. Default
	// DefaultHold.
	Hold time.Duration
	Log  *slog.Logger

	mu         sync.Mutex
	last       time.Time // last Reap slot claimed by Due
	heard      time.Time // last heartbeat batch (Due call)
	graceUntil time.Time // no declarations before this (after a quiet spell)
	// gracedSpell is heard when a call that was not a heartbeat opened a grace: the
	// quiet spell since that heartbeat has had its grace.
	gracedSpell time.Time
}

// Report is what one call did.
type Report struct {
	Declared   []string // members declared dead
	Tombstoned []string // absent owners given a tombstone
	Released   []string // connections released
}

// Due reports whether a heartbeat-driven Reap should run at now, and if so claims
// the slot: at most one per Every per reconciler instance.
func (r *Reaper) Due(now time.Time) bool {
	every := r.Every
	if every <= 0 {
		every = DefaultEvery
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.quietLocked(now) {
		r.graceUntil = now.Add(r.grace())
	}
	r.heard = now
	if !r.last.IsZero() && now.Sub(r.last) < every {
		return false
	}
	r.last = now
	return true
}

// inGrace reports whether declarations wait at now (a quiet spell just ended).
// A call in a quiet spell, not from a heartbeat (the sweep's reap, a stream record
// naming a lapsed owner), opens the grace once per spell: the table answered, so
// the outage may be over while the members' renews are a tick away. A later call
// in the same spell finds no new grace, so a fleet whose heartbeats really stopped
// is still declared dead, one grace later.
func (r *Reaper) inGrace(now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.quietLocked(now) && !r.gracedSpell.Equal(r.heard) {
		r.gracedSpell = r.heard
		r.graceUntil = now.Add(r.grace())
	}
	return now.Before(r.graceUntil)
}

// quietLocked reports whether no heartbeat batch has come for longer than Quiet.
// Call with r.mu held.
func (r *Reaper) quietLocked(now time.Time) bool {
	quiet := r.Quiet
	if quiet <= 0 {
		quiet = DefaultQuiet
	}
	return !r.heard.IsZero() && now.Sub(r.heard) > quiet
}

func (r *Reaper) grace() time.Duration {
	if r.Grace <= 0 {
		return DefaultGrace
	}
	return r.Grace
}

// Reap lists the registry and acts on every member that is lapsed or dead.
func (r *Reaper) Reap(ctx context.Context, now time.Time) (Report, []codec.Worker, error) {
	ws, _, err := r.Registry.List(ctx)
	if err != nil {
		return Report{}, nil, fmt.Errorf("reap: %w", err)
	}
	var rep Report
	var errs []error
	for _, w := range ws {
		errs = append(errs, r.member(ctx, w, now, &rep, false))
	}
	return rep, ws, errors.Join(errs...)
}

// Owners acts on workers named as owners of connections (by stream records or the
// sweep) that are not live members of ws, the registry as listed now: an absent one
// gets a tombstone; a lapsed or dead one is handled as in Reap.
func (r *Reaper) Owners(ctx context.Context, now time.Time, ws []codec.Worker, owners []string) (Report, error) {
	byID := make(map[string]codec.Worker, len(ws))
	for _, w := range ws {
		byID[w.ID] = w
	}
	var rep Report
	var errs []error
	seen := map[string]bool{}
	for _, id := range owners {
		if id == "" || seen[id] {
			continue
		}
		seen[id] = true
		w, ok := byID[id]
		if ok {
			errs = append(errs, r.member(ctx, w, now, &rep, true))
			continue
		}
		wrote, err := r.Registry.Tombstone(ctx, id, now)
		switch {
		case err != nil:
			errs = append(errs, err)
		case wrote:
			rep.Tombstoned = append(rep.Tombstoned, id)
			r.log().InfoContext(ctx, "owner has no registry item; tombstone written, its connections are released once it lapses",
				"worker", id, "after", registry.TombstoneLease+r.Skew)
		}
	}
	return rep, errors.Join(errs...)
}

// member acts on one registry item. seen: a connection is known to name it as owner,
// so a long-dead member's connections are released too.
func (r *Reaper) member(ctx context.Context, w codec.Worker, now time.Time, rep *Report, seen bool) error {
	if w.Incarnation == "" && !w.Dead() {
		// A polling-mode worker's item: its leases expire on their own and its
		// registry refresh is not what keeps them, so it is not this package's to reap.
		return nil
	}
	if !registry.Releasable(w, now, r.Skew) {
		return nil // live, or lapsed within the margin: it may still be streaming
	}
	switch {
	case !w.Dead() && r.inGrace(now):
		return nil // every member lapsed in a quiet spell: let the live ones renew first
	case w.Dead() && !seen && now.UnixMilli() > w.HeartbeatExpiresAtMs+r.retryFor().Milliseconds():
		return nil // long dead: the sweep's pass over the table covers what is left
	}
	// A span for a member declared dead now, or named as owner by a record; none for
	// the retries of a dead member's releases at each reap, which mostly find nothing.
	span := trace.SpanFromContext(ctx)
	if !w.Dead() || seen {
		ctx, span = tracer.Start(ctx, "reaper.release", trace.WithAttributes(tracing.Cause("member_dead"), tracing.Worker(w.ID),
			attribute.String("sockfleet.incarnation", w.Incarnation)))
		defer span.End()
	}
	var ids []string
	var err error
	defer func() { Released(span, ids, err) }()
	if !w.Dead() {
		var declared bool
		declared, err = r.Registry.DeclareDead(ctx, w, now, r.Skew)
		if err != nil {
			return err
		}
		if !declared {
			span.AddEvent("renewed, left or changed since the listing")
			return nil // it renewed, left or changed since the listing
		}
		span.AddEvent("member_declared_dead", trace.WithAttributes(attribute.Int64("sockfleet.lapsed_ms", now.UnixMilli()-w.HeartbeatExpiresAtMs)))
		rep.Declared = append(rep.Declared, w.ID)
		r.log().InfoContext(ctx, "member declared dead", "worker", w.ID, "incarnation", w.Incarnation,
			"lapsed_ms_ago", now.UnixMilli()-w.HeartbeatExpiresAtMs)
		// Each release carries this span's traceparent (trace_parent): the records
		// they cause, and the wakeups those bring, join this trace.
		ids, err = r.Leases.ReleaseAllOwnedBy(ctx, w.ID)
		return r.released(ctx, w, ids, err, rep)
	}
	// Dead already: what still names it may be a stale image written back over a
	// live holder's lease since (issue 21). Leave the holder time to take it back.
	ids, err = r.Leases.ReleaseAllOwnedByAfter(ctx, w.ID, r.hold())
	return r.released(ctx, w, ids, err, rep)
}

func (r *Reaper) released(ctx context.Context, w codec.Worker, ids []string, err error, rep *Report) error {
	rep.Released = append(rep.Released, ids...)
	if len(ids) > 0 {
		r.log().InfoContext(ctx, "released a dead member's connections", "worker", w.ID, "released", len(ids))
	}
	if err != nil {
		return fmt.Errorf("release connections of dead member %s: %w", w.ID, err)
	}
	return nil
}

func (r *Reaper) hold() time.Duration {
	if r.Hold <= 0 {
		return DefaultHold
	}
	return r.Hold
}

var tracer = tracing.Tracer("functions/reconciler/reaper")

// Released records on a reaper.release span the connections released (an event
// each: the trace of each one's next owner starts from it) and the error, if any.
func Released(span trace.Span, ids []string, err error) {
	span.SetAttributes(attribute.Int("sockfleet.released", len(ids)))
	for _, id := range ids {
		span.AddEvent("released", trace.WithAttributes(tracing.Conn(id)))
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "some releases failed")
	}
}

func (r *Reaper) retryFor() time.Duration {
	if r.RetryFor <= 0 {
		return DefaultRetryFor
	}
	return r.RetryFor
}

func (r *Reaper) log() *slog.Logger {
	if r.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return r.Log
}
