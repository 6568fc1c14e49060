package fleet_test

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/local/ddbtest"
	"github.com/sockfleet/sockfleet/shared/local/demoupstream"
	"github.com/sockfleet/sockfleet/shared/local/fleet"
	"github.com/sockfleet/sockfleet/shared/local/iam"
	"github.com/sockfleet/sockfleet/shared/local/netguard"
	"github.com/sockfleet/sockfleet/shared/local/netrules"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

// Timings of the test fleet: short, so kills and pauses resolve in seconds.
const (
	testLease  = 4 * time.Second
	testRenew  = time.Second
	testMargin = 500 * time.Millisecond
	// The reconciler's backstop: the sweep runs every testSweep and nudges items left
	// unowned for testNudge (which also holds back the release of a lease naming a
	// member dead for a while). It must exceed the workers' backstop interval
	// (2 × testRenew) plus a renew tick, the longest a holder takes to find an edit.
	testSweep = time.Second
	testNudge = 3 * time.Second
)

// enforceIAM runs the test fleets as the stack's roles, behind the IAM proxy
// (fleet.EnforceIAM). Turn it off to debug something else:
// go test ./shared/local/fleet -args -iam=false
var enforceIAM = flag.Bool("iam", true, "enforce the synthesized stack's IAM policies in the test fleets (make template writes the template)")

func binaries(t *testing.T) fleet.Binaries {
	t.Helper()
	bins, err := fleet.BuildOnce()
	if err != nil {
		t.Fatal(err)
	}
	return bins
}

// testFleet is a running fleet with its upstream and table.
type testFleet struct {
	t     *testing.T
	env   *ddbtest.Env
	up    *demoupstream.Server
	stack *fleet.Stack
	dir   string
	iam   *fleet.IAM // nil when IAM is not enforced
}

// fleetOptions shapes a test fleet; zero values take the defaults noted.
type fleetOptions struct {
	Workers int
	// WorkerEndpoint returns the DynamoDB endpoint the workers use, given the engine's
	// (a FaultProxy in front of it, say); nil: the engine itself.
	WorkerEndpoint func(engine string) string
	// SlotEndpoint returns the endpoint of slot's workers, over WorkerEndpoint; may be nil.
	SlotEndpoint  func(slot int) string
	Rate          float64       // upstream messages per second per stream; default 20
	ClientTimeout time.Duration // the upstream drops clients silent this long; default testRenew
	// WorkerEnv returns extra environment for the worker in slot, after the defaults.
	WorkerEnv func(slot int) []string
	// Collector, if set, is every worker's sink (instead of its file), recording who
	// delivered what and when.
	Collector *fleet.Collector
	// Template is the stack whose IAM policies are enforced; nil: the synthesized
	// one. ExpectDenials keeps a denied call from failing the test.
	Template      *iam.Template
	ExpectDenials bool
	// Network replaces the template whose rules the fleet enforces (a test's copy of
	// it); nil: networkRules.
	Network *netrules.Template
	// OnDeny, if set, gets each call the network rules refused, which is then the
	// test's to judge; without it, any refused call fails the test.
	OnDeny func(netguard.Denial)
	// OTLPEndpoint, if set, is where the workers and the reconciler export spans (a
	// local Jaeger); they export every 100 ms, so a test reads them back soon.
	OTLPEndpoint string
	// ReconcilerEnv is extra environment for the reconciler, after the defaults.
	ReconcilerEnv []string
}

var (
	netRules         = flag.Bool("netrules", true, "enforce the synthesized template's security group rules on calls between the fleet's processes")
	netRulesTemplate = flag.String("netrules-template", "", "the template whose rules the fleets enforce; default: cdk.out/"+
		netrules.DefaultStack+".template.json in this folder or a parent (make template)")
)

var loadedRules struct {
	once sync.Once
	t    *netrules.Template
	err  error
}

// templateUnderTest is the synthesized template (or -netrules-template), read once.
func templateUnderTest(t *testing.T) *netrules.Template {
	t.Helper()
	loadedRules.once.Do(func() {
		if *netRulesTemplate != "" {
			loadedRules.t, loadedRules.err = netrules.Load(*netRulesTemplate)
		} else {
			loadedRules.t, loadedRules.err = netrules.LoadDefault()
		}
	})
	if loadedRules.err != nil {
		t.Fatalf("the fleet enforces the stack's network rules: %v\n"+
			"(or run the fleet tests without them: go test ./shared/local/fleet/ -args -netrules=false)", loadedRules.err)
	}
	return loadedRules.t
}

// networkRules is the template the test fleets enforce; nil with -netrules=false.
func networkRules(t *testing.T) *netrules.Template {
	t.Helper()
	if !*netRules {
		return nil
	}
	return templateUnderTest(t)
}

func startFleet(t *testing.T, workers int, endpoint string) *testFleet {
	t.Helper()
	o := fleetOptions{Workers: workers}
	if endpoint != "" {
		o.WorkerEndpoint = func(string) string { return endpoint }
	}
	return startFleetWith(t, o)
}

func startFleetWith(t *testing.T, o fleetOptions) *testFleet {
	t.Helper()
	if o.Rate == 0 {
		o.Rate = 20
	}
	if o.ClientTimeout == 0 {
		o.ClientTimeout = testRenew
	}
	b := binaries(t)
	e := ddbtest.New(t)
	up, err := demoupstream.Listen("127.0.0.1:0", demoupstream.Config{Rate: o.Rate, Size: 32, ClientTimeout: o.ClientTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close() })
	// Every process reaches the engine through the IAM proxy, as its role; the
	// harness itself (e.DB) is the administrator and goes straight to the engine.
	engine, enf := e.Endpoint, (*fleet.IAM)(nil)
	if *enforceIAM {
		var err error
		enf, err = fleet.EnforceIAM(context.Background(), fleet.IAMConfig{
			Template: o.Template, Endpoint: e.Endpoint, Table: e.Table,
			Log: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { enf.Close() })
		engine = enf.DynamoDB.Endpoint()
	}
	var keys fleet.Keys
	if enf != nil {
		keys = enf.Keys
	}
	endpoint := engine
	if o.WorkerEndpoint != nil {
		endpoint = o.WorkerEndpoint(engine)
	}
	dir := t.TempDir()
	network := o.Network
	if network == nil {
		network = networkRules(t)
	}
	st, err := fleet.Start(context.Background(), fleet.Config{
		Network: network, OnDeny: o.OnDeny,
		Keys: keys, Dir: dir, Endpoint: engine, WorkerEndpoint: endpoint, SlotEndpoint: o.SlotEndpoint, Table: e.Table, Cluster: "test",
		Secret: "test-secret-0123456789abcdef", Workers: o.Workers, WorkerBin: b.Worker, Restart: true,
		Bootstrap: b.Bootstrap, RIE: b.RIE, LambdaAddr: "127.0.0.1:0",
		WorkerEnv: func(slot int, id string) []string {
			env := []string{
				schema.EnvLease + "=" + testLease.String(),
				schema.EnvRenewInterval + "=" + testRenew.String(),
				schema.EnvRenewDeadline + "=" + (testLease - testRenew).String(),
				schema.EnvSkewMargin + "=" + testMargin.String(),
				// Stream mode: checkpoint as often as the lease was renewed before, so
				// the duplicate window is the same; read back for lost wakeups often.
				schema.EnvCheckpointInterval + "=" + testRenew.String(),
				schema.EnvBackstopInterval + "=" + (2 * testRenew).String(),
				schema.EnvDrainTimeout + "=5s",
				schema.EnvMaxConnections + "=100",
				schema.EnvLogLevel + "=debug",
			}
			if o.WorkerEnv != nil {
				env = append(env, o.WorkerEnv(slot)...)
			}
			if o.Collector != nil {
				env = append(env, schema.EnvSink+"="+o.Collector.URL(id))
			}
			return env
		},
		ReconcilerEnv: append([]string{
			schema.EnvSkewMargin + "=" + testMargin.String(),
			schema.EnvNudgeAfter + "=" + testNudge.String(),
			schema.EnvSweepPeriod + "=" + testSweep.String(),
		}, o.ReconcilerEnv...),
		SweepEvery:   testSweep,
		OTLPEndpoint: o.OTLPEndpoint,
		TraceEnv:     []string{"OTEL_BSP_SCHEDULE_DELAY=100"},
	})
	if err != nil {
		t.Fatal(err)
	}
	f := &testFleet{t: t, env: e, up: up, stack: st, dir: dir, iam: enf}
	t.Cleanup(func() {
		st.Stop()
		// A call the stack's roles may not make fails here, before it fails a deploy.
		if enf != nil && !o.ExpectDenials {
			for _, d := range enf.Denials() {
				t.Errorf("IAM denied %s %s on %s: %s", d.Role, d.Action, d.Resource, d.Message)
			}
		}
		if o.OnDeny == nil {
			for _, line := range netguard.Summary(st.Denials()) {
				t.Errorf("calls the stack's security groups do not admit (%s): %s", network.Path, line)
			}
		}
		if t.Failed() {
			dumpLogs(t, dir)
		}
	})
	return f
}

// dumpLogs prints the reconciler's log tail and keeps a copy of the fleet's logs and
// sinks outside the test's temporary folder, which is about to be removed.
func dumpLogs(t *testing.T, dir string) {
	for _, name := range []string{"reconciler.log"} {
		b, _ := os.ReadFile(dir + "/logs/" + name)
		t.Logf("--- %s (tail)\n%s", name, tail(string(b), 4000))
	}
	keep, err := os.MkdirTemp("", "sockfleet-failed-"+filepath.Base(t.Name())+"-")
	if err == nil {
		err = os.CopyFS(keep, os.DirFS(dir))
	}
	if err != nil {
		t.Logf("keeping the fleet's logs: %v", err)
		return
	}
	t.Logf("the fleet's logs and sinks are kept in %s", keep)
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func (f *testFleet) add(id string) {
	f.t.Helper()
	it := codec.EncodeConnection(codec.Connection{ID: id, DesiredState: schema.Started, WSURL: f.up.URL(id)})
	if _, err := f.env.DB.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: &f.env.Table, Item: it}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *testFleet) setState(id string, s schema.State) {
	f.t.Helper()
	_, err := f.env.DB.UpdateItem(context.Background(), &dynamodb.UpdateItemInput{
		TableName: &f.env.Table, Key: map[string]types.AttributeValue{schema.AttrPK: codec.S(schema.ConnKey(id))},
		UpdateExpression:          aws.String("SET desired_state = :s"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":s": codec.S(string(s))},
	})
	if err != nil {
		f.t.Fatal(err)
	}
}

// conns reads every connection item.
func (f *testFleet) conns() map[string]codec.Connection {
	f.t.Helper()
	out := map[string]codec.Connection{}
	var start map[string]types.AttributeValue
	for {
		page, err := f.env.DB.Scan(context.Background(), &dynamodb.ScanInput{TableName: &f.env.Table, ExclusiveStartKey: start, ConsistentRead: aws.Bool(true)})
		if err != nil {
			f.t.Fatal(err)
		}
		for _, it := range page.Items {
			if c, err := codec.DecodeConnection(it); err == nil {
				out[c.ID] = c
			}
		}
		if len(page.LastEvaluatedKey) == 0 {
			return out
		}
		start = page.LastEvaluatedKey
	}
}

// ownedBy lists the connections worker id owns.
func (f *testFleet) ownedBy(id string) []string {
	var ids []string
	for cid, c := range f.conns() {
		if c.Owned() && c.LeaseOwner == id {
			ids = append(ids, cid)
		}
	}
	sort.Strings(ids)
	return ids
}

// streamingElsewhere reports whether every id has exactly one upstream client and an
// owner other than notOwner.
func (f *testFleet) streamingElsewhere(ids []string, notOwner string) (bool, string) {
	cs := f.conns()
	for _, id := range ids {
		c := cs[id]
		if st := f.up.Stats(id); st.Clients != 1 || !c.Owned() || c.LeaseOwner == notOwner {
			return false, fmt.Sprintf("%s: %d clients, owner %q", id, st.Clients, c.LeaseOwner)
		}
	}
	return true, ""
}

// waitFor polls cond until it holds or timeout passes, and returns the time it took.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) time.Duration {
	t.Helper()
	start := time.Now()
	var why string
	for time.Since(start) < timeout {
		var ok bool
		if ok, why = cond(); ok {
			return time.Since(start)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s: not within %s: %s", what, timeout, why)
	return 0
}

// collectorFleet starts workers workers delivering to a collector sink and n
// connections named prefix00, prefix01, …, and waits until all of them stream.
func collectorFleet(t *testing.T, workers, n int, prefix string) (*testFleet, *fleet.Collector, []string) {
	t.Helper()
	col, err := fleet.NewCollector()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { col.Close() })
	f := startFleetWith(t, fleetOptions{Workers: workers, Collector: col})
	ids := make([]string, n)
	for i := range n {
		ids[i] = fmt.Sprintf("%s%02d", prefix, i)
		f.add(ids[i])
	}
	waitFor(t, 15*time.Second, fmt.Sprintf("all %d connections streaming", n), func() (bool, string) {
		return f.streamingElsewhere(ids, "")
	})
	return f, col, ids
}
