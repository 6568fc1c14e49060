package fleet_test

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sockfleet/sockfleet/shared/local/fleet"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/sinkrecord"
)

// TestFleetEndToEnd runs 3 workers and 30 connections through stop, start, SIGTERM,
// SIGKILL and SIGSTOP, then checks the invariants over the whole run: at most one
// streaming client per connection (apart from an overlap bounded by the renew
// interval), and at the sink no sequence gap and never two workers delivering at
// once.
func TestFleetEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end fleet test")
	}
	f, col, ids := collectorFleet(t, 3, 30, "c")

	var paused string // the SIGSTOP victim, and when it was stopped
	var pausedAt time.Time

	t.Run("stop closes within 1s", func(t *testing.T) {
		f.setState("c00", schema.Stopped)
		d := waitFor(t, 5*time.Second, "c00 closed", func() (bool, string) {
			st := f.up.Stats("c00")
			return st.Clients == 0, fmt.Sprintf("%d clients", st.Clients)
		})
		t.Logf("STOPPED -> socket closed in %s", d)
		if d > time.Second {
			t.Errorf("STOPPED took %s to close the socket, want under 1s", d)
		}
		waitFor(t, 5*time.Second, "c00 released", func() (bool, string) {
			c := f.conns()["c00"]
			return !c.Owned() && c.LastSeq > 0, fmt.Sprintf("%+v", c)
		})
	})

	t.Run("start streams within 1s", func(t *testing.T) {
		f.setState("c00", schema.Started)
		d := waitFor(t, 5*time.Second, "c00 streaming", func() (bool, string) { return f.streamingElsewhere([]string{"c00"}, "") })
		t.Logf("STARTED -> streaming in %s", d)
		if d > time.Second {
			t.Errorf("STARTED took %s to stream, want under 1s", d)
		}
	})

	// victim picks, once every connection streams, the worker that owns the most, so
	// that each failover has connections to move (a fixed slot may own none: a
	// replacement, or a worker the earlier failovers gave nothing).
	victim := func(t *testing.T) (int, *fleet.Proc, []string) {
		t.Helper()
		waitFor(t, 15*time.Second, "all connections streaming before the failover", func() (bool, string) {
			return f.streamingElsewhere(ids, "")
		})
		slot, p, victims := -1, (*fleet.Proc)(nil), []string(nil)
		for s := range 3 {
			if q := f.stack.Sup.Get(s); q != nil {
				if mine := f.ownedBy(q.ID); len(mine) > len(victims) {
					slot, p, victims = s, q, mine
				}
			}
		}
		if slot < 0 {
			t.Fatal("no worker owns a connection")
		}
		return slot, p, victims
	}

	failover := func(t *testing.T, sig syscall.Signal, within time.Duration) time.Duration {
		slot, p, victims := victim(t)
		if err := f.stack.Sup.Signal(slot, sig); err != nil {
			t.Fatal(err)
		}
		d := waitFor(t, within, fmt.Sprintf("%d connections of %s streaming elsewhere", len(victims), p.ID), func() (bool, string) {
			return f.streamingElsewhere(victims, p.ID)
		})
		t.Logf("%s of %s: %d connections streaming elsewhere after %s", sig, p.ID, len(victims), d)
		return d
	}

	t.Run("SIGTERM drains to the others", func(t *testing.T) {
		failover(t, syscall.SIGTERM, 10*time.Second)
	})

	t.Run("SIGKILL fails over well before the lease expires", func(t *testing.T) {
		d := failover(t, syscall.SIGKILL, 10*time.Second)
		if d >= testLease {
			t.Errorf("SIGKILL failover took %s, not well before the %s lease", d, testLease)
		}
	})

	t.Run("SIGSTOP longer than the lease: fenced, taken over, stays quiet", func(t *testing.T) {
		slot, p, victims := victim(t)
		if err := f.stack.Sup.Signal(slot, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		paused, pausedAt = p.ID, time.Now()
		d := waitFor(t, testLease+10*time.Second, "paused worker's connections taken over", func() (bool, string) {
			return f.streamingElsewhere(victims, p.ID)
		})
		t.Logf("SIGSTOP of %s: %d connections streaming elsewhere after %s", p.ID, len(victims), d)
		if err := f.stack.Sup.Signal(slot, syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		// Give the resumed worker every chance to misbehave, then check it did not.
		time.Sleep(3 * testRenew)
		cs := f.conns()
		for _, id := range victims {
			if c := cs[id]; !c.Owned() || c.LeaseOwner == p.ID {
				t.Errorf("after SIGCONT: %s owned by %q", id, c.LeaseOwner)
			}
		}
		// One upstream client each. A session that gave up on a sink write (the
		// 500 ms sink window, which a loaded machine can exceed) is reconnecting
		// after a backoff of at most 500 ms: give it a renew interval.
		deadline := time.Now().Add(testRenew)
		for {
			ok, why := f.streamingElsewhere(victims, p.ID)
			if ok {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("after SIGCONT: %s", why)
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if mine := f.ownedBy(p.ID); len(mine) != 0 {
			t.Errorf("the resumed worker owns %v again", mine)
		}
	})

	// Let every connection settle, then check the invariants over the whole run.
	waitFor(t, 15*time.Second, "all connections streaming at the end", func() (bool, string) { return f.streamingElsewhere(ids, "") })
	for id, o := range fleet.Overlaps(f.up.Events()) {
		if o.Longest > testRenew+500*time.Millisecond {
			t.Errorf("%s: two clients at once for %s (total %s), more than the renew interval %s", id, o.Longest, o.Total, testRenew)
		}
	}
	time.Sleep(2 * testRenew) // let sinks catch up with what the upstream sent
	// At the sink, who delivered what and when: no gap, and never two workers
	// delivering at once (the socket overlap above is counted apart).
	dups, staleN := 0, 0
	// The consumer rule of docs/SINKS.md, as sockfleet tail applies it (sinkrecord.Fence),
	// over every record in arrival order: what it accepts must hold each position
	// once, with none missing between the first and the last.
	var rule sinkrecord.Fence
	ruleDups, ruleStale, ruleSeen := 0, 0, 0
	if bad := col.BadHeaders(); len(bad) > 0 {
		t.Errorf("%d HTTP sink batches whose lease headers disagree with their records, first %s", len(bad), bad[0])
	}
	for _, id := range ids {
		arr := col.Arrivals(id)
		if len(arr) == 0 {
			t.Errorf("%s: nothing delivered", id)
			continue
		}
		// Fencing reaches the consumer: only the paused worker's late writes arrive
		// under a lower lease version than one already seen, and each of its writes in
		// flight at the pause that landed after another worker's delivery is one.
		_, stale := fleet.Fenced(arr)
		staleN += len(stale)
		isStale := map[int64]bool{}
		for _, a := range stale {
			if a.Worker != paused {
				t.Errorf("%s: %s delivered seq %d under version %d, below one delivered before it", id, a.Worker, a.Seq, a.Version)
			}
			isStale[a.Seq] = true
		}
		other := false // another worker delivered since the pause
		for _, a := range arr {
			other = other || (a.Worker != paused && a.At.After(pausedAt))
			if other && a.Worker == paused && a.At.After(pausedAt) && a.TS != 0 && a.TS < pausedAt.UnixMilli() && !isStale[a.Seq] {
				t.Errorf("%s: seq %d, read by %s before its SIGSTOP, landed after another owner's records at version %d without being stale", id, a.Seq, paused, a.Version)
			}
		}
		// A sink write in flight when SIGSTOP hit lands when the worker resumes, after
		// the next owner began (docs/MEMBERSHIP.md, "Non-guarantees"): messages read
		// before the pause arriving after it. They are reported and left out of the
		// check; anything the paused worker read after its pause still fails it.
		arr, inFlight := fleet.LandedAfterPause(arr, paused, pausedAt)
		if len(inFlight) > 0 {
			t.Logf("%s: %d messages read by %s before its SIGSTOP landed after it (a write in flight at the pause): %v", id, len(inFlight), paused, inFlight)
		}
		if err := fleet.CheckOneDeliverer(arr); err != nil {
			t.Errorf("%s: %v", id, err)
		}
		seen := map[int64]bool{}
		for _, a := range arr {
			if seen[a.Seq] {
				dups++
			}
			seen[a.Seq] = true
		}
		accepted := map[int64]int{}
		var lo, hi int64
		for _, a := range col.Arrivals(id) {
			switch rule.Check(sinkrecord.Record{Conn: id, Seq: a.Seq, Version: a.Version}) {
			case sinkrecord.Duplicate:
				ruleDups++
			case sinkrecord.Stale:
				ruleStale++
			default:
				if len(accepted) == 0 || a.Seq < lo {
					lo = a.Seq
				}
				hi = max(hi, a.Seq)
				accepted[a.Seq]++
			}
		}
		for seq, n := range accepted {
			if n > 1 {
				ruleSeen += n - 1
				t.Errorf("%s: the consumer rule accepted seq %d %d times", id, seq, n)
			}
		}
		if missing := int(hi-lo+1) - len(accepted); missing > 0 {
			t.Errorf("%s: the consumer rule accepted %d..%d with %d positions missing", id, lo, hi, missing)
		}
	}
	t.Logf("consumer rule (sinkrecord.Fence, as sockfleet tail): %d duplicates and %d stale records dropped, %d duplicates still seen",
		ruleDups, ruleStale, ruleSeen)
	t.Logf("delivered to sinks with %d duplicates over %d connections; %d stale records a consumer following the fencing rule drops", dups, len(ids), staleN)
	if s := strings.TrimSpace(fmt.Sprint(f.stack.InvokeCount("task-stopped"))); s == "0" {
		t.Error("no task-stopped event reached the reconciler")
	}
}
