package fleet_test

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/ddb/ddbtest"
	"github.com/sockfleet/sockfleet/shared/demoupstream"
	"github.com/sockfleet/sockfleet/shared/fleet"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

// Timings of the test fleet: short, so kills and pauses resolve in seconds.
const (
	testLease  = 4 * time.Second
	testRenew  = time.Second
	testMargin = 500 * time.Millisecond
)

var (
	buildOnce sync.Once
	bins      fleet.Binaries
	buildErr  error
)

func binaries(t *testing.T) fleet.Binaries {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "sockfleet-bin")
		if err != nil {
			buildErr = err
			return
		}
		bins, buildErr = fleet.Build(dir)
	})
	if buildErr != nil {
		t.Fatal(buildErr)
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
}

func startFleet(t *testing.T, workers int, endpoint string) *testFleet {
	t.Helper()
	b := binaries(t)
	e := ddbtest.New(t)
	up, err := demoupstream.Listen("127.0.0.1:0", demoupstream.Config{Rate: 20, Size: 32, ClientTimeout: testRenew})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close() })
	if endpoint == "" {
		endpoint = e.Endpoint
	}
	dir := t.TempDir()
	st, err := fleet.Start(context.Background(), fleet.Config{
		Dir: dir, Endpoint: e.Endpoint, WorkerEndpoint: endpoint, Table: e.Table, Cluster: "test",
		Secret: "test-secret-0123456789abcdef", Workers: workers, WorkerBin: b.Worker, Restart: true,
		Bootstrap: b.Bootstrap, RIE: b.RIE, LambdaAddr: "127.0.0.1:0",
		WorkerEnv: func(int, string) []string {
			return []string{
				schema.EnvLease + "=" + testLease.String(),
				schema.EnvRenewInterval + "=" + testRenew.String(),
				schema.EnvRenewDeadline + "=" + (testLease - testRenew).String(),
				schema.EnvSkewMargin + "=" + testMargin.String(),
				schema.EnvDrainTimeout + "=5s",
				schema.EnvMaxConnections + "=100",
				schema.EnvLogLevel + "=debug",
			}
		},
		ReconcilerEnv: []string{
			schema.EnvSkewMargin + "=" + testMargin.String(),
			schema.EnvNudgeAfter + "=2s",
			schema.EnvSweepPeriod + "=1s",
		},
		SweepEvery: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	f := &testFleet{t: t, env: e, up: up, stack: st, dir: dir}
	t.Cleanup(func() {
		st.Stop()
		if t.Failed() {
			dumpLogs(t, dir)
		}
	})
	return f
}

func dumpLogs(t *testing.T, dir string) {
	for _, name := range []string{"reconciler.log"} {
		b, _ := os.ReadFile(dir + "/logs/" + name)
		t.Logf("--- %s (tail)\n%s", name, tail(string(b), 4000))
	}
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

// TestFleetEndToEnd runs 3 workers and 30 connections through stop, start, SIGTERM,
// SIGKILL and SIGSTOP, then checks the invariants over the whole run: at most one
// streaming client per connection (apart from an overlap bounded by the renew
// interval) and no sequence gap at the sinks.
func TestFleetEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end fleet test")
	}
	f := startFleet(t, 3, "")
	const n = 30
	ids := make([]string, n)
	for i := range n {
		ids[i] = fmt.Sprintf("c%02d", i)
		f.add(ids[i])
	}
	waitFor(t, 15*time.Second, "all 30 connections streaming", func() (bool, string) {
		return f.streamingElsewhere(ids, "")
	})

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

	failover := func(t *testing.T, slot int, sig syscall.Signal, within time.Duration) time.Duration {
		p := f.stack.Sup.Get(slot)
		victims := f.ownedBy(p.ID)
		if len(victims) == 0 {
			t.Skipf("worker %s owns nothing", p.ID)
		}
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
		failover(t, 0, syscall.SIGTERM, 10*time.Second)
	})

	t.Run("SIGKILL fails over well before the lease expires", func(t *testing.T) {
		d := failover(t, 1, syscall.SIGKILL, 10*time.Second)
		if d >= testLease {
			t.Errorf("SIGKILL failover took %s, not well before the %s lease", d, testLease)
		}
	})

	t.Run("SIGSTOP longer than the lease: fenced, taken over, stays quiet", func(t *testing.T) {
		p := f.stack.Sup.Get(2)
		victims := f.ownedBy(p.ID)
		if len(victims) == 0 {
			t.Skipf("worker %s owns nothing", p.ID)
		}
		if err := f.stack.Sup.Signal(2, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		d := waitFor(t, testLease+10*time.Second, "paused worker's connections taken over", func() (bool, string) {
			return f.streamingElsewhere(victims, p.ID)
		})
		t.Logf("SIGSTOP of %s: %d connections streaming elsewhere after %s", p.ID, len(victims), d)
		if err := f.stack.Sup.Signal(2, syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		// Give the resumed worker every chance to misbehave, then check it did not.
		time.Sleep(3 * testRenew)
		if ok, why := f.streamingElsewhere(victims, p.ID); !ok {
			t.Errorf("after SIGCONT: %s", why)
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
	got, err := fleet.ReadSinks(f.dir)
	if err != nil {
		t.Fatal(err)
	}
	dups := 0
	for _, id := range ids {
		d := got[id]
		if d == nil || d.Max == 0 {
			t.Errorf("%s: nothing delivered", id)
			continue
		}
		if gaps := d.Gaps(); len(gaps) > 0 {
			t.Errorf("%s: sequence gaps at the sinks: %v (max %d)", id, gaps, d.Max)
		}
		dups += d.Duplicates
	}
	t.Logf("delivered to sinks with %d duplicates over %d connections", dups, n)
	if s := strings.TrimSpace(fmt.Sprint(f.stack.InvokeCount("task-stopped"))); s == "0" {
		t.Error("no task-stopped event reached the reconciler")
	}
}
