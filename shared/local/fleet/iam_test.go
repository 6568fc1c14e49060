package fleet_test

import (
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sockfleet/sockfleet/shared/local/fleet"
	"github.com/sockfleet/sockfleet/shared/local/iam"
	"github.com/sockfleet/sockfleet/shared/schema"
)

// unexercised are the services whose statements no local flow can exercise, and why
// (README, "IAM locally"). A statement of the worker or reconciler role with any
// other action must be bitten by the flow below.
var unexercised = map[string]string{
	"secretsmanager": "connection secrets come from a local JSON file and the wakeup key from the environment; no local process calls Secrets Manager",
	"sns":            "the failed-batch destination is published to by the Lambda service, which the local stream poller plays without one",
	"kinesis":        "the test fleets deliver to a collector; the Kinesis sink's permission is enforced by `make run SINK=kinesis`",
	"xray":           "on AWS the ADOT collector (a sidecar, and a layer in the Lambda) exports spans to X-Ray; locally they go to Jaeger over OTLP, with no AWS call to enforce",
}

// TestIAMStatementsBite removes, one at a time, each statement of the worker's and
// the reconciler's policies from the template, runs a small flow (two workers and
// the reconciler; a connection started, stopped, started again and handed over by
// a drain), and checks the proxy denied a call naming an action of the removed
// statement. With nothing removed, the same flow completes with no denial.
func TestIAMStatementsBite(t *testing.T) {
	if testing.Short() {
		t.Skip("runs local fleets")
	}
	if !*enforceIAM {
		t.Skip("-iam=false")
	}
	base, err := fleet.LoadTemplate()
	if err != nil {
		t.Fatal(err)
	}

	// Every dial goes through the fleet-wide connect quota: its conditional writes on
	// QUOTA# items are judged against the same statements as the leases'.
	quota := func(int) []string { return []string{schema.EnvConnectQuota + "=1000/1m"} }
	t.Run("full policy", func(t *testing.T) {
		f := startFleetWith(t, fleetOptions{Workers: 2, Template: base, WorkerEnv: quota})
		if !flow(f, nil) {
			t.Fatal("the flow did not complete with the full policy")
		}
	})

	for _, role := range []func(*iam.Template) (string, error){
		func(t *iam.Template) (string, error) { return t.TaskRole(schema.WorkerContainer) },
		func(t *iam.Template) (string, error) {
			id, err := t.Table()
			if err != nil {
				return "", err
			}
			return t.StreamFunctionRole(id)
		},
	} {
		r, err := role(base)
		if err != nil {
			t.Fatal(err)
		}
		raws, err := base.Statements(r)
		if err != nil {
			t.Fatal(err)
		}
		for _, raw := range raws {
			actions := actionsOf(raw)
			t.Run(raw.Source, func(t *testing.T) {
				if why, skip := unexercisedReason(actions); skip {
					t.Skipf("%v: %s", actions, why)
				}
				cut, err := base.Without(raw.Source)
				if err != nil {
					t.Fatal(err)
				}
				f := startFleetWith(t, fleetOptions{Workers: 2, Template: cut, ExpectDenials: true, WorkerEnv: quota})
				bitten := func(d iam.Denial) bool {
					return d.Role == r && slices.ContainsFunc(actions, func(a string) bool {
						return iam.Glob(strings.ToLower(a), strings.ToLower(d.Action))
					})
				}
				flow(f, func() bool { return slices.ContainsFunc(f.iam.Denials(), bitten) })
				i := slices.IndexFunc(f.iam.Denials(), bitten)
				if i < 0 {
					t.Fatalf("without %s (%v), the flow ran with no denial of those actions; denials: %+v", raw.Source, actions, f.iam.Denials())
				}
				d := f.iam.Denials()[i]
				if !strings.Contains(d.Message, "not authorized to perform: "+d.Action) {
					t.Errorf("the denial does not name the missing permission: %q", d.Message)
				}
				t.Logf("without %s: %s", raw.Source, d.Message)
			})
		}
	}
}

func actionsOf(r iam.RawStatement) []string {
	var out []string
	switch a := r.Body["Action"].(type) {
	case string:
		out = append(out, a)
	case []any:
		for _, x := range a {
			if s, ok := x.(string); ok {
				out = append(out, s)
			}
		}
	}
	return out
}

// unexercisedReason says why no local flow exercises a statement with these
// actions, if none can: all of its actions belong to services in unexercised.
func unexercisedReason(actions []string) (string, bool) {
	var why []string
	for _, a := range actions {
		svc, _, _ := strings.Cut(a, ":")
		r, ok := unexercised[svc]
		if !ok {
			return "", false
		}
		if !slices.Contains(why, r) {
			why = append(why, r)
		}
	}
	return strings.Join(why, "; "), len(actions) > 0
}

// flow runs the small flow on f: a connection streams, is stopped, started again,
// and handed over when its worker drains. Each step waits up to 15 s; done, if set,
// ends the flow early once it holds (a denial seen). It reports whether every step
// completed.
func flow(f *testFleet, done func() bool) bool {
	step := func(cond func() bool) bool {
		deadline := time.Now().Add(15 * time.Second)
		for time.Now().Before(deadline) {
			if done != nil && done() {
				return false
			}
			if cond() {
				return true
			}
			time.Sleep(20 * time.Millisecond)
		}
		return false
	}
	streaming := func() bool { ok, _ := f.streamingElsewhere([]string{"p0"}, ""); return ok }
	f.add("p0")
	if !step(streaming) {
		return false
	}
	f.setState("p0", schema.Stopped)
	if !step(func() bool { c := f.conns()["p0"]; return !c.Owned() && f.up.Stats("p0").Clients == 0 }) {
		return false
	}
	f.setState("p0", schema.Started)
	if !step(streaming) {
		return false
	}
	owner := f.conns()["p0"].LeaseOwner
	slot := 0
	if p := f.stack.Sup.Get(1); p != nil && p.ID == owner {
		slot = 1
	}
	if err := f.stack.Sup.Signal(slot, syscall.SIGTERM); err != nil { // drain and hand over
		f.t.Errorf("signal: %v", err)
		return false
	}
	if !step(func() bool { ok, _ := f.streamingElsewhere([]string{"p0"}, owner); return ok }) {
		return false
	}
	// Let the sweep run once more.
	sweeps := f.stack.InvokeCount("sweep")
	return step(func() bool { return f.stack.InvokeCount("sweep") > sweeps })
}
