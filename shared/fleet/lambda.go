package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
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
// Lambda service would. The emulator serves its runtime API on 127.0.0.1:9001, a port
// it does not let you change, so one machine runs one emulator at a time.
type Emulator struct {
	mu     sync.Mutex // the emulator runs one invocation at a time, as one Lambda instance does
	cmd    *exec.Cmd
	addr   string
	client *http.Client
	done   chan struct{}
}

// StartEmulator starts rie (the emulator binary) with bootstrap as the function,
// listening on addr (host:port), with env added to this process's environment.
func StartEmulator(rie, bootstrap, addr string, env []string, log io.Writer) (*Emulator, error) {
	cmd := exec.Command(rie, "--runtime-interface-emulator-address", addr, bootstrap)
	cmd.Env = append(os.Environ(), env...)
	cmd.Env = append(cmd.Env, "AWS_LAMBDA_FUNCTION_TIMEOUT=30", "AWS_LAMBDA_FUNCTION_NAME=sockfleet-reconciler")
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the Lambda runtime emulator: %w", err)
	}
	e := &Emulator{cmd: cmd, addr: addr, client: &http.Client{Timeout: 60 * time.Second}, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(e.done) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
			return e, nil
		}
		select {
		case <-e.done:
			return nil, fmt.Errorf("the Lambda runtime emulator exited at start (is port 9001 or %s in use?)", addr)
		default:
		}
		if time.Now().After(deadline) {
			e.Stop()
			return nil, fmt.Errorf("the Lambda runtime emulator is not listening on %s: %w", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

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
