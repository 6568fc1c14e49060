package e2e

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/sockfleet/sockfleet/functions/reconciler/rebalance"
	"github.com/sockfleet/sockfleet/functions/reconciler/rounds"
	"github.com/sockfleet/sockfleet/shared/local/fleet"
	"github.com/sockfleet/sockfleet/shared/registry"
	"github.com/sockfleet/sockfleet/shared/wakeup"
)

// TestRebalanceGrowsAndShrinks grows a fleet of 3 workers holding 300 connections to
// 5, then shrinks it back to 3 by draining two (SIGTERM), with rebalance rounds in
// the reconciler and planned handoffs between the workers. It checks: every worker
// ends within its band (±10 % of the mean, functions/reconciler/rebalance) within
// 60 s of the new workers' start; the moves taken on are at most 1.1 × the minimum;
// no connection is moved twice within the cooling period; and at the sink, in arrival
// order, every connection's sequences follow one another with no gap and no
// duplicate, so never two deliverers at once (fleet.CheckSerial). The bench
// (-rebalance) runs the same scenario and reports its figures.
func TestRebalanceGrowsAndShrinks(t *testing.T) {
	// The default cooling (5 min): a drain's handoffs are forced moves and do not
	// start it, so the shrink is evened out by rounds at once, with the connections
	// no round moved in the last 5 minutes.
	const conns, capacity, cooling = 300, 200, rebalance.DefaultCooling
	col, err := fleet.NewCollector()
	if err != nil {
		t.Fatal(err)
	}
	defer col.Close()
	s := newStackWith(t, stackOpts{workers: 3, maxConns: capacity, rate: 1, rounds: &rounds.Config{Plan: rebalance.Config{Cooling: cooling}}, collector: col})
	ids := make([]string, conns)
	for i := range conns {
		ids[i] = fmt.Sprintf("rb%03d", i)
		s.put(ids[i], "STARTED")
	}
	s.waitFor("300 connections streaming", 60*time.Second, func() bool { return s.allStreaming(ids) })
	before := s.owners(ids)
	t.Logf("3 workers: %v", counts(before))

	// Grow to 5.
	grow := time.Now()
	s.addWorker(3)
	s.addWorker(4)
	s.waitFor("5 workers registered", 20*time.Second, func() bool { return len(s.live()) == 5 })
	minimum := s.minimum(before)
	s.waitFor("every worker within its band", 60*time.Second, func() bool {
		return s.allStreaming(ids) && s.inBand(s.owners(ids))
	})
	t.Logf("5 workers: %v, balanced %s after the new workers started (goal ≤ 60 s)", counts(s.owners(ids)),
		time.Since(grow).Round(time.Millisecond))
	accepted := s.acceptedMoves()
	t.Logf("moves taken on %d, minimum %d", accepted, minimum)
	if float64(accepted) > 1.1*float64(minimum) {
		t.Errorf("%d moves, over 1.1 × the minimum %d", accepted, minimum)
	}

	// Shrink to 3: ECS stops two tasks (one new, one old); they drain.
	for _, slot := range []int{3, 0} {
		p := s.sup.Get(slot)
		if err := s.sup.Signal(slot, syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case <-p.Done():
		case <-time.After(30 * time.Second):
			t.Fatalf("worker %s did not drain within 30 s", p.ID)
		}
	}
	shrunk := s.waitFor("3 workers left, every connection streaming once, each worker within its band", 60*time.Second, func() bool {
		return len(s.live()) == 3 && s.allStreaming(ids) && s.inBand(s.owners(ids))
	})
	t.Logf("3 workers again: %v, %s after both had drained", counts(s.owners(ids)), shrunk.Round(time.Millisecond))

	s.checkNoMoveTwiceWithinCooling(t, cooling)
	// Let the last deliveries reach the sinks, then check them.
	time.Sleep(time.Second)
	s.checkDeliveries(t, col, ids)
}

// addWorker starts a worker in a new slot.
func (s *stack) addWorker(slot int) {
	s.t.Helper()
	if _, err := s.sup.Start(context.Background(), slot, freePort(s.t)); err != nil {
		s.t.Fatal(err)
	}
	s.mu.Lock()
	s.n = max(s.n, slot+1)
	s.mu.Unlock()
}

// live is the live, non-draining workers in the registry.
func (s *stack) live() []string {
	ws, _, err := s.reg.List(context.Background())
	if err != nil {
		return nil
	}
	var out []string
	for _, w := range registry.Live(ws, time.Now()) {
		if !w.Draining {
			out = append(out, w.ID)
		}
	}
	return out
}

func (s *stack) allStreaming(ids []string) bool {
	for _, id := range ids {
		if !s.streaming(id) {
			return false
		}
	}
	return true
}

// owners maps each connection to its owner in the table ("" if none).
func (s *stack) owners(ids []string) map[string]string {
	out := map[string]string{}
	for _, id := range ids {
		out[id] = s.owner(id)
	}
	return out
}

func counts(owners map[string]string) map[string]int {
	out := map[string]int{}
	for _, o := range owners {
		out[o]++
	}
	return out
}

// planInput is the live workers and the connections as owned now.
func (s *stack) planInput(owners map[string]string) ([]rebalance.Worker, []rebalance.Conn) {
	var ws []rebalance.Worker
	for _, id := range s.live() {
		ws = append(ws, rebalance.Worker{ID: id, Capacity: s.cap})
	}
	var cs []rebalance.Conn
	for _, id := range slices.Sorted(maps.Keys(owners)) {
		cs = append(cs, rebalance.Conn{ID: id, Owner: owners[id]})
	}
	return ws, cs
}

// minimum is the fewest moves that balance the live workers from owners.
func (s *stack) minimum(owners map[string]string) int {
	ws, cs := s.planInput(owners)
	p, err := rebalance.Compute(ws, cs, time.Now(), rebalance.Config{MaxFraction: 1})
	if err != nil {
		s.t.Fatal(err)
	}
	return p.Min
}

// inBand reports whether every live worker holds a count within its band, and every
// connection is owned by a live worker.
func (s *stack) inBand(owners map[string]string) bool {
	ws, cs := s.planInput(owners)
	live := map[string]bool{}
	for _, w := range ws {
		live[w.ID] = true
	}
	for _, o := range owners {
		if !live[o] {
			return false
		}
	}
	band, err := rebalance.Band(ws, cs, rebalance.Config{})
	if err != nil {
		return false
	}
	n := counts(owners)
	for id, b := range band {
		if n[id] < b[0] || n[id] > b[1] {
			return false
		}
	}
	return true
}

func (s *stack) acceptedMoves() int {
	s.sender.mu.Lock()
	defer s.sender.mu.Unlock()
	n := 0
	for _, h := range s.sender.handoffs {
		if h.result == wakeup.HandingOff {
			n++
		}
	}
	return n
}

// checkNoMoveTwiceWithinCooling: from the handoffs sent, and the moved_at_ms the
// handoffs wrote, no connection was asked to move twice within cooling.
func (s *stack) checkNoMoveTwiceWithinCooling(t *testing.T, cooling time.Duration) {
	s.sender.mu.Lock()
	last := map[string]time.Time{}
	for _, h := range s.sender.handoffs {
		if at, ok := last[h.conn.ID]; ok && h.at.Sub(at) < cooling {
			t.Errorf("%s asked to move at %s and again at %s", h.conn.ID, at.Format(time.StampMilli), h.at.Format(time.StampMilli))
		}
		last[h.conn.ID] = h.at
	}
	s.sender.mu.Unlock()
	moved := 0
	for id, at := range last {
		c, err := s.store.Get(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if c.MovedAtMs != 0 {
			moved++
			if m := time.UnixMilli(c.MovedAtMs); m.Before(at.Add(-time.Second)) {
				t.Errorf("%s: moved_at_ms %s before the handoff was sent at %s", id, m, at)
			}
		}
	}
	t.Logf("%d connections asked to move, %d carry moved_at_ms", len(last), moved)
}

// checkDeliveries: for every connection, in arrival order at the sink across all
// workers, every sequence is the one after the previous (no gap, no duplicate, so
// never two deliverers: fleet.CheckSerial); two upstream sockets at once only for
// a handoff's short overlap.
func (s *stack) checkDeliveries(t *testing.T, col *fleet.Collector, ids []string) {
	r := col.CheckPlanned(ids, nil)
	for _, err := range r.Problems {
		t.Error(err)
	}
	t.Log(r)
	for id, o := range fleet.Overlaps(s.up.Events()) {
		if o.Longest > 2*time.Second {
			t.Errorf("%s: two upstream clients at once for %s", id, o.Longest)
		}
	}
}
