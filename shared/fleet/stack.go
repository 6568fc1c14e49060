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
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodbstreams"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/streampoller"
)

// Config describes a local fleet.
type Config struct {
	Dir      string // logs, sinks and the poller's checkpoint go here
	Endpoint string // the DynamoDB endpoint (also serves Streams)
	// WorkerEndpoint is the endpoint workers use; default Endpoint. Chaos runs put a
	// FaultProxy here.
	WorkerEndpoint string
	Table          string
	Cluster        string // the local "ECS cluster" name
	Secret         string // the wakeup HMAC key

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
	Bootstrap     string
	RIE           string
	LambdaAddr    string // default 127.0.0.1:9000
	ReconcilerEnv []string
	SweepEvery    time.Duration // 0: no sweep

	Log *slog.Logger
}

// Stack is a running local fleet.
type Stack struct {
	cfg     Config
	Sup     *Supervisor
	Lambda  *Emulator
	Poller  *streampoller.Poller
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	unlock  func()
	events  sync.Mutex
	Invokes map[string]int // invocations by kind: stream, task-stopped, sweep
}

// AWSEnv is the standard AWS settings that point a process at endpoint.
func AWSEnv(endpoint string) []string {
	return []string{
		"AWS_ENDPOINT_URL_DYNAMODB=" + endpoint,
		"AWS_ENDPOINT_URL_DYNAMODB_STREAMS=" + endpoint,
		"AWS_REGION=" + LocalRegion,
		"AWS_ACCESS_KEY_ID=local",
		"AWS_SECRET_ACCESS_KEY=local",
	}
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
		cfg.LambdaAddr = "127.0.0.1:9000"
	}
	if strings.HasSuffix(cfg.LambdaAddr, ":0") {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		cfg.LambdaAddr = strings.TrimSuffix(cfg.LambdaAddr, "0") + strconv.Itoa(port)
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	for _, d := range []string{cfg.Dir, filepath.Join(cfg.Dir, "logs"), filepath.Join(cfg.Dir, "sinks")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	s := &Stack{cfg: cfg, cancel: cancel, unlock: func() {}, Invokes: map[string]int{}}
	fail := func(err error) (*Stack, error) { s.Stop(); return nil, err }

	if cfg.Bootstrap != "" {
		unlock, err := lockEmulator()
		if err != nil {
			return fail(err)
		}
		s.unlock = unlock
		lf, err := os.Create(filepath.Join(cfg.Dir, "logs", "reconciler.log"))
		if err != nil {
			return fail(err)
		}
		env := append(AWSEnv(cfg.Endpoint),
			schema.EnvTable+"="+cfg.Table,
			schema.EnvWakeupSecret+"="+cfg.Secret,
			schema.EnvClusterARN+"="+ClusterARN(cfg.Cluster))
		s.Lambda, err = StartEmulator(cfg.RIE, cfg.Bootstrap, cfg.LambdaAddr, append(env, cfg.ReconcilerEnv...), lf)
		if err != nil {
			return fail(err)
		}
		streams := dynamodbstreams.New(dynamodbstreams.Options{
			Region: LocalRegion, BaseEndpoint: aws.String(cfg.Endpoint),
			Credentials: credentials.NewStaticCredentialsProvider("local", "local", ""),
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
		Env: func(slot int, id string, port int) []string {
			addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
			env := append(AWSEnv(cfg.WorkerEndpoint),
				schema.EnvTable+"="+cfg.Table,
				schema.EnvWorkerID+"="+id,
				schema.EnvListenAddr+"="+addr,
				schema.EnvAdvertiseAddr+"="+addr,
				schema.EnvWakeupSecret+"="+cfg.Secret,
				schema.EnvSink+"=file:"+cfg.SinkPath(id),
				schema.EnvSeqPath+"=seq") // the demo upstream's {seq, ts, payload}
			if cfg.WorkerEnv != nil {
				env = append(env, cfg.WorkerEnv(slot, id)...)
			}
			return env
		},
		OnExit: func(slot int, id string, err error) {
			if s.Lambda == nil {
				return
			}
			// What ECS does when a task stops: an EventBridge event to the reconciler.
			ev := TaskStoppedEvent(cfg.Cluster, id, fmt.Sprintf("worker exited: %v", err), time.Now())
			if _, err := s.invoke(context.WithoutCancel(ctx), "task-stopped", ev); err != nil {
				cfg.Log.Error("task-stopped event", "worker", id, "err", err)
			}
		},
	}
	for i := range cfg.Workers {
		port := 0
		if cfg.BasePort != 0 {
			port = cfg.BasePort + i
		} else {
			var err error
			if port, err = freePort(); err != nil {
				return fail(err)
			}
		}
		if _, err := s.Sup.Start(ctx, i, port); err != nil {
			return fail(err)
		}
	}
	return s, nil
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
	s.cancel()
	s.wg.Wait()
	if s.Lambda != nil {
		s.Lambda.Stop()
	}
	s.unlock()
}

// lockEmulator takes a machine-wide lock: the emulator's runtime API port is fixed,
// so two fleets (say, two test binaries) must not run emulators at once.
func lockEmulator() (func(), error) {
	f, err := os.OpenFile(filepath.Join(os.TempDir(), "sockfleet-lambda-emulator.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock the Lambda emulator: %w", err)
	}
	return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
