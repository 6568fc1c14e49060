package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/sockfleet/sockfleet/shared/lease"
	"github.com/sockfleet/sockfleet/shared/local/dynoxide"
	"github.com/sockfleet/sockfleet/shared/local/fleet"
	"github.com/sockfleet/sockfleet/shared/local/kinesalite"
	"github.com/sockfleet/sockfleet/shared/local/kinesalite/kinesistest"
	"github.com/sockfleet/sockfleet/shared/registry"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/sinkrecord"
)

// lockedBuffer is written by the fleet while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
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

// binaries builds the worker and the reconciler once for the test binary.
func binaries(t *testing.T) fleet.Binaries {
	t.Helper()
	bins, err := fleet.BuildOnce()
	if err != nil {
		t.Fatal(err)
	}
	return bins
}

// localFleet is one run of what `make run` runs, in a goroutine.
type localFleet struct {
	o      options
	out    lockedBuffer
	done   chan struct{} // closed when run has returned err
	err    error
	cancel context.CancelFunc
	store  *lease.Store
	reg    *registry.Registry
}

// startLocal starts a fleet in its own folder on free ports: every port flag at 0.
func startLocal(t *testing.T, bins fleet.Binaries, env ...string) *localFleet {
	t.Helper()
	return startLocalWith(t, bins, nil, env...)
}

// startLocalWith is startLocal with edit (may be nil) applied to the options.
func startLocalWith(t *testing.T, bins fleet.Binaries, edit func(*options), env ...string) *localFleet {
	t.Helper()
	dir := t.TempDir()
	f := &localFleet{
		o: options{
			dir: dir, table: schema.DefaultTableName, bin: filepath.Dir(bins.Worker), rie: bins.RIE,
			dbPort: freePort(t), workers: 2, demos: 3, rate: 20, sweep: time.Minute,
			lambdaAddr: "127.0.0.1:0", upstream: "127.0.0.1:0", workerEnv: env,
			network: true, // as `make run`: the template's security groups, from cdk.out
		},
		done: make(chan struct{}),
	}
	if edit != nil {
		edit(&f.o)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	go func() { f.err = run(ctx, f.o, &f.out, slog.New(slog.DiscardHandler)); close(f.done) }()
	db := dynamodb.New(dynamodb.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(fmt.Sprintf("http://127.0.0.1:%d", f.o.dbPort)),
		Credentials: credentials.NewStaticCredentialsProvider("local", "local", ""),
	})
	var err error
	if f.store, err = lease.New(db, lease.Config{Table: f.o.table}); err != nil {
		t.Fatal(err)
	}
	f.reg = &registry.Registry{DB: db, Table: f.o.table}
	t.Cleanup(func() {
		cancel()
		select {
		case <-f.done:
		case <-time.After(60 * time.Second):
		}
	})
	return f
}

// streaming counts the demo connections owned with a checkpoint.
func (f *localFleet) streaming(ctx context.Context) int {
	n := 0
	for i := 1; i <= f.o.demos; i++ {
		if c, err := f.store.Get(ctx, fmt.Sprintf("demo-%d", i)); err == nil && c.Owned() && c.LastSeq > 0 {
			n++
		}
	}
	return n
}

func (f *localFleet) checkRunning(t *testing.T) {
	t.Helper()
	select {
	case <-f.done:
		t.Fatalf("run ended early: %v\n%s", f.err, f.out.String())
	default:
	}
}

// TestTwoFleetsRunSideBySide runs what `make run` runs twice at once, each with its
// own folder and free ports (the emulators' runtime APIs included): both fleets'
// demo connections stream at the same time, the explicit worker setting of one
// reaches its workers over an inherited variable, and stopping drains every worker,
// so each file-backed table, reopened, shows every lease released with its checkpoint.
func TestTwoFleetsRunSideBySide(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two local fleets")
	}
	bins := binaries(t)
	// Inherited by this process, and so once by the workers; never again.
	t.Setenv(schema.EnvMaxConnections, "1")
	// a as `make run` has it, with Jaeger (on free ports); b with -tracing=false.
	a := startLocalWith(t, bins, func(o *options) { o.tracing, o.jaegerPort, o.otlpPort, o.viewerPort = true, 0, 0, 0 },
		schema.EnvMaxConnections+"=7")
	b := startLocal(t, bins)
	ctx := context.Background()

	deadline := time.Now().Add(2 * time.Minute)
	for a.streaming(ctx) < a.o.demos || b.streaming(ctx) < b.o.demos {
		a.checkRunning(t)
		b.checkRunning(t)
		if time.Now().After(deadline) {
			t.Fatalf("both fleets not streaming within 2 minutes: %d and %d of %d\n--- a\n%s\n--- b\n%s",
				a.streaming(ctx), b.streaming(ctx), a.o.demos, a.out.String(), b.out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, f := range []*localFleet{a, b} {
		if out := f.out.String(); !strings.Contains(out, "sockfleet is running locally") || !strings.Contains(out, "sockfleet watch") {
			t.Errorf("the banner does not say what runs and what to try:\n%s", out)
		}
		if out := f.out.String(); !strings.Contains(out, "network rules     the security groups of ") {
			t.Errorf("the banner does not say the network rules are enforced:\n%s", out)
		}
	}
	// The banner names a's Jaeger, which answers, and the search link of a
	// connection; b says tracing is off.
	ui := regexp.MustCompile(`Jaeger UI (http://127\.0\.0\.1:\d+) `).FindStringSubmatch(a.out.String())
	if ui == nil || !strings.Contains(a.out.String(), ui[1]+"/search?") || !strings.Contains(a.out.String(), "sockfleet.conn") {
		t.Errorf("the banner does not give the Jaeger UI and a connection's search link:\n%s", a.out.String())
	} else if resp, err := http.Get(ui[1] + "/api/services"); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("the banner's Jaeger at %s does not answer: %v", ui[1], err)
	} else {
		resp.Body.Close()
	}
	// The trace page of a connection answers: its trace, or a 404 saying there is none yet.
	if page := regexp.MustCompile(`(http://127\.0\.0\.1:\d+/conn/demo-1)\n`).FindStringSubmatch(a.out.String()); page == nil {
		t.Errorf("the banner does not give demo-1's trace page:\n%s", a.out.String())
	} else if resp, err := http.Get(page[1]); err != nil || (resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusNotFound) {
		t.Errorf("demo-1's trace page %s: %v %v", page[1], resp, err)
	} else {
		resp.Body.Close()
	}
	if out := b.out.String(); !strings.Contains(out, "traces            off (-tracing=false)") || strings.Contains(out, "Jaeger UI") {
		t.Errorf("-tracing=false, yet the banner says otherwise:\n%s", out)
	}
	for _, tc := range []struct {
		f    *localFleet
		want int
	}{{a, 7}, {b, 1000}} {
		ws, _, err := tc.f.reg.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(ws) != tc.f.o.workers {
			t.Errorf("%d workers registered, want %d", len(ws), tc.f.o.workers)
		}
		for _, w := range ws {
			if w.Capacity != tc.want {
				t.Errorf("worker %s has capacity %d, want %d (-worker-env %v)", w.ID, w.Capacity, tc.want, tc.f.o.workerEnv)
			}
		}
	}

	a.cancel() // Ctrl-C, both
	b.cancel()
	for _, f := range []*localFleet{a, b} {
		select {
		case <-f.done:
			if f.err != nil {
				t.Fatal(f.err)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("stopping took over 60s")
		}
		// The state is on disk: reopen it and find every lease given back with its checkpoint.
		engine, err := dynoxide.Start(dynoxide.Options{Port: f.o.dbPort, DBPath: filepath.Join(f.o.dir, "dynoxide.db")})
		if err != nil {
			t.Fatal(err)
		}
		for i := 1; i <= f.o.demos; i++ {
			c, err := f.store.Get(ctx, fmt.Sprintf("demo-%d", i))
			if err != nil {
				t.Fatal(err)
			}
			if c.Owned() || c.LastSeq == 0 || c.Status != "released" {
				t.Errorf("after stop, %s is %+v; want released with its checkpoint", c.ID, c)
			}
		}
		engine.Stop()
	}
}

// TestRunRefusesBadWorkerSettings: a bad -worker-env entry stops run at once with a
// message naming it, before anything starts.
func TestRunRefusesBadWorkerSettings(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the worker")
	}
	bins := binaries(t)
	for _, tc := range []struct{ env, want string }{
		{schema.EnvLease + "=banana", schema.EnvLease},
		{schema.EnvWorkerID + "=w9", "set by the local fleet"},
		{"SOCKFLEET_RESUM=none", "not a variable the worker reads"},
		{"SOCKFLEET_RESUME", "NAME=VALUE"},
	} {
		dir := t.TempDir()
		o := options{dir: dir, table: schema.DefaultTableName, bin: filepath.Dir(bins.Worker), rie: bins.RIE,
			dbPort: freePort(t), workers: 1, lambdaAddr: "127.0.0.1:0", upstream: "127.0.0.1:0", workerEnv: envList{tc.env}}
		err := run(context.Background(), o, io.Discard, slog.New(slog.DiscardHandler))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("-worker-env %s: %v, want an error saying %q", tc.env, err, tc.want)
		}
		if _, err := os.Stat(filepath.Join(dir, "dynoxide.db")); err == nil {
			t.Errorf("-worker-env %s: the engine started anyway", tc.env)
		}
	}
	var l envList
	if err := l.Set("SOCKFLEET_WORKER_ID=x"); err == nil {
		t.Error("the flag accepted a fleet-owned variable")
	}
}

// TestRunWithKinesisSink runs what `make run SINK=kinesis` runs: the demo
// connections stream into a stream on kinesalite, and after the drain the
// file-backed stream, reopened, holds every message up to each released checkpoint,
// each connection under its own partition key and without a gap.
func TestRunWithKinesisSink(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a local fleet")
	}
	bins := binaries(t)
	port := freePort(t)
	f := startLocalWith(t, bins, func(o *options) { o.sink, o.kinesisPort = "kinesis", port })
	ctx := context.Background()
	deadline := time.Now().Add(2 * time.Minute)
	for f.streaming(ctx) < f.o.demos {
		f.checkRunning(t)
		if time.Now().After(deadline) {
			t.Fatalf("not streaming within 2 minutes: %d of %d\n%s", f.streaming(ctx), f.o.demos, f.out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if out := f.out.String(); !strings.Contains(out, "tail kinesis:"+localStream) {
		t.Errorf("the banner does not say how to read the stream:\n%s", out)
	}
	f.cancel()
	select {
	case <-f.done:
		if f.err != nil {
			t.Fatal(f.err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("stopping took over 60s")
	}
	engine, err := dynoxide.Start(dynoxide.Options{Port: f.o.dbPort, DBPath: filepath.Join(f.o.dir, "dynoxide.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer engine.Stop()
	checkpoints := map[string]int64{}
	for i := 1; i <= f.o.demos; i++ {
		c, err := f.store.Get(ctx, fmt.Sprintf("demo-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if c.Owned() || c.LastSeq == 0 {
			t.Errorf("after stop, %s is %+v; want released with its checkpoint", c.ID, c)
		}
		checkpoints[c.ID] = c.LastSeq
	}
	ks, err := kinesalite.Start(kinesalite.Options{Port: port, Path: kinesisPath(f.o)})
	if err != nil {
		t.Fatal(err)
	}
	defer ks.Stop()
	recs, err := kinesistest.ReadAll(ctx, kinesistest.Client(ks.Endpoint), localStream)
	if err != nil {
		t.Fatal(err)
	}
	next := map[string]int64{}
	for _, r := range recs {
		m, err := sinkrecord.Parse(r.Data)
		if err != nil || m.Conn != r.PartitionKey {
			t.Fatalf("record %q under key %s: %v", r.Data, r.PartitionKey, err)
		}
		if m.Seq > next[m.Conn]+1 {
			t.Fatalf("%s: gap in the stream: %d after %d", m.Conn, m.Seq, next[m.Conn])
		}
		next[m.Conn] = max(next[m.Conn], m.Seq)
	}
	for id, cp := range checkpoints {
		if next[id] < cp {
			t.Errorf("%s: the stream holds up to %d, checkpoint %d", id, next[id], cp)
		}
	}
}

// TestNetworkRulesOption: on, the template must be there, and the error says how to
// make it or run without; off, none is read.
func TestNetworkRulesOption(t *testing.T) {
	if tm, err := networkRules(options{}); tm != nil || err != nil {
		t.Errorf("off: %v, %v; want nothing", tm, err)
	}
	_, err := networkRules(options{network: true, template: filepath.Join(t.TempDir(), "missing.template.json")})
	if err == nil || !strings.Contains(err.Error(), "-network-rules=false") {
		t.Errorf("a missing template: %v; want an error naming -network-rules=false", err)
	}
	t.Chdir(t.TempDir()) // no cdk.out here or above
	_, err = networkRules(options{network: true})
	if err == nil || !strings.Contains(err.Error(), "make template") {
		t.Errorf("no cdk.out: %v; want an error saying to synthesize it", err)
	}
}
