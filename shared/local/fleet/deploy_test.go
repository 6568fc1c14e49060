package fleet_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sockfleet/sockfleet/shared/local/fleet"
	"github.com/sockfleet/sockfleet/shared/registry"
)

// TestRollingDeploy replaces every worker of a 3-worker fleet holding 30
// connections, one at a time, with SIGTERM: each drain hands its connections to the
// others make-before-break. Over the whole run, per connection: no sequence gap, no
// duplicate, one deliverer at a time (arrival order at the sink is exactly 1, 2, 3,
// … across workers, but for a worker's own replay after a sink write it gave up on:
// fleet.CheckSerialReplays), and two upstream sockets at once only for the short overlap of
// a handoff. Every connection a drain moves is handed off, none released.
func TestRollingDeploy(t *testing.T) {
	if testing.Short() {
		t.Skip("fleet test")
	}
	f, col, ids := collectorFleet(t, 3, 30, "r")
	// A connection that delivered nothing yet has no resume point and is released
	// instead (docs/HANDOFF.md): start once each has delivered.
	waitFor(t, 15*time.Second, "every connection delivering", func() (bool, string) {
		for _, id := range ids {
			if len(col.Arrivals(id)) < 5 {
				return false, id + " has not delivered 5 messages"
			}
		}
		return true, ""
	})
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
		by := map[string]int{}
		for _, id := range mine {
			c := f.conns()[id]
			by[c.LeaseOwner+" "+c.Status]++
		}
		t.Logf("SIGTERM of %s: %d connections streaming elsewhere after %s: %v", p.ID, len(mine), d, by)
		for k, v := range by {
			if !strings.HasSuffix(k, " handed_off") && !strings.HasSuffix(k, " streaming") {
				t.Errorf("%d connections of %s moved without a handoff: %s", v, p.ID, k)
			}
		}
		// The next drain can hand to the replacement only once it is a member.
		waitFor(t, 10*time.Second, "a replacement, registered", func() (bool, string) {
			q := f.stack.Sup.Get(slot)
			if q == nil || q.ID == p.ID {
				return false, "not started"
			}
			ws, _, err := (&registry.Registry{DB: f.env.DB, Table: f.env.Table}).List(context.Background())
			if err != nil {
				return false, err.Error()
			}
			for _, w := range registry.Live(ws, time.Now()) {
				if w.ID == q.ID && !w.Draining {
					return true, ""
				}
			}
			return false, q.ID + " not a live member yet"
		})
	}
	waitFor(t, 15*time.Second, "all connections streaming at the end", func() (bool, string) { return f.streamingElsewhere(ids, "") })
	time.Sleep(2 * testRenew) // let the sinks catch up
	// A worker that gave up on a sink write (the test fleets' sink timeout is the
	// 500 ms sink window, which a loaded machine can exceed) resumes from its last
	// checkpoint and repeats what it delivered since: at least once, and said in its
	// log. Only such a worker's own replay is accepted.
	r := col.CheckPlanned(ids, func(worker, id string) bool { return gaveUpSinkWrite(f.dir, worker, id) })
	for _, err := range r.Problems {
		t.Error(err)
	}
	if r.Moved == 0 {
		t.Fatal("no connection moved")
	}
	t.Log(r)
	// Two sockets at once, one delivering: bounded by the prepare and the cut.
	for id, o := range fleet.Overlaps(f.up.Events()) {
		if o.Longest > 2*time.Second {
			t.Errorf("%s: two upstream clients at once for %s", id, o.Longest)
		}
	}
}

// gaveUpSinkWrite reports whether worker's log says it gave up on a sink write of
// connection id (its stream stopped on a sink error and resumes from its checkpoint).
func gaveUpSinkWrite(dir, worker, id string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "logs", worker+".log"))
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, `"conn":"`+id+`"`) && strings.Contains(line, `"err":"sink: `) {
			return true
		}
	}
	return false
}
