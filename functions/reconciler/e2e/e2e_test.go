// Package e2e runs the reconciler end to end on one machine: the local DynamoDB
// engine and its stream, the stream poller, the reconciler's handler in process, two
// real worker processes on 127.0.0.1 (under the fleet supervisor, which plays ECS's
// task-stopped event when one exits) and the demo upstream.
package e2e

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/functions/reconciler/dispatch"
	"github.com/sockfleet/sockfleet/functions/reconciler/handler"
	"github.com/sockfleet/sockfleet/functions/reconciler/reaper"
	"github.com/sockfleet/sockfleet/functions/reconciler/rounds"
	"github.com/sockfleet/sockfleet/functions/reconciler/sweep"
	"github.com/sockfleet/sockfleet/shared/lease"
	"github.com/sockfleet/sockfleet/shared/local/ddbtest"
	"github.com/sockfleet/sockfleet/shared/local/demoupstream"
	"github.com/sockfleet/sockfleet/shared/local/fleet"
	"github.com/sockfleet/sockfleet/shared/local/streampoller"
	"github.com/sockfleet/sockfleet/shared/registry"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/shared/wakeup"
)

const (
	secret  = "e2e-wakeup-secret-0123456789"
	cluster = "e2e"
)

var workerBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sockfleet-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	workerBin = filepath.Join(dir, "worker")
	build := exec.Command("go", "build", "-o", workerBin, "github.com/sockfleet/sockfleet/worker")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build the worker:", err)
		os.Exit(1)
	}
	defer os.RemoveAll(dir)
	ddbtest.Main(m)
}

// recordingSender is the real wakeup client, remembering where it sent what, and
// every handoff with its answer.
type recordingSender struct {
	wakeup.Client
	mu       sync.Mutex
	calls    []string // addr/id
	handoffs []handoff
}

// handoff is one move sent by a rebalance round.
type handoff struct {
	at     time.Time
	addr   string
	conn   wakeup.Conn
	result wakeup.Result // "" if the owner did not answer
}

func (s *recordingSender) Send(ctx context.Context, addr string, req wakeup.Request) (wakeup.Response, error) {
	s.mu.Lock()
	for _, c := range req.Conns {
		s.calls = append(s.calls, addr+"/"+c.ID)
	}
	s.mu.Unlock()
	at := time.Now()
	resp, err := s.Client.Send(ctx, addr, req)
	got := map[string]wakeup.Result{}
	for _, r := range resp.Results {
		got[r.ID] = r.Result
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range req.Conns {
		if c.Reason == wakeup.Handoff {
			s.handoffs = append(s.handoffs, handoff{at: at, addr: addr, conn: c, result: got[c.ID]})
		}
	}
	return resp, err
}

func (s *recordingSender) sent(entry string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.calls {
		if c == entry {
			return true
		}
	}
	return false
}

type stack struct {
	t      *testing.T
	e      *ddbtest.Env
	up     *demoupstream.Server
	sup    *fleet.Supervisor
	h      *handler.Handler
	poller *streampoller.Poller
	sender *recordingSender
	reg    *registry.Registry
	store  *lease.Store
	n      int    // worker slots
	cap    int    // each worker's capacity (stackOpts.maxConns)
	dir    string // worker logs and sinks (<id>.sink)

	mu      sync.Mutex
	closing bool
	exits   sync.WaitGroup // task-stopped events being handled
}

func newStack(t *testing.T) *stack {
	t.Helper()
	return newStackOf(t, 2, 10, 500*time.Millisecond)
}

// newStackOf runs workers workers, each taking at most maxConns connections, and a
// reconciler that gives each wakeup wakeupTimeout.
func newStackOf(t *testing.T, workers, maxConns int, wakeupTimeout time.Duration) *stack {
	t.Helper()
	return newStackWith(t, stackOpts{workers: workers, maxConns: maxConns, wakeupTimeout: wakeupTimeout})
}

// stackOpts shapes a stack: rate is the upstream's messages per second per stream
// (default 20); rounds, if set, runs rebalance rounds in the reconciler.
type stackOpts struct {
	workers, maxConns int
	wakeupTimeout     time.Duration
	rate              float64
	rounds            *rounds.Config
	collector         *fleet.Collector // every worker's sink, if set (instead of a file)
}

func newStackWith(t *testing.T, o stackOpts) *stack {
	t.Helper()
	workers, maxConns, wakeupTimeout := o.workers, o.maxConns, o.wakeupTimeout
	e := ddbtest.New(t)
	up, err := demoupstream.Listen("127.0.0.1:0", demoupstream.Config{Rate: cmp.Or(o.rate, 20)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close() })
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	s := &stack{t: t, e: e, up: up, reg: &registry.Registry{DB: e.DB, Table: e.Table}, n: workers, cap: maxConns}
	s.store, err = lease.New(e.DB, lease.Config{Table: e.Table})
	if err != nil {
		t.Fatal(err)
	}
	sw, err := sweep.New(e.DB, s.store, s.reg, sweep.Config{Table: e.Table}, log)
	if err != nil {
		t.Fatal(err)
	}
	s.sender = &recordingSender{Client: wakeup.Client{Secret: []byte(secret)}}
	var rr *rounds.Rounds
	if o.rounds != nil {
		if rr, err = rounds.New(*o.rounds, &rounds.Reader{DB: e.DB, Table: e.Table}, s.sender, log); err != nil {
			t.Fatal(err)
		}
	}
	s.h, err = handler.New(handler.Config{ClusterARN: fleet.ClusterARN(cluster), WakeupTimeout: wakeupTimeout},
		handler.Deps{Registry: s.reg, Leases: s.store, Sweeper: sw, Sender: s.sender, Log: log, Rounds: rr,
			Members: &reaper.Reaper{Registry: s.reg, Leases: s.store, Skew: schema.DefaultSkewMargin, Log: log}})
	if err != nil {
		t.Fatal(err)
	}
	s.poller, err = streampoller.New(e.Streams, streampoller.Config{Table: e.Table, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.poller.Run(ctx, s.h.HandleStream) }()

	logDir := t.TempDir()
	s.dir = logDir
	s.sup = &fleet.Supervisor{
		Bin:    workerBin,
		LogDir: logDir,
		Env: func(_ int, id string, port int) []string {
			addr := fmt.Sprintf("127.0.0.1:%d", port)
			sink := "file:" + filepath.Join(logDir, id+".sink")
			if o.collector != nil {
				sink = o.collector.URL(id)
			}
			return append(e.Environ(),
				schema.EnvTable+"="+e.Table, schema.EnvWorkerID+"="+id,
				schema.EnvListenAddr+"="+addr, schema.EnvAdvertiseAddr+"="+addr,
				schema.EnvWakeupSecret+"="+secret, schema.EnvMaxConnections+"="+strconv.Itoa(maxConns),
				schema.EnvDrainTimeout+"=5s", schema.EnvSink+"="+sink)
		},
		// Play ECS: a worker that exits becomes a task-stopped event.
		OnExit: func(_ int, id string, exitErr error) {
			s.mu.Lock()
			if s.closing {
				s.mu.Unlock()
				return
			}
			s.exits.Add(1)
			s.mu.Unlock()
			defer s.exits.Done()
			// The first event ECS sends: the worker container stopped, the task not yet.
			ev := fleet.WorkerExitedEvent(cluster, id, fleet.ExitCode(exitErr), "Essential container in task exited", time.Now())
			if _, err := s.h.Handle(context.Background(), ev); err != nil {
				t.Errorf("task-stopped event for %s: %v", id, err)
			}
		},
	}
	for slot := range workers {
		if _, err := s.sup.Start(ctx, slot, freePort(t)); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		s.mu.Lock()
		s.closing = true // the workers' exits from here on are the test ending, not news
		s.mu.Unlock()
		s.stopWorkers(10 * time.Second)
		s.exits.Wait()
		cancel()
		<-done
		if t.Failed() {
			dumpLogs(t, logDir)
		}
	})
	s.waitFor("every worker registered", 10*time.Second, func() bool {
		ws, _, err := s.reg.List(context.Background())
		return err == nil && len(registry.Live(ws, time.Now())) == workers
	})
	return s
}

// stopWorkers drains every worker (SIGTERM), killing what is left after grace. It
// signals the processes itself rather than calling Supervisor.Stop, whose write of
// Restart races with the exit goroutines' unlocked read of it.
func (s *stack) stopWorkers(grace time.Duration) {
	deadline := time.After(grace)
	for slot := range s.n {
		p := s.sup.Get(slot)
		if p == nil {
			continue
		}
		_ = s.sup.Signal(slot, syscall.SIGTERM)
		select {
		case <-p.Done():
		case <-deadline:
			_ = s.sup.Signal(slot, syscall.SIGKILL)
			<-p.Done()
		}
	}
}

func (s *stack) put(id string, state schema.State) {
	s.t.Helper()
	c := codec.Connection{ID: id, DesiredState: state, WSURL: s.up.URL(id)}
	if _, err := s.e.DB.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: &s.e.Table, Item: codec.EncodeConnection(c)}); err != nil {
		s.t.Fatal(err)
	}
}

func (s *stack) setState(id string, state schema.State) {
	s.t.Helper()
	_, err := s.e.DB.UpdateItem(context.Background(), &dynamodb.UpdateItemInput{
		TableName: &s.e.Table, Key: map[string]types.AttributeValue{schema.AttrPK: codec.S(schema.ConnKey(id))},
		UpdateExpression:          aws.String("SET #d = :d"),
		ExpressionAttributeNames:  map[string]string{"#d": schema.AttrDesiredState},
		ExpressionAttributeValues: map[string]types.AttributeValue{":d": codec.S(string(state))},
	})
	if err != nil {
		s.t.Fatal(err)
	}
}

func (s *stack) owner(id string) string {
	c, err := s.store.Get(context.Background(), id)
	if err != nil || !c.Owned() {
		return ""
	}
	return c.LeaseOwner
}

// waitFor polls cond every 5 ms and returns how long it took to hold.
func (s *stack) waitFor(what string, limit time.Duration, cond func() bool) time.Duration {
	s.t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > limit {
			s.t.Fatalf("%s: not within %s", what, limit)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(start)
}

func (s *stack) streaming(id string) bool { return s.up.Stats(id).Clients == 1 }

func (s *stack) slotOf(worker string) int {
	for slot := range s.n {
		if p := s.sup.Get(slot); p != nil && p.ID == worker {
			return slot
		}
	}
	s.t.Fatalf("no slot runs %s", worker)
	return -1
}

func TestNewStartedItemStreamsWithinOneSecond(t *testing.T) {
	s := newStack(t)
	s.put("fresh", schema.Started)
	took := s.waitFor("streaming", time.Second, func() bool { return s.streaming("fresh") })
	t.Logf("INSERT STARTED → streaming in %s", took)
	if s.owner("fresh") == "" {
		t.Error("streaming without a lease")
	}
}

func TestStoppedClosesWithinOneSecond(t *testing.T) {
	s := newStack(t)
	s.put("c", schema.Started)
	s.waitFor("streaming", time.Second, func() bool { return s.streaming("c") })
	s.setState("c", schema.Stopped)
	took := s.waitFor("closed", time.Second, func() bool { return s.up.Stats("c").Clients == 0 })
	t.Logf("STOPPED → socket closed in %s", took)
	s.waitFor("released", time.Second, func() bool { return s.owner("c") == "" })
}

func TestReleasedLeaseReownedByTheOtherWorker(t *testing.T) {
	s := newStack(t)
	s.put("c", schema.Started)
	s.waitFor("streaming", time.Second, func() bool { return s.streaming("c") })
	first := s.owner("c")
	// A graceful stop: the worker drains, releasing its lease (lease_expires_at_ms = 0);
	// the release streams to the reconciler, which wakes the other worker.
	if err := s.sup.Signal(s.slotOf(first), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	took := s.waitFor("re-owned", 5*time.Second, func() bool {
		o := s.owner("c")
		return o != "" && o != first && s.streaming("c")
	})
	t.Logf("release by %s → re-owned by %s in %s", first, s.owner("c"), took)
	if st := s.up.Stats("c"); st.MaxClients > 1 {
		t.Errorf("two workers streamed c at once: %+v", st)
	}
}

func TestKilledWorkersConnectionsReowned(t *testing.T) {
	s := newStack(t)
	ids := []string{"k1", "k2", "k3", "k4"}
	for _, id := range ids {
		s.put(id, schema.Started)
	}
	s.waitFor("all streaming", 2*time.Second, func() bool {
		for _, id := range ids {
			if !s.streaming(id) {
				return false
			}
		}
		return true
	})
	victim := s.owner("k1")
	var theirs []string
	for _, id := range ids {
		if s.owner(id) == victim {
			theirs = append(theirs, id)
		}
	}
	// SIGKILL: no drain, no release. The supervisor's task-stopped event is the only
	// news; the leases would otherwise sit until they expire (60 s).
	if err := s.sup.Signal(s.slotOf(victim), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	took := s.waitFor("re-owned by the survivor", 5*time.Second, func() bool {
		for _, id := range theirs {
			if o := s.owner(id); o == "" || o == victim {
				return false
			}
		}
		return true
	})
	t.Logf("kill of %s → its %d connections re-owned in %s", victim, len(theirs), took)
	s.waitFor("streaming again", 5*time.Second, func() bool {
		for _, id := range theirs {
			if !s.streaming(id) {
				return false
			}
		}
		return true
	})
}

// A hung worker (SIGSTOP) renews nothing: once its membership lease lapsed beyond
// the skew margin, the reconciler, driven by the other worker's heartbeats, declares
// it dead and releases its connections, which the survivor takes. Let go again
// (SIGCONT), it learns it was declared dead and exits without delivering.
func TestHungWorkerDeclaredDeadAndReowned(t *testing.T) {
	s := newStack(t)
	ids := []string{"h1", "h2", "h3", "h4"}
	for _, id := range ids {
		s.put(id, schema.Started)
	}
	s.waitFor("all streaming", 2*time.Second, func() bool {
		for _, id := range ids {
			if !s.streaming(id) {
				return false
			}
		}
		return true
	})
	victim := s.owner("h1")
	var theirs []string
	for _, id := range ids {
		if s.owner(id) == victim {
			theirs = append(theirs, id)
		}
	}
	slot := s.slotOf(victim)
	proc := s.sup.Get(slot)
	if err := s.sup.Signal(slot, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	took := s.waitFor("re-owned by the survivor", 25*time.Second, func() bool {
		for _, id := range theirs {
			if o := s.owner(id); o == "" || o == victim {
				return false
			}
		}
		return true
	})
	t.Logf("SIGSTOP of %s → its %d connections re-owned in %s (lease 11 s, skew 2 s)", victim, len(theirs), took)
	if took < 9*time.Second {
		t.Errorf("re-owned after %s: before the hung member's lease could have lapsed", took)
	}
	if err := s.sup.Signal(slot, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-proc.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the declared-dead worker did not exit after SIGCONT")
	}
	for _, id := range theirs {
		if o := s.owner(id); o == "" || o == victim {
			t.Errorf("%s owned by %q after the dead worker came back", id, o)
		}
	}
}

func TestWakeupToDeadAddressIsRerouted(t *testing.T) {
	s := newStack(t)
	// A registered, apparently live and idle worker at an address nobody listens on:
	// the least loaded candidate, so it is offered the id first.
	dead := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	if err := s.reg.Put(context.Background(), codec.Worker{ID: "ghost", Addr: dead, Capacity: 1000,
		HeartbeatExpiresAtMs: time.Now().Add(time.Hour).UnixMilli()}); err != nil {
		t.Fatal(err)
	}
	ws, _, _ := s.reg.List(context.Background())
	if first := dispatch.Workers(ws, time.Now()); len(first) == 0 || first[0].ID != "ghost" {
		t.Fatalf("the ghost is not the first choice: %+v", first)
	}
	s.put("r", schema.Started)
	took := s.waitFor("streaming", time.Second, func() bool { return s.streaming("r") })
	if !s.sender.sent(dead + "/r") {
		t.Error("the dead address was never tried")
	}
	if o := s.owner("r"); o == "" || o == "ghost" {
		t.Errorf("owner %q", o)
	}
	t.Logf("dead address refused; re-routed and streaming in %s", took)
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

func dumpLogs(t *testing.T, dir string) {
	files, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	for _, f := range files {
		b, _ := os.ReadFile(f)
		if len(b) > 8000 {
			b = b[len(b)-8000:]
		}
		t.Logf("=== %s\n%s", filepath.Base(f), b)
	}
}
