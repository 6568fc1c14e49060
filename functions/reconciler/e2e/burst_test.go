package e2e

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/sockfleet/sockfleet/functions/reconciler/dispatch"
	"github.com/sockfleet/sockfleet/shared/schema"
)

// TestBurstSpreadsAcrossInvocations adds 30 connections onto 3 idle workers, one
// every 100 ms, and then as fast as the table takes them. The workers run the
// default 20 s renew interval, so the registry still shows every worker idle when
// the burst ends, and the adds reach the reconciler in many stream batches: only
// what the wakeup replies reported (the delivery's memory) can spread them. Each
// worker must end with 10 ± 1.
func TestBurstSpreadsAcrossInvocations(t *testing.T) {
	for _, gap := range []time.Duration{100 * time.Millisecond, 0} {
		t.Run(fmt.Sprintf("one every %s", gap), func(t *testing.T) { burst(t, gap) })
	}
}

func burst(t *testing.T, gap time.Duration) {
	const workers, n = 3, 30
	// The default wakeup timeout: a wakeup that times out on a loaded machine is
	// re-routed and its reply (the load) lost, which this test is not about.
	s := newStackOf(t, workers, 100, dispatch.DefaultWakeupTimeout)
	ids := make([]string, n)
	start := time.Now()
	for i := range n {
		ids[i] = fmt.Sprintf("b%02d", i)
		s.put(ids[i], schema.Started)
		time.Sleep(gap)
	}
	added := time.Since(start)
	s.waitFor("all streaming", 10*time.Second, func() bool {
		for _, id := range ids {
			if !s.streaming(id) || s.owner(id) == "" {
				return false
			}
		}
		return true
	})
	per := map[string]int{}
	for _, id := range ids {
		per[s.owner(id)]++
	}
	ws := slices.Sorted(maps.Keys(per))
	counts := make([]int, 0, workers)
	for _, w := range ws {
		counts = append(counts, per[w])
	}
	t.Logf("%d adds in %s over %d stream batches: per worker %v %v", n, added.Round(time.Millisecond), s.poller.Invocations(), ws, counts)
	if len(per) != workers {
		t.Errorf("%d workers got connections, want %d: %v", len(per), workers, per)
	}
	for w, c := range per {
		if c < n/workers-1 || c > n/workers+1 {
			t.Errorf("worker %s holds %d, want %d ± 1 (all: %v)", w, c, n/workers, per)
		}
	}
	for _, id := range ids {
		if st := s.up.Stats(id); st.MaxClients > 1 {
			t.Errorf("%s streamed by two workers at once: %+v", id, st)
		}
	}
}
