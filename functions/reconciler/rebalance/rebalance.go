// Package rebalance plans a rebalancing round: which connections to move from which
// worker to which, so that every worker ends near the mean utilisation with as few
// moves as possible. It is pure logic: it reads nothing and writes nothing. The
// reconciler's rebalance rounds (functions/reconciler/rounds) call it and send the
// moves to the owners as handoff wakeups.
//
// # The target
//
// Only workers that are not draining and have a capacity count. Their mean
// utilisation is u = C / K, C being the connections they hold and K their summed
// capacity. Worker i's exact share is t_i = u·cap_i, and its band is the whole
// numbers of connections within ±Tolerance (10 %) of it: [⌈0.9·t_i⌉, ⌊1.1·t_i⌋],
// never above its capacity. Where that band holds no whole number on one side of
// t_i (t_i = 4.4 gives [4, 4]), it is widened to ⌊t_i⌋ and ⌈t_i⌉: five such workers
// hold 22 connections, which no set of counts of 4 can add up to. So the promise
// is "within ±10 % of the mean, or within one connection of the exact share", and
// the bands always admit a solution: Σ lo ≤ Σ ⌊t_i⌋ ≤ C ≤ Σ ⌈t_i⌉ ≤ Σ hi.
//
// A fleet holding more than its capacity is not rebalanced: there is no room.
//
// Draining workers are neither donors nor targets: their drain releases their
// connections, which the reconciler then places on the least loaded live workers.
// A connection whose owner is draining or not listed is left alone.
//
// # The algorithm, and why it is minimal
//
// Let E = Σ max(0, n_i − hi_i) be the connections above the bands and D =
// Σ max(0, lo_i − n_i) the places missing below them. A move changes two counts by
// one, so it lowers E by at most one and D by at most one: no plan needs fewer than
// M = max(E, D) moves. Compute makes only moves that lower max(E, D) by exactly one:
//
//   - over → under (a worker above its band to one below it), which lowers both;
//   - else, if E > D, over → a worker within its band with room below hi;
//   - else, if D > E, a worker within its band above lo → under.
//
// Without cooling or a cap such a move always exists until E = D = 0 (if E > D = 0
// the workers not over have Σ (hi − n) ≥ E of room since Σ hi ≥ C; the case D > E
// is symmetric), so a round makes exactly M moves: the minimum, not an
// approximation of it. With cooling or the cap, a round makes fewer, never more,
// and since each of its moves still lowers max(E, D) by one, successive rounds
// (with no connection added or removed between them) make exactly M moves in all.
// Donors are taken most utilised first and receivers least utilised first (ties:
// higher measured rate gives first, lower rate receives first, then by id).
//
// # Damping, cooling and the cap
//
//   - No worker crosses its band: a donor gives only down to hi (or, as a within
//     band donor, down to lo), a receiver takes only up to lo (or hi). So a round
//     never overshoots and repeated rounds do not oscillate.
//   - A connection moved less than Cooling (default 5 min) ago is not moved; of a
//     donor's movable connections, the one moved longest ago (or never) goes first.
//   - A round makes at most ⌈MaxFraction · connections⌉ moves (default 10 % of all
//     the connections given, rounded up so a small fleet can still move one).
//
// Plan reports the minimum M and why it stopped short of it (cap or cooling).
//
// Measured load (Worker.Rate, e.g. messages per second) only breaks ties. Balancing
// it exactly would be bin packing (NP-hard), and the minimality argument above holds
// for counts against capacity, which is what a worker's capacity limits.
package rebalance

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

// Defaults.
const (
	DefaultTolerance   = 0.10
	DefaultMaxFraction = 0.10
	DefaultCooling     = 5 * time.Minute
)

// Worker is one live worker.
type Worker struct {
	ID       string
	Capacity int
	Draining bool
	// Rate is an optional measured load (messages per second, say); 0 if unknown.
	// It only breaks ties between equally utilised workers.
	Rate float64
}

// Conn is one owned connection.
type Conn struct {
	ID      string
	Owner   string
	MovedAt time.Time // when a rebalance last moved it; zero if never
}

// Move hands connection Conn from worker From to worker To.
type Move struct {
	Conn, From, To string
}

// Config tunes a round. Zero values take the defaults.
type Config struct {
	Tolerance   float64       // band around the mean utilisation, as a fraction of it
	MaxFraction float64       // moves per round, as a fraction of the connections
	Cooling     time.Duration // a moved connection stays put this long
}

// Plan is one round.
type Plan struct {
	Moves []Move
	// Min is the fewest moves that bring every worker within its band, ignoring
	// cooling and the cap: max(E, D) in the package doc. len(Moves) ≤ Min.
	Min int
	// CapReached: the round stopped at the cap. Cooling: it stopped short because
	// every connection that could have been moved is cooling.
	CapReached bool
	Cooling    bool
	// OverCapacity: the workers that take part hold more than their summed
	// capacity, so there is no room to move anything to; nothing is planned (more
	// workers are the remedy, and the next round balances them in).
	OverCapacity bool
}

// Balanced reports whether the plan, once made, leaves every worker in its band.
func (p Plan) Balanced() bool { return len(p.Moves) == p.Min }

// Errors.
var ErrInvalid = errors.New("rebalance: invalid input")

// Band returns, for each non-draining worker with a capacity, the whole numbers of
// connections [lo, hi] it should end within, given what those workers hold now.
func Band(workers []Worker, conns []Conn, cfg Config) (map[string][2]int, error) {
	f, err := newFleet(workers, conns, cfg)
	if err != nil {
		return nil, err
	}
	out := make(map[string][2]int, len(f.ws))
	for _, w := range f.ws {
		out[w.ID] = [2]int{w.lo, w.hi}
	}
	return out, nil
}

// Compute plans one round at now. Bad input (empty or repeated ids, negative
// capacity, a rate that is negative or not a number, bad config) is an error, and
// then there is no plan.
func Compute(workers []Worker, conns []Conn, now time.Time, cfg Config) (Plan, error) {
	f, err := newFleet(workers, conns, cfg)
	if err != nil {
		return Plan{}, err
	}
	var e, d int
	for _, w := range f.ws {
		e += max(0, w.n-w.hi)
		d += max(0, w.lo-w.n)
	}
	p := Plan{Min: max(e, d), OverCapacity: f.overCapacity}
	budget := int(math.Ceil(f.cfg.MaxFraction * float64(len(conns))))
	for e > 0 || d > 0 {
		if len(p.Moves) >= budget {
			p.CapReached = true
			break
		}
		from, to := f.pick(e, d, now)
		if from == nil {
			p.Cooling = true
			break
		}
		c := from.take()
		e -= boolInt(from.n > from.hi)
		d -= boolInt(to.n < to.lo)
		from.n--
		to.n++
		p.Moves = append(p.Moves, Move{Conn: c, From: from.ID, To: to.ID})
	}
	return p, nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

type fleet struct {
	cfg          Config
	ws           []*worker
	overCapacity bool
}

type worker struct {
	Worker
	n, lo, hi int
	movable   []Conn // not yet taken, the longest unmoved first
}

func newFleet(workers []Worker, conns []Conn, cfg Config) (*fleet, error) {
	if cfg.Tolerance == 0 {
		cfg.Tolerance = DefaultTolerance
	}
	if cfg.MaxFraction == 0 {
		cfg.MaxFraction = DefaultMaxFraction
	}
	if cfg.Cooling == 0 {
		cfg.Cooling = DefaultCooling
	}
	switch {
	case !(cfg.Tolerance > 0 && cfg.Tolerance < 1):
		return nil, fmt.Errorf("%w: tolerance %v, want in (0, 1)", ErrInvalid, cfg.Tolerance)
	case !(cfg.MaxFraction > 0 && cfg.MaxFraction <= 1):
		return nil, fmt.Errorf("%w: max fraction %v, want in (0, 1]", ErrInvalid, cfg.MaxFraction)
	case cfg.Cooling < 0:
		return nil, fmt.Errorf("%w: cooling %s is negative", ErrInvalid, cfg.Cooling)
	}
	f := &fleet{cfg: cfg}
	byID := map[string]*worker{}
	draining := map[string]bool{}
	for _, w := range workers {
		switch {
		case w.ID == "":
			return nil, fmt.Errorf("%w: worker with an empty id", ErrInvalid)
		case byID[w.ID] != nil || draining[w.ID]:
			return nil, fmt.Errorf("%w: worker %s listed twice", ErrInvalid, w.ID)
		case w.Capacity < 0:
			return nil, fmt.Errorf("%w: worker %s: capacity %d is negative", ErrInvalid, w.ID, w.Capacity)
		case math.IsNaN(w.Rate) || math.IsInf(w.Rate, 0) || w.Rate < 0:
			return nil, fmt.Errorf("%w: worker %s: rate %v", ErrInvalid, w.ID, w.Rate)
		}
		if w.Draining || w.Capacity == 0 {
			draining[w.ID] = true // neither gives nor takes
			continue
		}
		s := &worker{Worker: w}
		f.ws = append(f.ws, s)
		byID[w.ID] = s
	}
	seen := map[string]bool{}
	for _, c := range conns {
		switch {
		case c.ID == "":
			return nil, fmt.Errorf("%w: connection with an empty id", ErrInvalid)
		case seen[c.ID]:
			return nil, fmt.Errorf("%w: connection %s listed twice", ErrInvalid, c.ID)
		}
		seen[c.ID] = true
		if w := byID[c.Owner]; w != nil {
			w.n++
			w.movable = append(w.movable, c)
		}
	}
	var held, capacity int
	for _, w := range f.ws {
		held += w.n
		capacity += w.Capacity
		slices.SortFunc(w.movable, func(a, b Conn) int {
			if c := a.MovedAt.Compare(b.MovedAt); c != 0 {
				return c
			}
			return cmp.Compare(a.ID, b.ID)
		})
	}
	if capacity == 0 || held > capacity {
		// Nowhere to move to (or nobody to move): every band is what is held.
		f.overCapacity = held > capacity
		for _, w := range f.ws {
			w.lo, w.hi = w.n, w.n
		}
		return f, nil
	}
	u := float64(held) / float64(capacity)
	for _, w := range f.ws {
		t := u * float64(w.Capacity)
		w.lo = min(int(math.Ceil((1-cfg.Tolerance)*t-eps)), int(math.Floor(t+eps)))
		w.hi = max(int(math.Floor((1+cfg.Tolerance)*t+eps)), int(math.Ceil(t-eps)))
		w.hi = min(w.hi, w.Capacity) // ⌈t⌉ ≤ capacity since u ≤ 1, so lo ≤ hi still
	}
	return f, nil
}

// eps absorbs float error in u·capacity (u = 1/3 times 3 is not quite 1).
const eps = 1e-9

// pick chooses the next move's donor and receiver under the rules of the package
// doc, or nil, nil if none is allowed (every candidate donor's connections cool).
func (f *fleet) pick(e, d int, now time.Time) (from, to *worker) {
	over := func(w *worker) bool { return w.n > w.hi }
	under := func(w *worker) bool { return w.n < w.lo }
	canGive := func(w *worker) bool { return w.movable1(now, f.cfg.Cooling) }
	type rule struct{ give, take func(*worker) bool }
	rules := []rule{{over, under}}
	if e > d {
		rules = append(rules, rule{over, func(w *worker) bool { return !over(w) && w.n < w.hi }})
	}
	if d > e {
		rules = append(rules, rule{func(w *worker) bool { return !under(w) && w.n > w.lo }, under})
	}
	for _, r := range rules {
		to = f.best(r.take, func(a, b *worker) bool {
			c := utilCmp(a, b)
			return c < 0 || c == 0 && lessRate(a, b)
		})
		if to == nil {
			continue
		}
		from = f.best(func(w *worker) bool { return w != to && r.give(w) && canGive(w) }, func(a, b *worker) bool {
			c := utilCmp(a, b)
			return c > 0 || c == 0 && lessRate(b, a)
		})
		if from != nil {
			return from, to
		}
	}
	return nil, nil
}

// best returns the worker ok accepts that no other accepted one is better than.
func (f *fleet) best(ok func(*worker) bool, better func(a, b *worker) bool) *worker {
	var b *worker
	for _, w := range f.ws {
		if ok(w) && (b == nil || better(w, b)) {
			b = w
		}
	}
	return b
}

// lessRate: a ranks before b as a receiver, and after it as a donor (lower
// measured rate, then lower id).
func lessRate(a, b *worker) bool {
	if a.Rate != b.Rate {
		return a.Rate < b.Rate
	}
	return a.ID < b.ID
}

// utilCmp compares n_a/cap_a with n_b/cap_b without division.
func utilCmp(a, b *worker) int { return cmp.Compare(a.n*b.Capacity, b.n*a.Capacity) }

// movable1 reports whether w has a connection that may move now.
func (w *worker) movable1(now time.Time, cooling time.Duration) bool {
	return len(w.movable) > 0 && !cools(w.movable[0], now, cooling)
}

// take removes and returns w's connection moved longest ago; movable1 was true.
func (w *worker) take() string {
	c := w.movable[0]
	w.movable = w.movable[1:]
	return c.ID
}

func cools(c Conn, now time.Time, cooling time.Duration) bool {
	return !c.MovedAt.IsZero() && now.Sub(c.MovedAt) < cooling
}
