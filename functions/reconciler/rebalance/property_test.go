package rebalance

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// exactBands computes each non-draining worker's band independently of the
// package, in integers: m is within ±10 % of the share t = C·cap/K when
// 9·C·cap ≤ 10·m·K ≤ 11·C·cap; where no such m lies on one side of t, ⌊t⌋ or ⌈t⌉
// is allowed; never above capacity. A fleet over its capacity keeps what it holds.
func exactBands(ws []Worker, n map[string]int) map[string][2]int {
	var held, capacity int
	for _, w := range ws {
		if !w.Draining && w.Capacity > 0 {
			held += n[w.ID]
			capacity += w.Capacity
		}
	}
	out := map[string][2]int{}
	if capacity == 0 || held > capacity {
		for _, w := range ws {
			if !w.Draining && w.Capacity > 0 {
				out[w.ID] = [2]int{n[w.ID], n[w.ID]}
			}
		}
		return out
	}
	for _, w := range ws {
		if w.Draining || w.Capacity == 0 {
			continue
		}
		share := held * w.Capacity // t = share / capacity
		lo := (9*share + 10*capacity - 1) / (10 * capacity)
		hi := (11 * share) / (10 * capacity)
		lo = min(lo, share/capacity)
		hi = max(hi, (share+capacity-1)/capacity)
		hi = min(hi, w.Capacity)
		out[w.ID] = [2]int{lo, hi}
	}
	return out
}

// minMoves is the fewest moves that bring every count within its band, by dynamic
// programming over the target counts (not by the package's max(E, D) formula): a
// target m (Σ m = Σ n) costs Σ max(0, n_i − m_i) moves.
func minMoves(ws []Worker, n map[string]int, bands map[string][2]int) int {
	var ids []string
	total := 0
	for _, w := range ws {
		if _, ok := bands[w.ID]; ok {
			ids = append(ids, w.ID)
			total += n[w.ID]
		}
	}
	const inf = math.MaxInt / 2
	best := make([]int, total+1) // best[s]: cheapest targets so far summing to s
	for s := range best {
		best[s] = inf
	}
	best[0] = 0
	for _, id := range ids {
		next := make([]int, total+1)
		for s := range next {
			next[s] = inf
		}
		b := bands[id]
		for s, c := range best {
			if c == inf {
				continue
			}
			for m := b[0]; m <= b[1] && s+m <= total; m++ {
				next[s+m] = min(next[s+m], c+max(0, n[id]-m))
			}
		}
		best = next
	}
	return best[total]
}

// randomFleet draws a fleet from seed: 1 to 12 workers of capacity 1 to 200 (some
// draining), connections up to their capacity spread unevenly, some (in a third
// of the fleets, all) moved in the last 10 minutes.
func randomFleet(seed uint64) ([]Worker, []Conn) {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	var ws []Worker
	var cs []Conn
	recently := 4 // one connection in recently was moved in the last 10 min
	if r.IntN(3) == 0 {
		recently = 1 // a fleet that a rebalance just went through
	}
	for i := range 1 + r.IntN(12) {
		w := Worker{ID: fmt.Sprintf("w%02d", i), Capacity: 1 + r.IntN(200), Draining: r.IntN(6) == 0}
		if r.IntN(3) == 0 {
			w.Rate = float64(r.IntN(100))
		}
		ws = append(ws, w)
		// Skewed: many workers empty (just started), some full.
		held := 0
		switch r.IntN(3) {
		case 1:
			held = r.IntN(w.Capacity + 1)
		case 2:
			held = w.Capacity
		}
		for j := range held {
			c := Conn{ID: fmt.Sprintf("%s-%03d", w.ID, j), Owner: w.ID}
			if r.IntN(recently) == 0 {
				c.MovedAt = t0.Add(-time.Duration(r.IntN(600)) * time.Second)
			}
			cs = append(cs, c)
		}
	}
	return ws, cs
}

// checkRounds plans rounds until the fleet is balanced, advancing the clock a
// minute a round, and checks every round against the independent computations.
// It returns what happened, so the caller can check the draws did exercise it.
func checkRounds(t *testing.T, seed uint64) (st stats) {
	ws, cs := randomFleet(seed)
	count := func() map[string]int {
		n := map[string]int{}
		for _, c := range cs {
			n[c.Owner]++
		}
		return n
	}
	n := count()
	bands := exactBands(ws, n)
	if got, err := Band(ws, cs, Config{}); err != nil || fmt.Sprint(got) != fmt.Sprint(bands) {
		t.Fatalf("seed %d: Band = %v, %v; the exact bands are %v", seed, got, err, bands)
	}
	want := minMoves(ws, n, bands)
	lastMoved := map[string]time.Time{}
	for _, c := range cs {
		lastMoved[c.ID] = c.MovedAt
	}
	capPerRound := int(math.Ceil(0.1 * float64(len(cs))))
	now, moves := t0, 0
	for round := 0; ; round++ {
		if round > 200 {
			t.Fatalf("seed %d: not balanced after 200 rounds: %v, bands %v", seed, count(), bands)
		}
		p, err := Compute(ws, cs, now, Config{})
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		left := minMoves(ws, n, bands)
		switch {
		case p.Min != left:
			t.Fatalf("seed %d round %d: plan says %d moves are needed; dynamic programming says %d", seed, round, p.Min, left)
		case len(p.Moves) > left:
			t.Fatalf("seed %d round %d: %d moves, more than the minimum %d", seed, round, len(p.Moves), left)
		case len(p.Moves) > capPerRound:
			t.Fatalf("seed %d round %d: %d moves over the cap %d", seed, round, len(p.Moves), capPerRound)
		case len(p.Moves) < left && !p.CapReached && !p.Cooling:
			t.Fatalf("seed %d round %d: stopped at %d of %d moves with neither cap nor cooling", seed, round, len(p.Moves), left)
		}
		for _, m := range p.Moves {
			if prev := lastMoved[m.Conn]; !prev.IsZero() && now.Sub(prev) < DefaultCooling {
				t.Fatalf("seed %d round %d: %s moved again %s after its last move", seed, round, m.Conn, now.Sub(prev))
			}
			lastMoved[m.Conn] = now
		}
		st.rounds++
		st.capped += boolInt(p.CapReached)
		st.cooled += boolInt(p.Cooling)
		before := n
		n = apply(t, ws, cs, p, now)
		moves += len(p.Moves)
		for id, b := range bands {
			// Damped: nobody crosses its band, nor moves away from it.
			switch x, y := before[id], n[id]; {
			case x > b[1] && (y > x || y < b[0]),
				x < b[0] && (y < x || y > b[1]),
				x >= b[0] && x <= b[1] && (y < b[0] || y > b[1]):
				t.Fatalf("seed %d round %d: %s went from %d to %d, band %v", seed, round, id, x, y, b)
			}
		}
		for _, w := range ws {
			if w.Draining && n[w.ID] != before[w.ID] {
				t.Fatalf("seed %d: draining %s changed from %d to %d", seed, w.ID, before[w.ID], n[w.ID])
			}
		}
		if p.Min == 0 {
			break
		}
		now = now.Add(time.Minute)
	}
	// Balanced: every worker within ±10 % of the mean utilisation, or within one
	// connection of its exact share.
	var held, capacity int
	for _, w := range ws {
		if !w.Draining && w.Capacity > 0 {
			held += n[w.ID]
			capacity += w.Capacity
		}
	}
	for _, w := range ws {
		if w.Draining || capacity == 0 {
			continue
		}
		share := float64(held) * float64(w.Capacity) / float64(capacity)
		x := float64(n[w.ID])
		if math.Abs(x-share) > 0.1*share+1e-9 && math.Abs(x-share) >= 1 {
			t.Fatalf("seed %d: %s ends with %d, share %.2f", seed, w.ID, n[w.ID], share)
		}
	}
	// Every move lowered what was left to do by one, so all the rounds together
	// made exactly the minimum computed at the start.
	if moves != want {
		t.Fatalf("seed %d: %d moves over all rounds, minimum %d", seed, moves, want)
	}
	st.moves = moves
	return st
}

type stats struct{ rounds, moves, capped, cooled int }

func TestRoundsOnRandomFleets(t *testing.T) {
	var sum stats
	balancedAtOnce := 0
	for seed := range uint64(500) {
		st := checkRounds(t, seed)
		sum.rounds += st.rounds
		sum.moves += st.moves
		sum.capped += st.capped
		sum.cooled += st.cooled
		balancedAtOnce += boolInt(st.moves == 0)
	}
	t.Logf("500 fleets: %d rounds, %d moves, %d rounds stopped by the cap, %d by cooling, %d fleets balanced from the start",
		sum.rounds, sum.moves, sum.capped, sum.cooled, balancedAtOnce)
	// The draws must exercise the cap and cooling, or the test proves little.
	if sum.capped == 0 || sum.cooled == 0 || balancedAtOnce > 250 {
		t.Errorf("the random fleets do not exercise the planner: %+v, %d balanced from the start", sum, balancedAtOnce)
	}
}

func FuzzRounds(f *testing.F) {
	for _, s := range []uint64{0, 1, 7, 42, 1 << 40} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, seed uint64) { _ = checkRounds(t, seed) })
}
