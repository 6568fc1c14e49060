package fleet_test

import (
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/sockfleet/sockfleet/shared/fleet"
)

// TestRollingDeploy replaces every worker of a 3-worker fleet holding 30
// connections, one at a time, with SIGTERM: each drain hands its connections to the
// others make-before-break. Over the whole run, per connection: no sequence gap, no
// duplicate, one deliverer at a time (arrival order at the sink is exactly 1, 2, 3,
// … across workers), and two upstream sockets at once only for the short overlap of
// a handoff.
func TestRollingDeploy(t *testing.T) {
	if testing.Short() {
		t.Skip("fleet test")
	}
	col, err := fleet.NewCollector()
	if err != nil {
		t.Fatal(err)
	}
	defer col.Close()
	f := startFleetWith(t, fleetOptions{Workers: 3, Collector: col})
	const n = 30
	ids := make([]string, n)
	for i := range n {
		ids[i] = fmt.Sprintf("r%02d", i)
		f.add(ids[i])
	}
	waitFor(t, 15*time.Second, "all connections streaming", func() (bool, string) { return f.streamingElsewhere(ids, "") })
	for slot := range 3 {
		p := f.stack.Sup.Get(slot)
		mine := f.ownedBy(p.ID)
		if err := f.stack.Sup.Signal(slot, syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case <-p.Done():
		case <-time.After(10 * time.Second):
			t.Fatalf("%s did not exit within 10s of SIGTERM", p.ID)
		}
		d := waitFor(t, 10*time.Second, "the drained worker's connections streaming elsewhere", func() (bool, string) {
			return f.streamingElsewhere(mine, p.ID)
		})
		t.Logf("SIGTERM of %s: %d connections streaming elsewhere after %s", p.ID, len(mine), d)
		waitFor(t, 10*time.Second, "a replacement", func() (bool, string) {
			q := f.stack.Sup.Get(slot)
			return q != nil && q.ID != p.ID, "not yet"
		})
	}
	waitFor(t, 15*time.Second, "all connections streaming at the end", func() (bool, string) { return f.streamingElsewhere(ids, "") })
	time.Sleep(2 * testRenew) // let the sinks catch up
	var gaps []time.Duration
	moved := 0
	for _, id := range ids {
		arr := col.Arrivals(id)
		if len(arr) == 0 {
			t.Errorf("%s: nothing delivered", id)
			continue
		}
		g, err := fleet.CheckSerial(arr)
		if err != nil {
			t.Errorf("%s: %v (stints %+v)", id, err, fleet.Stints(arr))
		}
		gaps = append(gaps, g...)
		if len(fleet.Stints(arr)) > 1 {
			moved++
		}
	}
	if moved == 0 {
		t.Fatal("no connection moved")
	}
	slices.Sort(gaps)
	if len(gaps) > 0 {
		t.Logf("%d moves over %d connections; gap between owners: median %s, p99 %s, max %s", len(gaps), moved,
			gaps[len(gaps)/2], gaps[len(gaps)*99/100], gaps[len(gaps)-1])
	}
	// Two sockets at once, one delivering: bounded by the prepare and the cut.
	for id, o := range fleet.Overlaps(f.up.Events()) {
		if o.Longest > 2*time.Second {
			t.Errorf("%s: two upstream clients at once for %s", id, o.Longest)
		}
	}
}
