// Package rounds runs rebalance rounds in the reconciler: it decides when the fleet's
// load is out of balance, plans a round with functions/reconciler/rebalance, and
// sends each move to the connection's owner as a handoff wakeup (shared/wakeup,
// reason handoff, To = the target). The owner hands the connection over
// make-before-break (worker side) or answers target_unavailable.
//
// # When a round runs
//
// Nothing polls. The reconciler calls Check when a batch carries worker-item records
// (a worker joining is an INSERT of its item; every membership renew is a MODIFY that
// carries its load), at most once per DefaultCheckEvery, and from the backstop sweep.
// Check compares the registry's loads with the bands of
// functions/reconciler/rebalance (±Tolerance around the mean utilisation): a fleet
// within its bands costs no read at all. Out of band, a round runs if:
//   - no round ran in the last MinInterval, and
//   - the previous round's accepted moves show in the workers' reported loads (within
//     a tenth of them, or one), or Settle has passed since it was sent. A round that
//     moved nothing (all refused, a failed read) waits the whole of Settle; one
//     that cooling stopped waits until the first candidate it read cools. A worker
//     joining (WhyJoined) checks at once even then.
//
// So rounds chain until the fleet is balanced, one per heartbeat that shows the
// previous one done, and a round never plans from loads its predecessor is still
// changing (which would overshoot). The cap (MaxFraction of the connections per
// round) makes 3 → 5 workers with 300 connections take four rounds.
//
// # What a round reads
//
// The workers come from the registry listing (live, not draining, with an address
// and a capacity; draining or gone workers neither give nor take). The registry's
// loads only decide whether to look closer: they lag by up to a renew interval, and
// a plan on them once moved connections onto a worker that already held them. So a
// round counts each worker's connections from the lease_owner index (keys only, one
// Query per worker), plans on those counts to name the donors and how many each
// gives, and reads only as many of each donor's connections as that needs (in
// chunks of twice what is still missing, until enough are not cooling) with an
// eventually consistent BatchGetItem, for their lease version, owner and
// moved_at_ms. The plan is then computed again with what was read, cooling
// included; if cooling cut it short, the other workers above their band's floor are
// read once too and it is computed a last time. The read units are counted
// (Report.ReadUnits).
//
// # Guarantees and non-guarantees
//
//   - A move is a hint, like any wakeup: the owner checks it holds the connection at
//     the version sent, and that the target is live and not draining. A stale read
//     makes a move fail, never a wrong one.
//   - No connection is moved twice within Cooling: the round reads moved_at_ms
//     (written by the handoff) and also remembers the moves its owners took on (or
//     did not answer for), so a handoff that has not yet written its moved_at_ms is
//     cooling too. A refused move is not remembered: nothing moved.
//   - target_unavailable and other refusals are not retried within the round; the
//     next round plans from the loads as they then are.
//   - Each reconciler instance (one per stream shard) runs its own rounds. Two
//     instances may plan at once from the same registry and together move more than
//     needed; the next round corrects it (bands damp it), and cooling keeps any one
//     connection from moving back and forth. With one shard, as at the local stack's
//     and a small fleet's scale, there is one instance.
package rounds

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/sockfleet/sockfleet/functions/reconciler/dispatch"
	"github.com/sockfleet/sockfleet/functions/reconciler/rebalance"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/shared/tracing"
	"github.com/sockfleet/sockfleet/shared/wakeup"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// WhyJoined is the reason Check is given when a worker joined: it starts a round even
// while a round that moved nothing holds the next one back.
const WhyJoined = "worker joined"

// Defaults.
const (
	// DefaultCheckEvery bounds how often heartbeats make the reconciler look at the
	// loads (a registry listing, shared with the membership reaper's).
	DefaultCheckEvery = 2 * time.Second
	// DefaultMinInterval is the least time between two rounds.
	DefaultMinInterval = 5 * time.Second
	// DefaultSettle is how long a round waits for its moves to show in the loads the
	// workers report (once per renew interval, 3 s by default) before the next round
	// plans without them.
	DefaultSettle = 15 * time.Second
)

// Store reads a round's connections (*Reader).
type Store interface {
	OwnedBy(ctx context.Context, worker string) ([]string, float64, error)
	Read(ctx context.Context, ids []string) (map[string]Candidate, float64, error)
}

// Config tunes the rounds. Zero values take the defaults.
type Config struct {
	Plan        rebalance.Config // tolerance, cap fraction, cooling
	MinInterval time.Duration    // least time between rounds; default DefaultMinInterval
	Settle      time.Duration    // longest wait for a round's moves to show; default DefaultSettle
	CheckEvery  time.Duration    // default DefaultCheckEvery
	Timeout     time.Duration    // one handoff wakeup; default dispatch.DefaultWakeupTimeout
	Disabled    bool             // no rounds at all
}

// Validate checks c and fills defaults.
func (c *Config) Validate() error {
	if _, err := rebalance.Compute(nil, nil, time.Time{}, c.Plan); err != nil {
		return fmt.Errorf("rebalance config: %w", err)
	}
	for _, d := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"min interval", &c.MinInterval, DefaultMinInterval},
		{"settle", &c.Settle, DefaultSettle},
		{"check every", &c.CheckEvery, DefaultCheckEvery},
		{"wakeup timeout", &c.Timeout, dispatch.DefaultWakeupTimeout},
	} {
		if *d.v < 0 {
			return fmt.Errorf("rebalance config: %s %s is negative", d.name, *d.v)
		}
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	return nil
}

// Rounds runs rebalance rounds for one reconciler process. Safe for concurrent use:
// one round runs at a time.
type Rounds struct {
	cfg    Config
	store  Store
	sender dispatch.Sender
	log    *slog.Logger

	mu        sync.Mutex
	running   bool
	lastCheck time.Time
	lastRound time.Time
	flight    *flight
	sent      map[string]time.Time // moves sent, for cooling until moved_at_ms shows them
}

// flight is the last round's accepted moves, until they show in the loads.
type flight struct {
	until  time.Time
	expect map[string]int // worker -> load once its moves are done
	slack  int
	// hold: nothing moved (every candidate cooling, every move refused, or a read
	// failed), so the next round waits the whole of Settle rather than replanning
	// the same thing on every heartbeat.
	hold bool
}

// New returns Rounds. log may be nil.
func New(cfg Config, store Store, sender dispatch.Sender, log *slog.Logger) (*Rounds, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if store == nil || sender == nil {
		return nil, errors.New("rebalance: store and sender are required")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Rounds{cfg: cfg, store: store, sender: sender, log: log, sent: map[string]time.Time{}}, nil
}

// Due reports whether a heartbeat at now should make the caller Check, and if so
// claims the slot: at most once per CheckEvery.
func (r *Rounds) Due(now time.Time) bool {
	if r.cfg.Disabled {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.lastCheck.IsZero() && now.Sub(r.lastCheck) < r.cfg.CheckEvery {
		return false
	}
	r.lastCheck = now
	return true
}

// Report is what one Check did.
type Report struct {
	Why     string // what made the caller check: "heartbeat", "worker joined", "sweep"
	Skipped string // why no round ran; "" if one did
	Workers int    // workers taking part
	Conns   int    // connections they hold (registry loads)
	Plan    rebalance.Plan
	Sent    int                   // handoff wakeups sent
	Results map[wakeup.Result]int // answers, by result
	// Unreachable: moves whose owner did not answer (an error, a timeout).
	Unreachable int
	ReadUnits   float64 // read capacity units of the index queries and batch reads
	Err         error   // a read that failed (the round planned without it)
}

// Accepted is how many moves the owners took on.
func (rp Report) Accepted() int { return rp.Results[wakeup.HandingOff] }

// Check looks at the registry's loads (ws, as listed at now) and runs a round if the
// fleet is out of balance and the previous round has settled (see the package doc).
func (r *Rounds) Check(ctx context.Context, now time.Time, ws []codec.Worker, why string) Report {
	rep := Report{Why: why}
	if r.cfg.Disabled {
		rep.Skipped = "disabled"
		return rep
	}
	eligible := Eligible(ws, now)
	quick, err := rebalance.Compute(planWorkers(eligible), loadConns(eligible, nil, time.Time{}), now, r.cfg.Plan)
	rep.Workers, rep.Conns = len(eligible), totalLoad(eligible)
	if err != nil {
		rep.Skipped, rep.Err = "bad registry input", err
		return rep
	}
	r.mu.Lock()
	switch {
	case r.running:
		rep.Skipped = "a round is running"
	case r.flight != nil && now.Before(r.flight.until) && !r.flight.settled(eligible) &&
		!(r.flight.hold && why == WhyJoined):
		rep.Skipped = "the previous round's moves do not show in the loads yet"
	case quick.Min == 0:
		rep.Skipped = "balanced"
		r.flight = nil
	case !r.lastRound.IsZero() && now.Sub(r.lastRound) < r.cfg.MinInterval:
		rep.Skipped = "within the minimum interval since the last round"
	}
	if rep.Skipped != "" {
		r.mu.Unlock()
		return rep
	}
	r.running, r.lastRound, r.flight = true, now, nil
	sent := maps.Clone(r.sent)
	r.mu.Unlock()

	// A span only for a round that runs (its moves' wakeups are its children), none
	// for a check that finds nothing to do.
	ctx, span := tracer.Start(ctx, "rebalance.round", trace.WithAttributes(tracing.Cause("rebalance"),
		attribute.String("sockfleet.rebalance.why", why), attribute.Int("sockfleet.workers", rep.Workers)))
	fl := r.round(ctx, now, eligible, sent, &rep)
	span.SetAttributes(attribute.Int("sockfleet.rebalance.moves", rep.Accepted()))
	span.End()

	r.mu.Lock()
	r.running, r.flight = false, fl
	for id, at := range r.sent {
		if now.Sub(at) >= r.cooling() {
			delete(r.sent, id)
		}
	}
	r.mu.Unlock()
	r.logRound(ctx, rep)
	return rep
}

var tracer = tracing.Tracer("functions/reconciler/rounds")

func (r *Rounds) cooling() time.Duration {
	if r.cfg.Plan.Cooling > 0 {
		return r.cfg.Plan.Cooling
	}
	return rebalance.DefaultCooling
}

// round counts each worker's connections from the index, reads the donors'
// candidates, plans, sends the moves and returns what the loads should become.
func (r *Rounds) round(ctx context.Context, now time.Time, registered []codec.Worker,
	sent map[string]time.Time, rep *Report) *flight {
	// The registry's loads lag by up to a renew interval; a plan on them can move
	// connections onto a worker that already holds them. The index (keys only) is
	// current to within its replication lag, so the round plans on its counts.
	eligible := slices.Clone(registered)
	owned := map[string][]string{}
	for i, w := range eligible {
		ids, units, err := r.store.OwnedBy(ctx, w.ID)
		rep.ReadUnits += units
		if err != nil {
			rep.Err = err
			return &flight{until: now.Add(r.cfg.Settle), hold: true}
		}
		owned[w.ID], eligible[i].Load = ids, len(ids)
	}
	rep.Conns = totalLoad(eligible)
	quick, err := rebalance.Compute(planWorkers(eligible), loadConns(eligible, nil, time.Time{}), now, r.cfg.Plan)
	if err != nil || quick.Min == 0 {
		rep.Plan, rep.Err = quick, err
		return nil // the registry was behind: balanced after all
	}
	real := map[string][]rebalance.Conn{} // worker -> its conns as read
	cands := map[string]Candidate{}
	var errs []error
	var cools time.Time // when the first candidate read as cooling cools
	read := func(w string, need int) {
		conns, err := r.candidates(ctx, now, w, owned[w], need, sent, cands, rep)
		for _, c := range conns {
			if end := c.MovedAt.Add(r.cooling()); !c.MovedAt.IsZero() && end.After(now) && (cools.IsZero() || end.Before(cools)) {
				cools = end
			}
		}
		errs = append(errs, err)
		real[w] = conns
	}
	need := map[string]int{}
	for _, m := range quick.Moves {
		need[m.From]++
	}
	for _, donor := range slices.Sorted(maps.Keys(need)) {
		read(donor, need[donor])
	}
	plan, err := rebalance.Compute(planWorkers(eligible), loadConns(eligible, real, farFuture), now, r.cfg.Plan)
	if short := len(quick.Moves) - len(plan.Moves); err == nil && short > 0 {
		// Cooling cut the plan short: another worker above its band's floor may give
		// instead. Read those once, and plan again.
		band, _ := rebalance.Band(planWorkers(eligible), loadConns(eligible, nil, time.Time{}), r.cfg.Plan)
		again := false
		for _, w := range eligible {
			if _, done := real[w.ID]; !done && w.Load > band[w.ID][0] {
				read(w.ID, short)
				again = true
			}
		}
		if again {
			plan, err = rebalance.Compute(planWorkers(eligible), loadConns(eligible, real, farFuture), now, r.cfg.Plan)
		}
	}
	rep.Err = errors.Join(errs...)
	if err != nil {
		rep.Err = errors.Join(rep.Err, err)
		return &flight{until: now.Add(r.cfg.Settle), hold: true}
	}
	rep.Plan = plan
	byOwner := map[string][]wakeup.Conn{}
	for _, m := range plan.Moves {
		c, ok := cands[m.Conn]
		if !ok {
			continue // a placeholder: cannot happen, as placeholders are cooling
		}
		byOwner[m.From] = append(byOwner[m.From], wakeup.Conn{ID: m.Conn, LeaseVersion: c.LeaseVersion, Reason: wakeup.Handoff, To: m.To})
	}
	addr := map[string]codec.Worker{}
	for _, w := range eligible {
		addr[w.ID] = w
	}
	expect := map[string]int{}
	for _, w := range eligible {
		expect[w.ID] = w.Load
	}
	to := map[string]string{}
	for _, m := range plan.Moves {
		to[m.Conn] = m.To
	}
	rep.Results = map[wakeup.Result]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for owner, conns := range byOwner {
		for len(conns) > 0 {
			n := min(len(conns), wakeup.MaxConns)
			req := wakeup.Request{V: wakeup.Version, Conns: conns[:n]}
			conns = conns[n:]
			rep.Sent += len(req.Conns)
			wg.Go(func() {
				cctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
				defer cancel()
				resp, err := r.sender.Send(cctx, addr[owner].Addr, req)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					for _, c := range req.Conns {
						sent[c.ID] = now // unanswered: it may have been taken on, so it cools
					}
					rep.Unreachable += len(req.Conns)
					r.log.WarnContext(ctx, "rebalance: handoff wakeup not delivered", "worker", owner, "moves", len(req.Conns), "err", err)
					return
				}
				got := map[string]wakeup.Result{}
				for _, res := range resp.Results {
					got[res.ID] = res.Result
				}
				for _, c := range req.Conns {
					res, ok := got[c.ID]
					if !ok {
						res = "unanswered"
					}
					rep.Results[res]++
					if res == wakeup.HandingOff || !ok {
						sent[c.ID] = now // taken on (or maybe): it cools; a refusal does not
					}
					if res == wakeup.HandingOff {
						expect[owner]--
						expect[to[c.ID]]++
					}
				}
			})
		}
	}
	wg.Wait()
	r.mu.Lock()
	for id, at := range sent {
		if _, moved := to[id]; moved {
			r.sent[id] = at
		}
	}
	r.mu.Unlock()
	until := now.Add(r.cfg.Settle)
	if rep.Accepted() == 0 && plan.Cooling && cools.After(until) {
		// Nothing moved because what could move is cooling: nothing changes before
		// the first of it cools, so wait until then (a worker joining still checks).
		until = cools
	}
	return &flight{until: until, expect: expect, slack: max(1, rep.Accepted()/10), hold: rep.Accepted() == 0}
}

// candidates takes donor's connections as the index lists them (ids) and reads, in
// chunks of twice what is still missing, until need of them may move (held by
// donor, started, not cooling). It returns the donor's connections for the planner: those read (with their moved_at, or, for a
// move sent but not yet written, the time it was sent), and the unread ones as
// cooling, so the planner picks only among what was read. Index entries that are
// not donor's any more (released, or re-owned since) are left out.
func (r *Rounds) candidates(ctx context.Context, now time.Time, donor string, ids []string, need int, sent map[string]time.Time,
	cands map[string]Candidate, rep *Report) ([]rebalance.Conn, error) {
	var out []rebalance.Conn
	movable := 0
	for len(ids) > 0 && movable < need {
		// Twice what is still missing: most connections are not cooling, so one
		// small read usually suffices, and a cooling fleet reads more in later chunks.
		n := min(len(ids), BatchLimit, 2*(need-movable))
		chunk := ids[:n]
		got, units, err := r.store.Read(ctx, chunk)
		rep.ReadUnits += units
		if err != nil {
			return out, err
		}
		for _, id := range chunk {
			c, ok := got[id]
			if !ok {
				continue // unprocessed: not a candidate this round
			}
			if !c.Found || !c.Held || c.Owner != donor || !c.Started {
				continue
			}
			moved := time.UnixMilli(c.MovedAtMs)
			if c.MovedAtMs == 0 {
				moved = time.Time{}
			}
			if at, ok := sent[id]; ok && at.After(moved) {
				moved = at
			}
			if moved.IsZero() || now.Sub(moved) >= r.cooling() {
				movable++
			}
			cands[id] = c
			out = append(out, rebalance.Conn{ID: id, Owner: donor, MovedAt: moved})
		}
		ids = ids[n:]
	}
	return out, nil
}

// settled reports whether the loads of ws show the flight's moves.
func (f *flight) settled(ws []codec.Worker) bool {
	if f.hold {
		return false
	}
	off := 0
	for _, w := range ws {
		if e, ok := f.expect[w.ID]; ok {
			off += max(e-w.Load, w.Load-e)
		}
	}
	return off <= f.slack
}

// Eligible is the workers a round may move connections between: live members, not
// draining, with an address and a capacity.
func Eligible(ws []codec.Worker, now time.Time) []codec.Worker {
	var out []codec.Worker
	for _, w := range ws {
		if w.Live(now.UnixMilli()) && !w.Draining && w.Addr != "" && w.Capacity > 0 {
			out = append(out, w)
		}
	}
	slices.SortFunc(out, func(a, b codec.Worker) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

func planWorkers(ws []codec.Worker) []rebalance.Worker {
	out := make([]rebalance.Worker, len(ws))
	for i, w := range ws {
		out[i] = rebalance.Worker{ID: w.ID, Capacity: w.Capacity}
	}
	return out
}

// loadConns gives each worker as many connections as its registry load: the ones in
// real (read this round), then placeholders moved at placed, with ids no connection
// can have. The first plan, from the loads alone, takes placeholders that may move
// (placed zero); the round's plan takes them as cooling (farFuture), so it moves only
// connections that were read.
func loadConns(ws []codec.Worker, real map[string][]rebalance.Conn, placed time.Time) []rebalance.Conn {
	var out []rebalance.Conn
	for _, w := range ws {
		rc := real[w.ID]
		out = append(out, rc...)
		for i := len(rc); i < w.Load; i++ {
			out = append(out, rebalance.Conn{ID: "\x00" + w.ID + "#" + strconv.Itoa(i), Owner: w.ID, MovedAt: placed})
		}
	}
	return out
}

// farFuture marks placeholders as cooling whatever the clock says.
var farFuture = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)

func totalLoad(ws []codec.Worker) int {
	n := 0
	for _, w := range ws {
		n += w.Load
	}
	return n
}

func (r *Rounds) logRound(ctx context.Context, rep Report) {
	results := map[string]int{}
	for k, v := range rep.Results {
		results[string(k)] = v
	}
	lvl := slog.LevelInfo
	if rep.Err != nil {
		lvl = slog.LevelWarn
	}
	r.log.Log(ctx, lvl, "rebalance round", "why", rep.Why, "workers", rep.Workers, "connections", rep.Conns,
		"moves", len(rep.Plan.Moves), "minimum", rep.Plan.Min, "cap_reached", rep.Plan.CapReached,
		"cooling_reached", rep.Plan.Cooling, "over_capacity", rep.Plan.OverCapacity, "sent", rep.Sent,
		"accepted", rep.Accepted(), "results", results, "unreachable", rep.Unreachable,
		"read_units", rep.ReadUnits, "err", rep.Err)
}
