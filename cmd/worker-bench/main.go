// Command worker-bench measures one worker process against the demo upstream and the
// local DynamoDB engine, as separate processes, and prints the results as Markdown:
//
//   - resident memory per idle connection at several connection counts: the worker's
//     VmRSS with N idle streaming connections, less its VmRSS with none, over N;
//   - messages per second one worker delivers to a file sink, with the upstream
//     sending as fast as the worker reads;
//   - with -tracing both, the two above with tracing off and on side by side: on,
//     the worker exports its spans over OTLP/HTTP to a local Jaeger (a real
//     receiver), as `make run` has it;
//   - the same to Kinesis Data Streams on kinesalite next to the file sink, the
//     latency from the upstream's send to the Kinesis record, and a 10 s Kinesis
//     stall: leases renewed through it, renew failures, memory, backpressure.
//
// `make bench` runs it. It builds the worker and demo-upstream binaries first, so it
// needs the Go toolchain, and the local engine that `make tools` installs. Each
// process needs one descriptor per socket: 10,000 connections need 10,000 in the
// worker and 10,000 in the upstream, so the two run as separate processes (Go raises
// each process's soft RLIMIT_NOFILE to the hard limit at start-up).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/local/dynoxide"
	"github.com/sockfleet/sockfleet/shared/local/fleet"
	"github.com/sockfleet/sockfleet/shared/local/jaeger"
	"github.com/sockfleet/sockfleet/shared/local/localddb"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

func main() {
	counts := flag.String("idle", "1000,5000,10000", "idle connection counts for the memory measurement")
	tput := flag.String("throughput", "1,100", "connection counts for the file-sink throughput measurement")
	dur := flag.Duration("duration", 10*time.Second, "throughput measurement window")
	size := flag.Int("size", 64, "payload bytes per message in the throughput run")
	// The worker's stream-mode defaults: the membership lease is one write per worker,
	// whatever the connection count (and may be at most 30 s), so renewals no longer
	// compete with the start-up acquisitions. Timings do not change what a socket
	// costs in memory.
	flag.DurationVar(&timings.lease, "lease", 11*time.Second, "worker membership lease duration")
	flag.DurationVar(&timings.renew, "renew", 3*time.Second, "worker renew interval")
	flag.DurationVar(&timings.deadline, "renew-deadline", 7*time.Second, "worker renew deadline")
	flag.StringVar(&kin.conns, "kinesis", "1,100", "connection counts for the Kinesis-vs-file sink comparison (empty: skip the Kinesis runs)")
	flag.IntVar(&kin.latConns, "kinesis-latency-conns", 100, "connections of the Kinesis latency and stall runs")
	flag.Float64Var(&kin.latRate, "kinesis-latency-rate", 10, "messages/s per connection in the Kinesis latency and stall runs")
	flag.DurationVar(&kin.stall, "kinesis-stall", 10*time.Second, "how long Kinesis stops answering in the stall run")
	flag.StringVar(&timings.mode, "mode", "", "worker mode (SOCKFLEET_MODE): stream or polling; empty: the worker's default")
	flag.StringVar(&tracing, "tracing", "off", "the memory and throughput runs with tracing off, on (spans exported to a local Jaeger) or both, side by side")
	flag.DurationVar(&idleWait, "idle-wait", 5*time.Minute, "how long the memory run waits for all connections to be acquired, and again for all to be connected")
	wss := flag.String("schemes", "ws,wss", "upstream schemes of the memory measurement: ws, wss or both")
	flag.BoolVar(&withSpec, "spec", true, "give every idle connection a spec: 3 headers (one a secret), 2 open messages and a keepalive")
	flag.Parse()
	for _, f := range strings.Split(*wss, ",") {
		switch strings.TrimSpace(f) {
		case "ws":
			schemes = append(schemes, false)
		case "wss":
			schemes = append(schemes, true)
		default:
			fmt.Fprintf(os.Stderr, "worker-bench: -schemes %q: want ws, wss or ws,wss\n", *wss)
			os.Exit(2)
		}
	}
	if err := run(parseInts(*counts), parseInts(*tput), *dur, *size); err != nil {
		fmt.Fprintln(os.Stderr, "worker-bench:", err)
		os.Exit(1)
	}
}

var timings struct {
	lease, renew, deadline time.Duration
	mode                   string
}

var kin struct {
	conns    string
	latConns int
	latRate  float64
	stall    time.Duration
}

// withSpec: the memory measurement's connections carry benchSpec.
var withSpec bool

// tracing: off, on or both (tracingModes).
var tracing string

// tracingModes are the tracing settings the memory and throughput runs are made
// with, in order.
func tracingModes(flag string) ([]bool, error) {
	switch flag {
	case "off":
		return []bool{false}, nil
	case "on":
		return []bool{true}, nil
	case "both":
		return []bool{false, true}, nil
	}
	return nil, fmt.Errorf("-tracing %q: want off, on or both", flag)
}

// schemes of the memory measurement: false ws://, true wss://.
var schemes []bool

// idleWait bounds the memory run's wait for acquisitions, and then for sockets.
var idleWait time.Duration

// benchSpec is the "spec of 3 headers, 2 open messages and a keepalive",
// with one header from a secret served by the local secrets file.
var benchSpec = schema.Spec{
	Headers: map[string]string{"Authorization": "Bearer {{secret:bench/token}}", "X-Client": "sockfleet-bench",
		"X-Request-Source": "worker-bench/{conn}"},
	OpenMessages: []schema.OpenMessage{
		{Text: `{"type":"subscribe","channel":"{conn}","after":{seq}}`},
		{Text: `{"type":"options","compression":"none"}`},
	},
	Keepalive: &schema.Keepalive{Message: `{"type":"KeepAlive"}`, Interval: 30 * time.Second},
}

func parseInts(s string) []int {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if n, err := strconv.Atoi(strings.TrimSpace(f)); err == nil && n > 0 {
			out = append(out, n)
		}
	}
	return out
}

type bench struct {
	trace   []string // OTEL_* settings of every worker started (tracing on); nil: off
	col     bool     // the tables have a tracing column
	dir     string
	worker  string // binary
	up      string // binary
	engine  *dynoxide.Proc
	db      *dynamodb.Client
	tables  int
	workers int
	// cert and key: the wss upstream's certificate (benchCert), which the worker
	// trusts through SSL_CERT_FILE.
	cert, key string
}

func run(idle, tput []int, dur time.Duration, size int) error {
	modes, err := tracingModes(tracing)
	if err != nil {
		return err
	}
	var lim syscall.Rlimit
	_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	lim.Cur = lim.Max
	_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim) // children inherit it
	dir, err := os.MkdirTemp("", "worker-bench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	b := &bench{dir: dir, worker: filepath.Join(dir, "worker"), up: filepath.Join(dir, "demo-upstream")}
	if b.cert, b.key, err = benchCert(dir); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "secrets.json"), []byte(`{"bench/token":{"value":"bench-token-value","allowed_hosts":["127.0.0.1"]}}`), 0o600); err != nil {
		return err
	}
	for bin, pkg := range map[string]string{b.worker: "./worker", b.up: "./cmd/demo-upstream"} {
		if out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
			return fmt.Errorf("build %s: %v\n%s", pkg, err, out)
		}
	}
	if b.engine, err = dynoxide.Start(dynoxide.Options{}); err != nil {
		return err
	}
	defer b.engine.Stop()
	b.db = dynamodb.NewFromConfig(localConfig(), func(o *dynamodb.Options) { o.BaseEndpoint = aws.String(b.engine.Endpoint) })

	goVersion, _ := exec.Command("go", "env", "GOVERSION").Output()
	fmt.Printf("machine: %d cores (nproc), %s, %s, fd limit %d, %s; worker mode %q, lease %s, renew every %s, deadline %s; idle connections with a spec: %v\n\n",
		runtime.NumCPU(), runtime.GOARCH, strings.TrimSpace(string(goVersion)), lim.Cur, time.Now().Format("2006-01-02"),
		timings.mode, timings.lease, timings.renew, timings.deadline, withSpec)

	var traces *jaeger.Proc
	if slices.Contains(modes, true) {
		if traces, err = jaeger.Start(jaeger.Options{Log: io.Discard}); err != nil {
			return err
		}
		defer traces.Stop()
		fmt.Printf("tracing on: every worker exports its spans over OTLP/HTTP to Jaeger at %s\n\n", traces.OTLPEndpoint)
	}
	b.col = tracing != "off"
	// setTracing sets what the next workers run with.
	setTracing := func(on bool) {
		b.trace = nil
		if on {
			b.trace = fleet.TracingEnv(traces.OTLPEndpoint, fleet.WorkerService, "bench")
		}
	}
	if len(idle) > 0 {
		b.header("scheme", "idle connections", "worker RSS, none", "worker RSS, all streaming", "per connection", "acquire + connect time")
		for _, n := range idle {
			for _, on := range modes {
				setTracing(on)
				for _, secure := range schemes {
					if err := b.memory(n, secure); err != nil {
						return fmt.Errorf("memory at %d (wss %v): %w", n, secure, err)
					}
				}
			}
		}
		fmt.Println()
	}
	if len(tput) > 0 {
		b.header("connections", "payload", "messages/s to a file sink", "MB/s of file", "window")
		// Side by side, off-on-on-off: on a shared machine a later run of the same
		// size often goes slower or faster than an earlier one, whatever it runs.
		tmodes := modes
		if len(modes) == 2 {
			tmodes = []bool{false, true, true, false}
		}
		for _, n := range tput {
			for _, on := range tmodes {
				setTracing(on)
				if err := b.throughput(n, dur, size); err != nil {
					return fmt.Errorf("throughput at %d: %w", n, err)
				}
			}
		}
		fmt.Println()
	}
	setTracing(false)
	if k := parseInts(kin.conns); len(k) > 0 {
		if err := b.runKinesis(k, dur, size, kin.latConns, kin.latRate, kin.stall); err != nil {
			return err
		}
	}
	return nil
}

// proc is a child process.
type proc struct {
	cmd     *exec.Cmd
	addr    string
	tlsAddr string // the demo upstream's wss:// address, if it serves one
	log     string // the worker's stderr (warnings and errors), kept to explain a failed run
}

// explain adds to err a summary of the worker's log: each distinct message, how
// often it was logged, and its first record (the first is usually the cause).
func (p *proc) explain(err error) error {
	if err == nil || p.log == "" {
		return err
	}
	b, rerr := os.ReadFile(p.log)
	if rerr != nil {
		return err
	}
	var order []string
	first, count := map[string]string{}, map[string]int{}
	for _, l := range strings.Split(string(b), "\n") {
		var rec struct{ Msg string }
		if !strings.Contains(l, `"level":`) || json.Unmarshal([]byte(l), &rec) != nil {
			continue // the metric lines the worker also writes to stderr
		}
		if count[rec.Msg] == 0 {
			order, first[rec.Msg] = append(order, rec.Msg), l
		}
		count[rec.Msg]++
	}
	if len(order) == 0 {
		return err
	}
	var sum strings.Builder
	for _, m := range order {
		fmt.Fprintf(&sum, "\n%d× %s", count[m], first[m])
	}
	return fmt.Errorf("%w; the worker's log, first record of each message:%s", err, sum.String())
}

func (p *proc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(90 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
}

func (b *bench) upstream(rate float64, size int) (*proc, error) {
	return b.upstreamArgs(rate, size)
}

// upstreamArgs starts the demo upstream with extra flags; with -tls-addr it reads
// the wss address from the second readiness line.
func (b *bench) upstreamArgs(rate float64, size int, extra ...string) (*proc, error) {
	args := append([]string{"-addr", "127.0.0.1:0", "-rate", fmt.Sprint(rate), "-size", fmt.Sprint(size)}, extra...)
	cmd := exec.Command(b.up, args...)
	cmd.Stderr = io.Discard
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	br := bufio.NewReader(out)
	line, err := br.ReadString('\n')
	if err != nil {
		_ = cmd.Process.Kill()
		return nil, fmt.Errorf("demo upstream did not start: %w", err)
	}
	p := &proc{cmd: cmd, addr: strings.TrimSpace(strings.TrimPrefix(line, "listening "))}
	if slices.Contains(extra, "-tls-addr") {
		line, err := br.ReadString('\n')
		if err != nil {
			_ = cmd.Process.Kill()
			return nil, fmt.Errorf("demo upstream did not serve wss: %w", err)
		}
		p.tlsAddr = strings.TrimSpace(strings.TrimPrefix(line, "listening-tls "))
	}
	return p, nil
}

func freeAddr() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "127.0.0.1:18080"
	}
	defer ln.Close()
	return ln.Addr().String()
}

func (b *bench) startWorker(table string, max int, sink string) (*proc, error) {
	return b.startWorkerEnv(table, max, sink, nil)
}

// startWorkerEnv starts a worker with extra environment (later values win).
func (b *bench) startWorkerEnv(table string, max int, sink string, extra []string) (*proc, error) {
	addr := freeAddr()
	cmd := exec.Command(b.worker)
	cmd.Env = append(os.Environ(),
		"AWS_ENDPOINT_URL_DYNAMODB="+b.engine.Endpoint, "AWS_REGION=us-east-1",
		"AWS_ACCESS_KEY_ID=local", "AWS_SECRET_ACCESS_KEY=local",
		schema.EnvTable+"="+table, schema.EnvWorkerID+"=bench", schema.EnvListenAddr+"="+addr,
		schema.EnvMaxConnections+"="+strconv.Itoa(max), schema.EnvSink+"="+sink, schema.EnvSeqPath+"=seq",
		schema.EnvWakeupSecret+"=bench-secret-0123456789", schema.EnvLogLevel+"=warn",
		schema.EnvLease+"="+timings.lease.String(), schema.EnvRenewInterval+"="+timings.renew.String(),
		schema.EnvRenewDeadline+"="+timings.deadline.String(),
		schema.EnvSecretsFile+"="+filepath.Join(b.dir, "secrets.json"),
	)
	if timings.mode != "" {
		cmd.Env = append(cmd.Env, schema.EnvMode+"="+timings.mode)
	}
	cmd.Env = append(cmd.Env, b.trace...)
	cmd.Env = append(cmd.Env, extra...)
	b.workers++
	logPath := filepath.Join(b.dir, fmt.Sprintf("worker%d.log", b.workers))
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the child holds its own descriptor
	cmd.Stdout, cmd.Stderr = io.Discard, logFile
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &proc{cmd: cmd, addr: addr, log: logPath}, nil
}

// metric reads one counter from the worker's /metrics.
func metric(addr, name string) (int64, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			x, err := strconv.ParseFloat(v, 64) // the exposition format writes 1e+06 for a million
			return int64(x), err
		}
	}
	return 0, fmt.Errorf("no metric %s", name)
}

func rssKB(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, errors.New("no VmRSS")
}

// newTable creates a fresh table holding n STARTED connections to upstream addr.
func (b *bench) newTable(n int, upAddr string) (string, error) {
	return b.newTableURL(n, "ws://"+upAddr)
}

// newTableURL is newTable with the upstream's base URL (ws://ADDR or wss://ADDR).
func (b *bench) newTableURL(n int, base string) (string, error) {
	b.tables++
	table := fmt.Sprintf("bench%d", b.tables)
	ctx := context.Background()
	if _, err := localddb.EnsureTable(ctx, b.db, table); err != nil {
		return "", err
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	sem := make(chan struct{}, 8)
	for i := 0; i < n; i += 25 {
		var reqs []types.WriteRequest
		for j := i; j < min(n, i+25); j++ {
			id := fmt.Sprintf("c%05d", j)
			c := codec.Connection{ID: id, DesiredState: schema.Started, WSURL: base + "/streams/" + id}
			if withSpec {
				c.Spec = benchSpec
			}
			it := codec.EncodeConnection(c)
			// No reconciler runs here: the start-up pass takes them, which in stream
			// mode needs the mark the sweep leaves on connections nobody took.
			it[schema.AttrUnheldSince] = codec.N(time.Now().Add(-time.Hour).UnixMilli())
			reqs = append(reqs, types.WriteRequest{PutRequest: &types.PutRequest{Item: it}})
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			items := map[string][]types.WriteRequest{table: reqs}
			for len(items) > 0 {
				out, err := b.db.BatchWriteItem(ctx, &dynamodb.BatchWriteItemInput{RequestItems: items})
				if err != nil {
					select {
					case errs <- err:
					default:
					}
					return
				}
				items = out.UnprocessedItems
			}
		})
	}
	wg.Wait()
	select {
	case err := <-errs:
		return "", err
	default:
	}
	return table, nil
}

func waitMetric(addr, name string, want int64, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	var v int64
	var err error
	for time.Now().Before(deadline) {
		if v, err = metric(addr, name); err == nil && v >= want {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("%s = %d (err %v), want %d within %s", name, v, err, want, limit)
}

// memory measures the worker's resident memory per idle connection at n
// connections to the demo upstream, over ws:// or, with secure, over wss:// (TLS
// 1.3 to the bench's own certificate, trusted through SSL_CERT_FILE).
func (b *bench) memory(n int, secure bool) error {
	var up *proc
	var err error
	base, env := "", []string(nil)
	if secure {
		var addr string
		up, addr, err = b.tlsUpstream()
		base, env = "wss://"+addr, []string{"SSL_CERT_FILE=" + b.cert}
	} else {
		up, err = b.upstream(0, 64) // idle streams: connected, nothing sent
		if err == nil {
			base = "ws://" + up.addr
		}
	}
	if err != nil {
		return err
	}
	defer up.stop()
	// Baseline: the same worker with an empty table.
	empty, err := b.newTable(0, up.addr)
	if err != nil {
		return err
	}
	w0, err := b.startWorkerEnv(empty, n, "file:"+filepath.Join(b.dir, "idle0.jsonl"), env)
	if err != nil {
		return err
	}
	if err := waitMetric(w0.addr, "sockfleet_owned_connections", 0, 30*time.Second); err != nil {
		w0.stop()
		return err
	}
	time.Sleep(3 * time.Second)
	baseRSS, err := rssKB(w0.cmd.Process.Pid)
	w0.stop()
	if err != nil {
		return err
	}

	table, err := b.newTableURL(n, base)
	if err != nil {
		return err
	}
	start := time.Now()
	w, err := b.startWorkerEnv(table, n, "file:"+filepath.Join(b.dir, "idle.jsonl"), env)
	if err != nil {
		return err
	}
	defer w.stop()
	if err := waitMetric(w.addr, "sockfleet_owned_connections", int64(n), idleWait); err != nil {
		return w.explain(err)
	}
	// Owned is counted at acquisition; wait until every socket is up too.
	if err := waitUpstreamClients(up.addr, n, idleWait); err != nil {
		return w.explain(err)
	}
	took := time.Since(start)
	time.Sleep(5 * time.Second) // settle
	rss, err := rssKB(w.cmd.Process.Pid)
	if err != nil {
		return err
	}
	if f, _ := metric(w.addr, "sockfleet_self_fences_total"); f != 0 {
		return w.explain(fmt.Errorf("%d self-fences: the table could not keep up with the renewals", f))
	}
	per := float64(rss-baseRSS) / float64(n)
	fmt.Printf("%s| %s | %d | %.1f MiB | %.1f MiB | %.1f KiB | %s |\n", b.tracingCell(), strings.SplitN(base, ":", 2)[0], n,
		float64(baseRSS)/1024, float64(rss)/1024, per, took.Round(100*time.Millisecond))
	return nil
}

// waitUpstreamClients polls the demo upstream's stats until n clients are connected.
func waitUpstreamClients(addr string, n int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	got := 0
	for time.Now().Before(deadline) {
		resp, err := http.Get("http://" + addr + "/control/stats")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			got = strings.Count(string(body), `"clients":1,`)
			if got >= n {
				return nil
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	return fmt.Errorf("%d of %d upstream clients connected after %s", got, n, limit)
}

func (b *bench) throughput(n int, dur time.Duration, size int) error {
	out := filepath.Join(b.dir, fmt.Sprintf("tput%d.jsonl", n))
	defer os.Remove(out)
	msgs, mb, err := b.deliveryRate(n, size, dur, "file:"+out, nil)
	if err != nil {
		return err
	}
	fmt.Printf("%s| %d | %d B | %.0f | %.1f | %s |\n", b.tracingCell(), n, size, msgs, mb, dur)
	return nil
}

// header is the package's header, with a first column saying whether tracing was on
// when the tables have one.
func (b *bench) header(cols ...string) {
	if b.col {
		header(true, append([]string{"tracing"}, cols...)...)
		return
	}
	header(false, cols...)
}

// tracingCell is the row's tracing cell, when the tables have one.
func (b *bench) tracingCell() string {
	switch {
	case !b.col:
		return ""
	case b.trace != nil:
		return "| on "
	}
	return "| off "
}

func fileSize(path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return st.Size()
}
