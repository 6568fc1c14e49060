package fleet_test

import (
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/sockfleet/sockfleet/shared/local/fleet"
	"github.com/sockfleet/sockfleet/shared/local/netguard"
	"github.com/sockfleet/sockfleet/shared/local/netrules"
)

// TestNetworkRulesBite proves the fleet enforces the template's security groups: it
// removes each ingress rule of the workers' group from the template, one at a time,
// and runs the flow that needs it: for a rule admitting the reconciler, a start (the
// reconciler wakes a worker); for one admitting workers, a drain (the draining worker
// hands its connections to another). The fleet must refuse the flow's call, with a
// denial naming the missing rule: its group, its peer and its port.
func TestNetworkRulesBite(t *testing.T) {
	if testing.Short() {
		t.Skip("fleet test")
	}
	base := templateUnderTest(t)
	port, err := base.ListenerPort(netrules.Worker)
	if err != nil {
		t.Fatal(err)
	}
	// Workers call each other's port for handoffs. Where the template does not admit
	// that yet, the other fleet tests fail on it; here, test with a copy that does, so
	// that both flows are covered.
	if d, err := base.DecideWorkloads(netrules.Worker, netrules.Worker, port); err != nil {
		t.Fatal(err)
	} else if !d.Allowed {
		g := base.Workloads[netrules.Worker].Groups[0]
		peer := netrules.Rule{Direction: netrules.Ingress, Group: g, Peer: g, Protocol: "tcp", FromPort: port, ToPort: port,
			Source: "TestWorkerToWorker", Description: "handoffs (added by the test)"}
		t.Logf("the template does not admit handoffs (%s): testing with a copy that adds %s", d, peer)
		base = base.With(peer)
	}
	rules := base.IngressOf(netrules.Worker)
	if len(rules) == 0 {
		t.Fatal("no ingress rule on the workers' group")
	}
	for _, r := range rules {
		t.Run(r.Source, func(t *testing.T) {
			if !r.AdmitsTCP(port) {
				t.Skipf("%s: not on the worker's port %d; no call of the fleet needs it", r, port)
			}
			callers := base.Peers(r)
			if len(callers) == 0 {
				t.Skipf("%s admits none of the fleet's workloads", r)
			}
			without := base.Without(r.Source)
			for _, caller := range callers {
				t.Run(caller, func(t *testing.T) {
					var d netguard.Denial
					switch caller {
					case netrules.Reconciler:
						d = startRefused(t, without)
					case netrules.Worker:
						d = handoffRefused(t, without)
					default:
						t.Fatalf("no flow for calls from %s", caller)
					}
					t.Logf("without %s: %s", r, d)
					checkNames(t, d, r, caller, port)
				})
			}
		})
	}
}

// checkNames checks that d is a call from caller to a worker refused for want of r.
func checkNames(t *testing.T, d netguard.Denial, r netrules.Rule, caller string, port int) {
	t.Helper()
	if d.Caller.Workload != caller || d.Callee.Workload != netrules.Worker || d.Port != port {
		t.Errorf("denial %s: want a call from the %s to a worker on port %d", d, caller, port)
	}
	if !slices.Contains(d.Decision.Missing, netrules.Ingress) || d.Decision.CalleeGroup != r.Group ||
		(r.Peer != "" && d.Decision.CallerGroup != r.Peer) {
		t.Errorf("denial %s does not name the rule removed: %s", d, r)
	}
}

// denials passes the fleet's refused calls to the test.
func denials() (chan netguard.Denial, func(netguard.Denial)) {
	ch := make(chan netguard.Denial, 64)
	return ch, func(d netguard.Denial) {
		select {
		case ch <- d:
		default: // the test has what it needs
		}
	}
}

func firstDenial(t *testing.T, ch chan netguard.Denial, within time.Duration, what string) netguard.Denial {
	t.Helper()
	select {
	case d := <-ch:
		return d
	case <-time.After(within):
		t.Fatalf("%s: no call refused within %s", what, within)
		return netguard.Denial{}
	}
}

// startRefused starts a connection: the reconciler's wakeup of a worker must be
// refused.
func startRefused(t *testing.T, tm *netrules.Template) netguard.Denial {
	ch, onDeny := denials()
	f := startFleetWith(t, fleetOptions{Workers: 2, Network: tm, OnDeny: onDeny})
	f.add("bite-start")
	return firstDenial(t, ch, 30*time.Second, "a start")
}

// handoffRefused drains a worker holding connections: its handoff to the other
// worker must be refused.
func handoffRefused(t *testing.T, tm *netrules.Template) netguard.Denial {
	col, err := fleet.NewCollector()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { col.Close() })
	ch, onDeny := denials()
	f := startFleetWith(t, fleetOptions{Workers: 2, Collector: col, Network: tm, OnDeny: onDeny})
	ids := []string{"bite-h0", "bite-h1", "bite-h2", "bite-h3"}
	for _, id := range ids {
		f.add(id)
	}
	// A connection that delivered nothing yet is released, not handed off.
	waitFor(t, 15*time.Second, "every connection delivering", func() (bool, string) {
		if ok, why := f.streamingElsewhere(ids, ""); !ok {
			return false, why
		}
		for _, id := range ids {
			if n := len(col.Arrivals(id)); n < 3 {
				return false, fmt.Sprintf("%s delivered %d messages", id, n)
			}
		}
		return true, ""
	})
	select {
	case d := <-ch:
		t.Fatalf("a call refused before the drain: %s", d)
	default:
	}
	slot := 0
	if len(f.ownedBy(f.stack.Sup.Get(0).ID)) == 0 {
		slot = 1
	}
	if err := f.stack.Sup.Signal(slot, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	return firstDenial(t, ch, 30*time.Second, "a drain")
}
