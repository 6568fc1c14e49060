// Package fleet runs sockfleet's processes on one machine, playing the parts ECS and
// Lambda play in AWS: a supervisor for worker processes that reports each exit as an
// ECS Task State Change event, and the Lambda runtime emulator that runs the real
// reconciler binary. `make run`, the end-to-end tests and the benchmarks use it.
// EnforceIAM plays IAM: each process runs as its role in the synthesized stack, and
// is refused what that role may not do.
//
// Given the synthesized template (Config.Network), it also plays the VPC's security
// groups: the calls its processes make to the workers (the reconciler's wakeups, the
// workers' handoffs) pass only if the template admits them (package netguard).
package fleet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Supervisor runs worker processes, each a separate OS process on its own port.
//
// Worker ids never repeat, across restarts of a slot and across supervisors (a new
// `make run` included), as ECS task ids do not: each is w<slot>-<run>-<n>, where run
// is the supervisor's start time in base 36 with random digits after it, and n counts
// the slot's starts. Logs and sinks are named by worker id, so none is ever reused.
type Supervisor struct {
	Bin string // the worker binary
	// Env returns slot i's environment for a worker with this id and listen port. A
	// worker gets this process's environment without its SOCKFLEET_* variables, plus
	// Env: a worker setting takes effect only when passed on purpose.
	Env func(slot int, id string, port int) []string
	// OnExit is called after a worker process exits (any cause), like ECS's
	// Task State Change (STOPPED) event.
	OnExit func(slot int, id string, err error)
	// Started, if set, is called with each worker process right after it started
	// (before Start returns), and Exited right after it exited (before OnExit).
	Started, Exited func(p *Proc)
	// Restart starts a new worker (a new task id) in a slot whose worker exited.
	Restart      bool
	RestartDelay time.Duration
	LogDir       string // each worker's output goes to LogDir/<id>.log; "" discards it
	Log          *slog.Logger

	mu      sync.Mutex
	run     string // this supervisor's part of every worker id
	procs   map[int]*Proc
	gen     map[int]int
	stopped bool // set by Stop: nothing starts after it
	wg      sync.WaitGroup
}

// errStopped is Start's answer once Stop has begun.
var errStopped = errors.New("supervisor stopped")

// Proc is one running worker.
type Proc struct {
	Slot int
	ID   string
	Port int
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Pid is the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Start launches a worker in slot, with the port given.
func (s *Supervisor) Start(ctx context.Context, slot, port int) (*Proc, error) {
	// Held until the process is registered, so Stop either sees it or prevents it.
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil, errStopped
	}
	if s.procs == nil {
		s.procs, s.gen, s.run = map[int]*Proc{}, map[int]int{}, runID(time.Now())
	}
	s.gen[slot]++
	id := fmt.Sprintf("w%d-%s-%d", slot, s.run, s.gen[slot])

	cmd := exec.Command(s.Bin)
	cmd.Env = append(withoutSockfleetVars(os.Environ()), s.Env(slot, id, port)...)
	// Its own process group: a Ctrl-C in the terminal reaches the supervisor only,
	// which then drains workers in order instead of all at once.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	var out io.WriteCloser
	if s.LogDir != "" {
		f, err := os.Create(filepath.Join(s.LogDir, id+".log"))
		if err != nil {
			return nil, err
		}
		out = f
		cmd.Stdout, cmd.Stderr = f, f
	}
	if err := cmd.Start(); err != nil {
		if out != nil {
			out.Close()
		}
		return nil, fmt.Errorf("start worker %s: %w", id, err)
	}
	p := &Proc{Slot: slot, ID: id, Port: port, cmd: cmd, done: make(chan struct{})}
	s.procs[slot] = p
	if s.Started != nil {
		s.Started(p)
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		p.err = cmd.Wait()
		if out != nil {
			out.Close()
		}
		close(p.done)
		s.logger().Info("worker exited", "id", id, "err", p.err)
		if s.Exited != nil {
			s.Exited(p)
		}
		if s.OnExit != nil {
			s.OnExit(slot, id, p.err)
		}
		s.mu.Lock()
		restart := s.Restart
		s.mu.Unlock()
		if restart && ctx.Err() == nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(s.RestartDelay):
			}
			if _, err := s.Start(ctx, slot, port); err != nil && !errors.Is(err, errStopped) {
				s.logger().Error("restart worker", "slot", slot, "err", err)
			}
		}
	}()
	return p, nil
}

// Get returns the worker currently in slot.
func (s *Supervisor) Get(slot int) *Proc {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.procs[slot]
}

// Signal sends sig to slot's worker.
func (s *Supervisor) Signal(slot int, sig syscall.Signal) error {
	p := s.Get(slot)
	if p == nil {
		return fmt.Errorf("no worker in slot %d", slot)
	}
	return p.cmd.Process.Signal(sig)
}

// Stop sends SIGTERM to every worker (they drain and release), waits up to grace,
// then kills what is left, and waits for all of it.
func (s *Supervisor) Stop(grace time.Duration) {
	s.mu.Lock()
	s.Restart, s.stopped = false, true
	procs := make([]*Proc, 0, len(s.procs))
	for _, p := range s.procs {
		procs = append(procs, p)
	}
	s.mu.Unlock()
	for _, p := range procs {
		_ = p.cmd.Process.Signal(syscall.SIGCONT) // a paused worker cannot drain
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	deadline := time.After(grace)
	for _, p := range procs {
		select {
		case <-p.done:
		case <-deadline:
			_ = p.cmd.Process.Kill()
		}
	}
	s.wg.Wait()
}

// runID names one supervisor's run: its start time in milliseconds, base 36 (so ids
// sort by run), then 16 random bits against two runs starting in the same millisecond.
func runID(now time.Time) string {
	var b [2]byte
	_, _ = rand.Read(b[:])
	return strconv.FormatInt(now.UnixMilli(), 36) + hex.EncodeToString(b[:])
}

// withoutSockfleetVars drops SOCKFLEET_* entries from env.
func withoutSockfleetVars(env []string) []string {
	return slices.DeleteFunc(slices.Clone(env), func(kv string) bool { return strings.HasPrefix(kv, "SOCKFLEET_") })
}

// SockfleetVars lists the names of the SOCKFLEET_* entries in env: the settings a
// worker would once have inherited, which callers may want to warn about.
func SockfleetVars(env []string) []string {
	var names []string
	for _, kv := range env {
		if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, "SOCKFLEET_") {
			names = append(names, name)
		}
	}
	return names
}

func (s *Supervisor) logger() *slog.Logger {
	if s.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Log
}
