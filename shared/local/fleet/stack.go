package fleet

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodbstreams"
	"github.com/sockfleet/sockfleet/shared/local/netguard"
	"github.com/sockfleet/sockfleet/shared/local/netrules"
	"github.com/sockfleet/sockfleet/shared/local/streampoller"
	"github.com/sockfleet/sockfleet/shared/schema"
)

// Config describes a local fleet.
type Config struct {
	Dir      string // logs, sinks and the poller's checkpoint go here
	Endpoint string // the DynamoDB endpoint (also serves Streams)
	// WorkerEndpoint is the endpoint workers use; default Endpoint. Chaos runs put a
	// FaultProxy here.
	WorkerEndpoint string
	// SlotEndpoint, if set, gives each slot's workers an endpoint of their own (a
	// FaultProxy per slot, say), over WorkerEndpoint.
	SlotEndpoint func(slot int) string
	Table        string
	Cluster      string // the local "ECS cluster" name
	Secret       string // the wakeup HMAC key

	Workers   int
	WorkerBin string
	// WorkerEnv returns extra environment for one worker (timings, mode); may be nil.
	WorkerEnv func(slot int, id string) []string
	// Ports: worker slot i listens on BasePort+i; 0 picks free ports.
	BasePort int
	Restart  bool // restart exited workers, as an ECS service would
	// RestartDelay is how long a replacement takes to start; default 1s. ECS takes
	// tens of seconds, which a benchmark may want to model.
	RestartDelay time.Duration

	// Reconciler: the real Lambda binary under the runtime emulator. With Bootstrap
	// empty there is no reconciler (polling mode).
	Bootstrap  string
	RIE        string
	LambdaAddr string // where the emulator takes invocations; default (or port 0): a free port
	// RuntimeAPIAddr is where the emulator serves the function's runtime API; default:
	// a free port. Every fleet has its own, so fleets run side by side.
	RuntimeAPIAddr string
	ReconcilerEnv  []string
	SweepEvery     time.Duration // 0: no sweep

	// Keys are the access key ids the workers and the reconciler (with the stream
	// poller) sign with: their roles, when Endpoint is an IAM proxy (EnforceIAM).
	// Empty: AdminKey, unrestricted.
	Keys Keys
	// Network, if set, is the synthesized template whose security group rules the
	// fleet enforces on the calls its processes make to each other (package
	// netguard): each worker's port is a front that refuses, and logs, a call the
	// template would not admit on the worker's port there (its container port), and
	// the worker itself listens on another port behind it. Nil: no enforcement.
	Network *netrules.Template
	// OnDeny, if set, is called with each call the network rules refused.
	OnDeny func(netguard.Denial)

	// OTLPEndpoint, if set, is the OTLP/HTTP endpoint (a local Jaeger, package
	// shared/local/jaeger) the workers and the reconciler export their spans to
	// (TracingEnv). Empty: they get no OTEL_* settings, so tracing stays off.
	OTLPEndpoint string
	// TraceEnv is extra OTEL_* settings for every process, after TracingEnv's
	// (OTEL_BSP_SCHEDULE_DELAY=100, say, for a test that reads spans back soon).
	TraceEnv []string

	Log *slog.Logger
}

// Stack is a running local fleet.
type Stack struct {
	cfg        Config
	Sup        *Supervisor
	Lambda     *Emulator
	Poller     *streampoller.Poller
	cancel     context.CancelFunc
	wg         sync.WaitGroup
	events     sync.Mutex
	Invokes    map[string]int // invocations by kind: stream, task-stopped, sweep
	guard      *netguard.Guard
	workerPort int // the worker's port in the template
	fmu        sync.Mutex
	fronts     map[int]*netguard.Front // by slot
	listen     map[int]int             // by slot: where its worker listens, behind the front
}

// AWSEnv is the standard AWS settings that point a process at endpoint, as the
// unrestricted AdminKey.
func AWSEnv(endpoint string) []string { return AWSEnvAs(endpoint, AdminKey) }

// AWSEnvAs is AWSEnv signing with access key id key (AdminKey if empty): behind an
// IAM proxy, the process runs as the role of that key.
func AWSEnvAs(endpoint, key string) []string {
	return []string{
		"AWS_ENDPOINT_URL_DYNAMODB=" + endpoint,
		"AWS_ENDPOINT_URL_DYNAMODB_STREAMS=" + endpoint,
		"AWS_REGION=" + LocalRegion,
		"AWS_ACCESS_KEY_ID=" + cmp.Or(key, AdminKey),
		"AWS_SECRET_ACCESS_KEY=local",
	}
}

// WorkerEnviron is the environment of the worker in slot with this id and port, in
// order of precedence, the later winning:
//
//  1. the fleet's defaults, which a user may change: the sink (a file per worker
//     under Dir/sinks) and SOCKFLEET_SEQ_PATH=seq (the demo upstream's {seq, ts,
//     payload});
//  2. cfg.WorkerEnv, which is where explicit worker settings go;
//  3. what the fleet itself must decide (FleetOwnedEnv): table, worker id,
//     addresses, wakeup secret and the AWS endpoint settings.
//
// SOCKFLEET_* variables of this process's own environment never reach a worker (see
// Supervisor), so a setting takes effect only when it is passed on purpose.
func (c Config) WorkerEnviron(slot int, id string, port int) []string {
	return c.workerEnviron(slot, id, port, port)
}

// workerEnviron is WorkerEnviron for a worker listening on one port and reached on
// another (through a netguard front).
func (c Config) workerEnviron(slot int, id string, listen, advertise int) []string {
	local := func(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }
	env := []string{
		schema.EnvSink + "=file:" + c.SinkPath(id),
		schema.EnvSeqPath + "=seq",
	}
	env = append(env, c.tracingEnv(WorkerService, id)...)
	if c.WorkerEnv != nil {
		env = append(env, c.WorkerEnv(slot, id)...)
	}
	endpoint := cmp.Or(c.WorkerEndpoint, c.Endpoint)
	if c.SlotEndpoint != nil {
		endpoint = c.SlotEndpoint(slot)
	}
	env = append(env, AWSEnvAs(endpoint, c.Keys.Worker)...)
	return append(env,
		schema.EnvTable+"="+c.Table,
		schema.EnvWorkerID+"="+id,
		schema.EnvListenAddr+"="+local(listen),
		schema.EnvAdvertiseAddr+"="+local(advertise),
		schema.EnvWakeupSecret+"="+c.Secret)
}

// The service.name of each process's spans (the tracing contract's).
const (
	WorkerService     = "sockfleet-worker"
	ReconcilerService = "sockfleet-reconciler"
)

// TracingEnv is the standard OpenTelemetry settings that make a process export its
// spans over OTLP/HTTP to endpoint as service, with instance (a worker's id) as its
// service.instance.id when set: what the fleet gives its processes when tracing is on.
// The sampler is left to the process's default (every ownership trace).
func TracingEnv(endpoint, service, instance string) []string {
	env := []string{
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + endpoint,
		"OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
		"OTEL_SERVICE_NAME=" + service,
	}
	if instance != "" {
		env = append(env, "OTEL_RESOURCE_ATTRIBUTES=service.instance.id="+instance)
	}
	return env
}

// tracingEnv is TracingEnv and TraceEnv with tracing on, nothing with it off.
func (c Config) tracingEnv(service, instance string) []string {
	if c.OTLPEndpoint == "" {
		return nil
	}
	return append(TracingEnv(c.OTLPEndpoint, service, instance), c.TraceEnv...)
}

// FleetOwnedEnv names the variables WorkerEnviron sets last, whatever else says:
// passing one of them as a worker setting is a mistake (CheckWorkerEnv says so).
var FleetOwnedEnv = []string{
	schema.EnvTable, schema.EnvWorkerID, schema.EnvListenAddr, schema.EnvAdvertiseAddr, schema.EnvWakeupSecret,
	"AWS_ENDPOINT_URL_DYNAMODB", "AWS_ENDPOINT_URL_DYNAMODB_STREAMS", "AWS_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
}

// CheckWorkerEnv checks explicit worker settings, NAME=VALUE each: the name must be a
// variable the worker reads (schema.WorkerEnvVars; any name not starting with
// SOCKFLEET_ passes, e.g. GODEBUG) and not one the fleet owns, and no name may repeat.
// The values are the worker's to judge (run the worker's checkconfig).
func CheckWorkerEnv(env []string) error {
	seen := map[string]bool{}
	var errs []error
	for _, kv := range env {
		name, _, ok := strings.Cut(kv, "=")
		switch {
		case !ok || name == "" || strings.ContainsAny(name, " \t\n"):
			errs = append(errs, fmt.Errorf("worker setting %q: want NAME=VALUE", kv))
		case slices.Contains(FleetOwnedEnv, name):
			errs = append(errs, fmt.Errorf("worker setting %s: set by the local fleet itself, per worker; it cannot be changed here", name))
		case strings.HasPrefix(name, "SOCKFLEET_") && !slices.Contains(schema.WorkerEnvVars, name):
			errs = append(errs, fmt.Errorf("worker setting %s: not a variable the worker reads (see shared/schema/env.go)", name))
		case seen[name]:
			errs = append(errs, fmt.Errorf("worker setting %s: given twice", name))
		}
		seen[name] = true
	}
	return errors.Join(errs...)
}

// CheckWorkerConfig runs `worker checkconfig` with a worker's environment, so a bad
// worker setting stops the fleet at start with the worker's own message, rather than
// every worker failing and being restarted over and over.
func CheckWorkerConfig(ctx context.Context, cfg Config) error {
	cmd := exec.CommandContext(ctx, cfg.WorkerBin, "checkconfig")
	cmd.Env = append(withoutSockfleetVars(os.Environ()), cfg.WorkerEnviron(0, "w0-check", schema.DefaultWakeupPort)...)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		return fmt.Errorf("worker settings: %s (%w)", strings.TrimSpace(string(out)), err)
	case err != nil:
		return fmt.Errorf("check the worker settings with %s checkconfig: %w", cfg.WorkerBin, err)
	}
	return nil
}

// SinkPath is where the worker with id writes its messages.
func (c Config) SinkPath(id string) string { return filepath.Join(c.Dir, "sinks", id+".jsonl") }

// Start brings the fleet up: the reconciler under the emulator, the stream poller
// feeding it, the workers, and the sweep.
func Start(ctx context.Context, cfg Config) (*Stack, error) {
	if cfg.WorkerEndpoint == "" {
		cfg.WorkerEndpoint = cfg.Endpoint
	}
	if cfg.LambdaAddr == "" {
		cfg.LambdaAddr = "127.0.0.1:0"
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	for _, d := range []string{cfg.Dir, filepath.Join(cfg.Dir, "logs"), filepath.Join(cfg.Dir, "sinks")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	if err := CheckWorkerConfig(ctx, cfg); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	s := &Stack{cfg: cfg, cancel: cancel, Invokes: map[string]int{}}
	fail := func(err error) (*Stack, error) { s.Stop(); return nil, err }
	if cfg.Network != nil {
		var err error
		if s.workerPort, err = cfg.Network.ListenerPort(netrules.Worker); err != nil {
			return fail(fmt.Errorf("network rules: %w", err))
		}
		if s.guard, err = netguard.New(cfg.Network, cfg.Log, cfg.OnDeny); err != nil {
			cfg.Log.Warn("network rules are not enforced on this machine", "err", err)
		} else {
			cfg.Log.Info("network rules enforced between the fleet's processes", "template", cfg.Network.Path)
		}
	}

	if cfg.Bootstrap != "" {
		lf, err := os.Create(filepath.Join(cfg.Dir, "logs", "reconciler.log"))
		if err != nil {
			return fail(err)
		}
		env := append(AWSEnvAs(cfg.Endpoint, cfg.Keys.Reconciler),
			schema.EnvTable+"="+cfg.Table,
			schema.EnvWakeupSecret+"="+cfg.Secret,
			schema.EnvClusterARN+"="+ClusterARN(cfg.Cluster))
		// The emulator hands the function every variable of its own environment
		// that Lambda does not reserve (AWS_LAMBDA_*, _HANDLER, credentials...), so
		// OTEL_* reach the reconciler as they would from the function's configuration.
		env = append(env, cfg.tracingEnv(ReconcilerService, "")...)
		s.Lambda, err = StartEmulator(EmulatorConfig{
			RIE: cfg.RIE, Bootstrap: cfg.Bootstrap, Addr: cfg.LambdaAddr, RuntimeAPIAddr: cfg.RuntimeAPIAddr,
			Env: append(env, cfg.ReconcilerEnv...), Log: lf,
		})
		if err != nil {
			return fail(err)
		}
		if s.guard != nil {
			// The function runs as the emulator's child.
			s.guard.AddTree(s.Lambda.Pid(), netrules.Reconciler, "")
		}
		// The event source mapping reads the stream with the function's role.
		streams := dynamodbstreams.New(dynamodbstreams.Options{
			Region: LocalRegion, BaseEndpoint: aws.String(cfg.Endpoint),
			Credentials: credentials.NewStaticCredentialsProvider(cmp.Or(cfg.Keys.Reconciler, AdminKey), "local", ""),
		})
		s.Poller, err = streampoller.New(streams, streampoller.Config{
			Table: cfg.Table, Checkpoint: filepath.Join(cfg.Dir, "poller.json"), Log: cfg.Log, Region: LocalRegion,
		})
		if err != nil {
			return fail(err)
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			if err := s.Poller.Run(ctx, s.handleStream); err != nil && ctx.Err() == nil {
				cfg.Log.Error("stream poller stopped", "err", err)
			}
		}()
		if cfg.SweepEvery > 0 {
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				t := time.NewTicker(cfg.SweepEvery)
				defer t.Stop()
				for {
					select {
					case <-ctx.Done():
						return
					case <-t.C:
						if _, err := s.invoke(ctx, "sweep", []byte(`{"`+schema.SweepInputKey+`":"`+schema.SweepInputValue+`"}`)); err != nil {
							cfg.Log.Error("sweep", "err", err)
						}
					}
				}
			}()
		}
	}

	s.Sup = &Supervisor{
		Bin:     cfg.WorkerBin,
		LogDir:  filepath.Join(cfg.Dir, "logs"),
		Log:     cfg.Log,
		Restart: cfg.Restart, RestartDelay: cmp.Or(cfg.RestartDelay, time.Second),
		Env: cfg.WorkerEnviron,
		OnExit: func(slot int, id string, err error) {
			if s.Lambda == nil {
				return
			}
			// What ECS does when a task's worker container exits: an EventBridge event
			// to the reconciler, sent while the task is still being torn down.
			ev := WorkerExitedEvent(cfg.Cluster, id, ExitCode(err), fmt.Sprintf("worker exited: %v", err), time.Now())
			if _, err := s.invoke(context.WithoutCancel(ctx), "task-stopped", ev); err != nil {
				cfg.Log.Error("task-stopped event", "worker", id, "err", err)
			}
		},
	}
	if s.guard != nil {
		s.Sup.Env = func(slot int, id string, port int) []string {
			return cfg.workerEnviron(slot, id, s.listenPort(slot, port), port)
		}
		s.Sup.Started = func(p *Proc) { s.guard.Add(p.Pid(), netrules.Worker, p.ID) }
		s.Sup.Exited = func(p *Proc) { s.guard.Remove(p.Pid()) }
	}
	for i := range cfg.Workers {
		port := 0
		if cfg.BasePort != 0 {
			port = cfg.BasePort + i
		}
		if _, err := s.StartWorker(ctx, i, port); err != nil {
			return fail(err)
		}
	}
	return s, nil
}

// StartWorker starts a worker in slot (a new one, or one whose worker exited for
// good), reached on port (0: a free one). With the network rules enforced, port is
// a front's and the worker listens behind it; use this rather than Sup.Start, which
// knows nothing of fronts. The fleet's context governs restarts.
func (s *Stack) StartWorker(ctx context.Context, slot, port int) (*Proc, error) {
	if s.guard == nil {
		if port == 0 {
			var err error
			if port, err = freePort(); err != nil {
				return nil, err
			}
		}
		return s.Sup.Start(ctx, slot, port)
	}
	s.fmu.Lock()
	f := s.fronts[slot]
	if f == nil {
		lp, err := freePort()
		if err != nil {
			s.fmu.Unlock()
			return nil, err
		}
		f, err = s.guard.Front(net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
			net.JoinHostPort("127.0.0.1", strconv.Itoa(lp)), s.workerPort, s.workerIn(slot))
		if err != nil {
			s.fmu.Unlock()
			return nil, err
		}
		if s.fronts == nil {
			s.fronts, s.listen = map[int]*netguard.Front{}, map[int]int{}
		}
		s.fronts[slot], s.listen[slot] = f, lp
	}
	s.fmu.Unlock()
	_, p, _ := net.SplitHostPort(f.Addr())
	port, _ = strconv.Atoi(p)
	return s.Sup.Start(ctx, slot, port)
}

// listenPort is where slot's worker listens: behind its front, or on port itself.
func (s *Stack) listenPort(slot, port int) int {
	s.fmu.Lock()
	defer s.fmu.Unlock()
	if lp, ok := s.listen[slot]; ok {
		return lp
	}
	return port
}

// workerIn names the worker in slot now, for the front before it.
func (s *Stack) workerIn(slot int) func() netguard.Party {
	return func() netguard.Party {
		p := s.Sup.Get(slot)
		if p == nil {
			return netguard.Party{Workload: netrules.Worker, Name: fmt.Sprintf("(slot %d, none yet)", slot)}
		}
		return netguard.Party{Workload: netrules.Worker, Name: p.ID, Pid: p.Pid()}
	}
}

// Enforcing reports whether the fleet enforces the template's network rules.
func (s *Stack) Enforcing() bool { return s.guard != nil }

// Denials returns the calls the network rules refused so far (the first thousand);
// nil without enforcement.
func (s *Stack) Denials() []netguard.Denial {
	if s.guard == nil {
		return nil
	}
	return s.guard.Denials()
}

// handleStream passes a batch to the reconciler exactly as Lambda would.
func (s *Stack) handleStream(ctx context.Context, ev events.DynamoDBEvent) (events.DynamoDBEventResponse, error) {
	var resp events.DynamoDBEventResponse
	raw, err := json.Marshal(ev)
	if err != nil {
		return resp, err
	}
	out, err := s.invoke(ctx, "stream", raw)
	if err != nil {
		return resp, err
	}
	if err := json.Unmarshal(out, &resp); err != nil {
		return resp, fmt.Errorf("reconciler reply %.200s: %w", out, err)
	}
	return resp, nil
}

func (s *Stack) invoke(ctx context.Context, kind string, ev []byte) ([]byte, error) {
	s.events.Lock()
	s.Invokes[kind]++
	s.events.Unlock()
	return s.Lambda.Invoke(ctx, ev)
}

// InvokeCount returns how many times the reconciler was invoked for kind.
func (s *Stack) InvokeCount(kind string) int {
	s.events.Lock()
	defer s.events.Unlock()
	return s.Invokes[kind]
}

// Sweep runs the backstop sweep once, now.
func (s *Stack) Sweep(ctx context.Context) error {
	if s.Lambda == nil {
		return errors.New("no reconciler")
	}
	_, err := s.invoke(ctx, "sweep", []byte(`{"`+schema.SweepInputKey+`":"`+schema.SweepInputValue+`"}`))
	return err
}

// Stop drains the workers (SIGTERM, then a kill after 30 s), then stops the poller,
// the sweep and the reconciler.
func (s *Stack) Stop() {
	if s.Sup != nil {
		s.Sup.Stop(30 * time.Second)
	}
	// After the workers: a drain hands connections over through the fronts.
	s.fmu.Lock()
	for _, f := range s.fronts {
		f.Close()
	}
	s.fmu.Unlock()
	s.cancel()
	s.wg.Wait()
	if s.Lambda != nil {
		s.Lambda.Stop()
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
