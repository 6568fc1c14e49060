package rebalance

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)

// fleetOf builds workers w0.. with the given capacities and counts, the
// connections named after their owner; none was ever moved.
func fleetOf(caps, counts []int) ([]Worker, []Conn) {
	var ws []Worker
	var cs []Conn
	for i, c := range caps {
		id := fmt.Sprintf("w%d", i)
		ws = append(ws, Worker{ID: id, Capacity: c})
		for j := range counts[i] {
			cs = append(cs, Conn{ID: fmt.Sprintf("%s-c%03d", id, j), Owner: id})
		}
	}
	return ws, cs
}

// apply makes the moves and returns the connections per worker after them.
func apply(t *testing.T, ws []Worker, cs []Conn, p Plan, now time.Time) map[string]int {
	t.Helper()
	at := map[string]int{}
	for i, c := range cs {
		at[c.ID] = i
	}
	draining := map[string]bool{}
	for _, w := range ws {
		draining[w.ID] = w.Draining
	}
	for _, m := range p.Moves {
		i, ok := at[m.Conn]
		switch {
		case !ok:
			t.Fatalf("move of unknown connection %+v", m)
		case cs[i].Owner != m.From:
			t.Fatalf("move %+v: the connection is owned by %s", m, cs[i].Owner)
		case draining[m.To]:
			t.Fatalf("move %+v targets a draining worker", m)
		case draining[m.From]:
			t.Fatalf("move %+v takes from a draining worker (its drain releases it)", m)
		case m.From == m.To:
			t.Fatalf("move %+v to itself", m)
		}
		cs[i].Owner, cs[i].MovedAt = m.To, now
	}
	n := map[string]int{}
	for _, c := range cs {
		n[c.Owner]++
	}
	return n
}

func TestCompute(t *testing.T) {
	cases := []struct {
		name        string
		caps, count []int
		wantMoves   int
		wantMin     int
		capReached  bool
		over        bool
		after       []int // counts after the round; nil: not checked
	}{
		{name: "balanced", caps: []int{100, 100, 100}, count: []int{10, 10, 10}, after: []int{10, 10, 10}},
		{name: "within 10 percent is left alone", caps: []int{100, 100, 100}, count: []int{11, 10, 9}, after: []int{11, 10, 9}},
		{name: "empty fleet", caps: []int{100, 100}, count: []int{0, 0}},
		// 30 on one of 3: bands [9, 11]; E = 19 > D = 18, so the minimum is 19, but
		// a round moves at most ⌈10 % of 30⌉ = 3.
		{name: "burst on one worker, capped", caps: []int{100, 100, 100}, count: []int{30, 0, 0},
			wantMoves: 3, wantMin: 19, capReached: true, after: []int{27, 2, 1}},
		// Scale-out 3 → 5: t = 60, bands [54, 66]: E = 102, D = 108; cap 30.
		{name: "scale-out from 3 to 5", caps: []int{200, 200, 200, 200, 200}, count: []int{100, 100, 100, 0, 0},
			wantMoves: 30, wantMin: 108, capReached: true},
		// Capacities 10 and 30, 40 held: shares 10 and 30, bands [9, 10] and [27, 30]
		// (never above capacity), so the worker over its capacity gives 10.
		{name: "in proportion to capacity", caps: []int{10, 30}, count: []int{0, 40},
			wantMoves: 4, wantMin: 10, capReached: true, after: []int{4, 36}},
		// Bands [45, 55]: the round stops at the edge of the band (damped).
		{name: "small imbalance", caps: []int{100, 100}, count: []int{60, 40},
			wantMoves: 5, wantMin: 5, after: []int{55, 45}},
		// t = 4.4 each: no set of counts of 4 adds up to 22, so the bands are [4, 5].
		{name: "narrow band widened to the exact share", caps: []int{10, 10, 10, 10, 10}, count: []int{10, 10, 2, 0, 0},
			wantMoves: 3, wantMin: 10, capReached: true},
		// More held than the capacity: no room anywhere, nothing planned.
		{name: "over capacity", caps: []int{10, 10}, count: []int{20, 5}, over: true, after: []int{20, 5}},
		// A small fleet can still move one a round (⌈10 % of 3⌉ = 1).
		{name: "cap rounds up", caps: []int{10, 10, 10}, count: []int{3, 0, 0}, wantMoves: 1, wantMin: 2, capReached: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ws, cs := fleetOf(tc.caps, tc.count)
			p, err := Compute(ws, cs, t0, Config{})
			if err != nil {
				t.Fatal(err)
			}
			if p.OverCapacity != tc.over {
				t.Errorf("over capacity %v, want %v", p.OverCapacity, tc.over)
			}
			if len(p.Moves) != tc.wantMoves || p.Min != tc.wantMin || p.CapReached != tc.capReached || p.Cooling {
				t.Fatalf("plan: %d moves, min %d, cap %v, cooling %v; want %d, %d, %v, false",
					len(p.Moves), p.Min, p.CapReached, p.Cooling, tc.wantMoves, tc.wantMin, tc.capReached)
			}
			n := apply(t, ws, cs, p, t0)
			if tc.after != nil {
				for i, want := range tc.after {
					if got := n[fmt.Sprintf("w%d", i)]; got != want {
						t.Errorf("w%d holds %d after the round, want %d (all %v)", i, got, want, n)
					}
				}
			}
		})
	}
}

func TestDrainingNeitherGivesNorTakes(t *testing.T) {
	ws, cs := fleetOf([]int{100, 100, 100}, []int{40, 0, 20})
	ws[1].Draining = true // idle, but draining: never a target
	ws[2].Draining = true // its 20 leave by the drain, not by a move
	p, err := Compute(ws, cs, t0, Config{MaxFraction: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Moves) != 0 || p.Min != 0 {
		t.Errorf("plan %+v: the only live, non-draining worker holds everything it can", p)
	}
	ws, cs = fleetOf([]int{100, 100, 100}, []int{40, 0, 20})
	ws[2].Draining = true
	p, _ = Compute(ws, cs, t0, Config{MaxFraction: 1})
	n := apply(t, ws, cs, p, t0)
	// w0 and w1 share 40: bands [18, 22], so 18 moves, stopping at the band's edge.
	if n["w0"] != 22 || n["w1"] != 18 || n["w2"] != 20 || len(p.Moves) != 18 {
		t.Errorf("after %d moves: %v; want w0 22, w1 18, w2 (draining) untouched", len(p.Moves), n)
	}
}

func TestCoolingBlocksAndOldestMovesFirst(t *testing.T) {
	ws, cs := fleetOf([]int{100, 100}, []int{20, 0})
	for i := range cs {
		cs[i].MovedAt = t0.Add(-time.Minute) // all moved a minute ago
	}
	p, err := Compute(ws, cs, t0, Config{MaxFraction: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Moves) != 0 || !p.Cooling || p.Min != 9 {
		t.Errorf("plan %+v: everything is cooling", p)
	}
	cs[5].MovedAt = time.Time{}              // never moved
	cs[7].MovedAt = t0.Add(-6 * time.Minute) // cooled down
	p, _ = Compute(ws, cs, t0, Config{MaxFraction: 1})
	if len(p.Moves) != 2 || !p.Cooling || p.Moves[0].Conn != cs[5].ID || p.Moves[1].Conn != cs[7].ID {
		t.Errorf("plan %+v: want the never-moved one, then the one moved 6 min ago, then blocked", p)
	}
	// After the cooling period everything may move again.
	p, _ = Compute(ws, cs, t0.Add(4*time.Minute), Config{MaxFraction: 1})
	if len(p.Moves) != 9 || p.Cooling {
		t.Errorf("plan %+v: want the full 9 once cooled", p)
	}
	// A shorter cooling period is honoured.
	p, _ = Compute(ws, cs, t0, Config{MaxFraction: 1, Cooling: 30 * time.Second})
	if len(p.Moves) != 9 {
		t.Errorf("with 30 s cooling: %d moves, want 9", len(p.Moves))
	}
}

func TestRateBreaksTies(t *testing.T) {
	ws, cs := fleetOf([]int{100, 100, 100, 100}, []int{30, 30, 0, 0})
	ws[0].Rate, ws[1].Rate = 5, 50 // w1 is busier per connection: it gives first
	ws[2].Rate, ws[3].Rate = 9, 1  // w3 is quieter: it takes first
	p, err := Compute(ws, cs, t0, Config{})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Moves) == 0 || p.Moves[0].From != "w1" || p.Moves[0].To != "w3" {
		t.Errorf("first move %+v, want w1 → w3", p.Moves)
	}
}

func TestUnknownOwnerLeftAlone(t *testing.T) {
	ws, cs := fleetOf([]int{10, 10}, []int{4, 4})
	cs = append(cs, Conn{ID: "orphan", Owner: "gone"})
	p, err := Compute(ws, cs, t0, Config{})
	if err != nil || len(p.Moves) != 0 {
		t.Errorf("plan %+v, %v: a connection of a worker not listed is not ours to move", p, err)
	}
}

func TestBadInput(t *testing.T) {
	ok := []Worker{{ID: "a", Capacity: 1}}
	cases := []struct {
		name string
		ws   []Worker
		cs   []Conn
		cfg  Config
	}{
		{"empty worker id", []Worker{{Capacity: 1}}, nil, Config{}},
		{"worker twice", []Worker{{ID: "a", Capacity: 1}, {ID: "a", Capacity: 2}}, nil, Config{}},
		{"draining worker twice", []Worker{{ID: "a", Draining: true}, {ID: "a", Capacity: 2}}, nil, Config{}},
		{"negative capacity", []Worker{{ID: "a", Capacity: -1}}, nil, Config{}},
		{"negative rate", []Worker{{ID: "a", Capacity: 1, Rate: -1}}, nil, Config{}},
		{"rate not a number", []Worker{{ID: "a", Capacity: 1, Rate: math.NaN()}}, nil, Config{}},
		{"rate infinite", []Worker{{ID: "a", Capacity: 1, Rate: math.Inf(1)}}, nil, Config{}},
		{"empty connection id", ok, []Conn{{Owner: "a"}}, Config{}},
		{"connection twice", ok, []Conn{{ID: "x", Owner: "a"}, {ID: "x", Owner: "a"}}, Config{}},
		{"tolerance 1", ok, nil, Config{Tolerance: 1}},
		{"negative tolerance", ok, nil, Config{Tolerance: -0.1}},
		{"max fraction over 1", ok, nil, Config{MaxFraction: 1.5}},
		{"max fraction not a number", ok, nil, Config{MaxFraction: math.NaN()}},
		{"negative cooling", ok, nil, Config{Cooling: -time.Second}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Compute(tc.ws, tc.cs, t0, tc.cfg)
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Compute = %+v, %v; want ErrInvalid", p, err)
			}
			if len(p.Moves) != 0 {
				t.Errorf("a plan came with the error: %+v", p)
			}
			if _, err := Band(tc.ws, tc.cs, tc.cfg); !errors.Is(err, ErrInvalid) {
				t.Errorf("Band = %v; want ErrInvalid", err)
			}
		})
	}
}
