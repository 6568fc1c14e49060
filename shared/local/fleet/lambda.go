package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Invoker invokes the reconciler with a raw event and returns its raw result.
type Invoker interface {
	Invoke(ctx context.Context, event []byte) ([]byte, error)
}

// Emulator runs the real reconciler binary (the Lambda `bootstrap`) under the
// open-source Lambda Runtime Interface Emulator, and invokes it over HTTP as the
// Lambda service would. Besides the invocation address, the emulator serves the
// runtime API to the function; both are ports of this emulator's own (the runtime API
// one is picked free at start unless given), so fleets on one machine run side by side.
type Emulator struct {
	mu         sync.Mutex // the emulator runs one invocation at a time, as one Lambda instance does
	cmd        *exec.Cmd
	addr       string
	runtimeAPI string
	client     *http.Client
	done       chan struct{}
}

// EmulatorConfig says how to start the emulator.
type EmulatorConfig struct {
	RIE       string // the emulator binary
	Bootstrap string // the function
	// Addr is where it accepts invocations (host:port); a port of 0 picks a free one.
	Addr string
	// RuntimeAPIAddr is where it serves the runtime API to the function; empty picks
	// a free port on 127.0.0.1. (The emulator's own default, 127.0.0.1:9001, would
	// let only one emulator run on a machine.)
	RuntimeAPIAddr string
	Env            []string // added to this process's environment
	Log            io.Writer
}

// startAttempts bounds the retries when a free port picked for the emulator was
// taken by someone else before the emulator bound it.
const startAttempts = 3

// StartEmulator starts the emulator and waits until it accepts invocations.
func StartEmulator(c EmulatorConfig) (*Emulator, error) {
	var err error
	for range startAttempts {
		var e *Emulator
		if e, err = startEmulator(c); err == nil || !errors.Is(err, errExitedAtStart) {
			return e, err
		}
		if !pickedFree(c.Addr) && c.RuntimeAPIAddr != "" {
			return nil, err // fixed ports: another try would meet the same conflict
		}
	}
	return nil, err
}

var errExitedAtStart = errors.New("the Lambda runtime emulator exited at start")

func pickedFree(addr string) bool {
	_, p, err := net.SplitHostPort(addr)
	return err == nil && p == "0"
}

func startEmulator(c EmulatorConfig) (*Emulator, error) {
	addr, err := resolvePort(c.Addr)
	if err != nil {
		return nil, err
	}
	runtimeAPI := c.RuntimeAPIAddr
	if runtimeAPI == "" {
		runtimeAPI = "127.0.0.1:0"
	}
	if runtimeAPI, err = resolvePort(runtimeAPI); err != nil {
		return nil, err
	}
	cmd := exec.Command(c.RIE, "--runtime-interface-emulator-address", addr, "--runtime-api-address", runtimeAPI, c.Bootstrap)
	cmd.Env = append(os.Environ(), c.Env...)
	cmd.Env = append(cmd.Env, "AWS_LAMBDA_FUNCTION_TIMEOUT=30", "AWS_LAMBDA_FUNCTION_NAME=sockfleet-reconciler")
	cmd.Stdout, cmd.Stderr = c.Log, c.Log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the Lambda runtime emulator: %w", err)
	}
	e := &Emulator{cmd: cmd, addr: addr, runtimeAPI: runtimeAPI, client: &http.Client{Timeout: 60 * time.Second}, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(e.done) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		// Both listeners: the runtime API one is bound in the background, and a
		// conflict there ends the emulator.
		err := dialBoth(addr, runtimeAPI)
		if err == nil {
			select {
			case <-e.done:
				return nil, fmt.Errorf("%w (is %s or %s in use?)", errExitedAtStart, addr, runtimeAPI)
			case <-time.After(50 * time.Millisecond):
				return e, nil
			}
		}
		select {
		case <-e.done:
			return nil, fmt.Errorf("%w (is %s or %s in use?)", errExitedAtStart, addr, runtimeAPI)
		default:
		}
		if time.Now().After(deadline) {
			e.Stop()
			return nil, fmt.Errorf("the Lambda runtime emulator is not listening on %s and %s: %w", addr, runtimeAPI, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func dialBoth(addrs ...string) error {
	for _, a := range addrs {
		c, err := net.DialTimeout("tcp", a, 100*time.Millisecond)
		if err != nil {
			return err
		}
		c.Close()
	}
	return nil
}

// resolvePort replaces a port of 0 in addr by a free port.
func resolvePort(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("emulator address %q: %w", addr, err)
	}
	if port != "0" {
		return addr, nil
	}
	p, err := freePort()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(host, strconv.Itoa(p)), nil
}

// Addr is where the emulator accepts invocations; RuntimeAPIAddr is where it serves
// the function's runtime API.
func (e *Emulator) Addr() string           { return e.addr }
func (e *Emulator) RuntimeAPIAddr() string { return e.runtimeAPI }

// Pid is the emulator's process id; the function runs as its child.
func (e *Emulator) Pid() int { return e.cmd.Process.Pid }

// Invoke sends one event and returns the function's result. A function error (the
// Lambda error envelope) is returned as an error.
func (e *Emulator) Invoke(ctx context.Context, event []byte) ([]byte, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost,
		"http://"+e.addr+"/2015-03-31/functions/function/invocations", bytes.NewReader(event))
	if err != nil {
		return nil, err
	}
	resp, err := e.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("invoke reconciler: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("invoke reconciler: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("invoke reconciler: status %d: %.300s", resp.StatusCode, body)
	}
	var fnErr struct {
		Message string `json:"errorMessage"`
		Type    string `json:"errorType"`
	}
	if json.Unmarshal(body, &fnErr) == nil && fnErr.Message != "" {
		return nil, fmt.Errorf("reconciler failed: %s: %s", fnErr.Type, fnErr.Message)
	}
	return body, nil
}

// Stop ends the emulator and the function process it started.
func (e *Emulator) Stop() {
	_ = syscall.Kill(-e.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-e.done:
	case <-time.After(2 * time.Second):
		_ = syscall.Kill(-e.cmd.Process.Pid, syscall.SIGKILL)
		<-e.done
	}
}
