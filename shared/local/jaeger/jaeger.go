// Package jaeger runs Jaeger (all in one: an OTLP/HTTP receiver, in-memory storage
// and the query API with its UI) as the local trace backend of `make run` and the
// fleet tests, and reads traces back from its query API.
//
// The binary is Jaeger's cmd/jaeger at a pinned version, built by `make local-tools`
// from a Go module of its own (.tools/jaeger), so the project's go.mod carries none of
// its dependencies.
//
// Guarantees: Start returns only once the query API answers and the OTLP port accepts
// connections; the process runs in its own process group and is killed if this
// process dies (Linux parent-death signal). Storage is memory only: traces are gone
// when it stops, and the oldest are dropped past MaxTraces. Not guaranteed: that a
// span sent is queryable at once; Jaeger batches what it receives, so readers poll.
package jaeger

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/sockfleet/sockfleet/shared/local/localengine"
)

// BinEnv overrides where the Jaeger binary is looked for.
const BinEnv = "SOCKFLEET_JAEGER"

// binRel is where `make local-tools` builds Jaeger, relative to the repo root.
const binRel = ".tools/bin/jaeger"

// Default ports: Jaeger's own, so its documentation and habits apply.
const (
	DefaultOTLPPort  = 4318
	DefaultQueryPort = 16686
)

// Options for Start. A port of 0 picks a free one.
type Options struct {
	Bin       string // the binary; "": FindBin
	OTLPPort  int    // the OTLP/HTTP receiver
	QueryPort int    // the query API and UI
	MaxTraces int    // kept in memory; default 100000
	Log       io.Writer
	Ready     time.Duration // how long it may take to serve; default 30s
}

// Proc is a running Jaeger.
type Proc struct {
	cmd    *exec.Cmd
	exited chan struct{}
	dir    string
	// OTLPEndpoint is the receiver's base URL (http://127.0.0.1:PORT), what
	// OTEL_EXPORTER_OTLP_ENDPOINT takes; spans go to OTLPEndpoint+"/v1/traces".
	OTLPEndpoint string
	// UI is the base URL of the query API and the UI.
	UI string
}

// attempts bounds the retries when a free port was taken before Jaeger bound it.
const attempts = 3

// Start runs Jaeger and waits until it serves.
func Start(o Options) (*Proc, error) {
	if o.Bin == "" {
		var err error
		if o.Bin, err = FindBin(); err != nil {
			return nil, err
		}
	}
	if o.MaxTraces == 0 {
		o.MaxTraces = 100000
	}
	if o.Ready == 0 {
		o.Ready = 30 * time.Second
	}
	if o.OTLPPort < 0 || o.QueryPort < 0 || o.MaxTraces < 0 {
		return nil, fmt.Errorf("jaeger: ports and trace count must not be negative (otlp %d, query %d, max traces %d)", o.OTLPPort, o.QueryPort, o.MaxTraces)
	}
	var lastErr error
	for range attempts {
		p, err := start(o)
		if err == nil {
			return p, nil
		}
		lastErr = err
		if o.OTLPPort != 0 && o.QueryPort != 0 {
			break // fixed ports: another try would meet the same conflict
		}
	}
	return nil, fmt.Errorf("jaeger did not start: %w", lastErr)
}

func start(o Options) (*Proc, error) {
	ports := []int{o.OTLPPort, o.QueryPort, 0} // the third: the query gRPC port, unused here
	for i, p := range ports {
		if p != 0 {
			// Refuse a fixed port in use here: the readiness check below would take
			// whoever serves it for this Jaeger.
			l, err := net.Listen("tcp", loopback(p))
			if err != nil {
				return nil, fmt.Errorf("port %d: %w", p, err)
			}
			l.Close()
			continue
		}
		var err error
		if ports[i], err = freePort(); err != nil {
			return nil, err
		}
	}
	dir, err := os.MkdirTemp("", "sockfleet-jaeger")
	if err != nil {
		return nil, err
	}
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte(Config(ports[0], ports[1], ports[2], o.MaxTraces)), 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	cmd := exec.Command(o.Bin, "--config", cfg)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Stdout, cmd.Stderr = o.Log, o.Log
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start jaeger %s: %w", o.Bin, err)
	}
	p := &Proc{
		cmd: cmd, exited: make(chan struct{}), dir: dir,
		OTLPEndpoint: "http://" + loopback(ports[0]),
		UI:           "http://" + loopback(ports[1]),
	}
	var werr error
	go func() { werr = cmd.Wait(); close(p.exited) }()
	if err := p.waitReady(o.Ready, &werr); err != nil {
		p.Stop()
		return nil, err
	}
	return p, nil
}

// Config is the collector configuration Start runs Jaeger with: only the OTLP/HTTP
// receiver (the exporter the fleet uses), memory storage, and the query API; every
// listener on loopback, and no internal metrics listener, so several run side by side.
// The query API traces nothing of its own (enable_tracing, on by default, would
// export Jaeger's own spans over OTLP/gRPC to 127.0.0.1:4317, where nothing listens).
func Config(otlpPort, queryPort, queryGRPCPort, maxTraces int) string {
	return fmt.Sprintf(`service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    traces:
      level: none
    logs:
      level: warn
extensions:
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: %d
  jaeger_query:
    enable_tracing: false
    storage:
      traces: memstore
    http:
      endpoint: %s
    grpc:
      endpoint: %s
receivers:
  otlp:
    protocols:
      http:
        endpoint: %s
processors:
  batch:
    timeout: 100ms
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
`, maxTraces, loopback(queryPort), loopback(queryGRPCPort), loopback(otlpPort))
}

func (p *Proc) waitReady(d time.Duration, werr *error) error {
	deadline := time.Now().Add(d)
	client := &http.Client{Timeout: time.Second}
	otlp := p.OTLPEndpoint[len("http://"):]
	for {
		err := p.ping(client)
		if err == nil {
			var c net.Conn
			if c, err = net.DialTimeout("tcp", otlp, 200*time.Millisecond); err == nil {
				c.Close()
				return nil
			}
		}
		select {
		case <-p.exited:
			return fmt.Errorf("jaeger exited at start: %v (are its ports in use?)", *werr)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("jaeger not serving after %s: %w", d, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (p *Proc) ping(client *http.Client) error {
	resp, err := client.Get(p.UI + "/api/services")
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET /api/services: %s", resp.Status)
	}
	return nil
}

// Stop ends Jaeger (SIGTERM, then SIGKILL after 2 s) and returns once it has
// exited. A nil Proc is a no-op.
func (p *Proc) Stop() {
	if p == nil {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(2 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.exited
	}
	os.RemoveAll(p.dir)
}

// Client is a query client of the Jaeger at UI.
func (p *Proc) Client() *Client { return &Client{Base: p.UI} }

// FindBin returns the Jaeger binary: $SOCKFLEET_JAEGER, or .tools/bin/jaeger in this
// or a parent directory. Its error says how to build it.
func FindBin() (string, error) {
	return localengine.Find(BinEnv, binRel, "", "the local trace backend (Jaeger) is not built: run `make local-tools` in the repository root "+
		"(make test and make run do this), or set "+BinEnv)
}

func loopback(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
