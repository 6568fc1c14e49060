// Package localengine runs a local engine process (dynoxide, kinesalite) on a
// loopback port: it finds what `make local-tools` installed under .tools/local, starts the
// engine, waits until its port accepts connections, and stops it. shared/local/dynoxide
// and shared/local/kinesalite say which engine and how to run it.
//
// Guarantees: Start returns only once the port accepts TCP connections; a process
// that did not get there is killed and reaped before Start tries again or fails. The
// engine runs in its own process group, so a Ctrl-C in the terminal does not reach
// it, and it is killed if this process dies (Linux parent-death signal), so a
// crashed test leaves nothing. Not guaranteed: that the engine answers
// its protocol; readiness is a TCP connect.
package localengine

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// attempts is how often Start tries on a fresh free port: a free port can be taken
// between picking it and the engine binding it.
const attempts = 5

// Spec says how to run one engine.
type Spec struct {
	Name  string        // in errors, e.g. "dynoxide"
	Port  int           // 0: a free port, tried afresh up to 5 times
	Ready time.Duration // how long the port may take to accept connections
	Log   *os.File      // the engine's stdout and stderr; nil: discarded
	// Command returns the engine's command serving on 127.0.0.1:port. Start sets its
	// process attributes and output.
	Command func(port int) *exec.Cmd
}

// Proc is a running engine.
type Proc struct {
	cmd      *exec.Cmd
	exited   chan struct{}
	Endpoint string // http://127.0.0.1:PORT
}

// Start runs the engine and waits until it accepts connections.
func Start(s Spec) (*Proc, error) {
	var lastErr error
	for range attempts {
		port := s.Port
		if port == 0 {
			var err error
			if port, err = freePort(); err != nil {
				return nil, err
			}
		}
		cmd := s.Command(port)
		// Its own process group: a Ctrl-C in the terminal must not stop the engine
		// before the workers have drained into it.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		if s.Log != nil {
			cmd.Stdout, cmd.Stderr = s.Log, s.Log
		}
		if err := cmd.Start(); err != nil {
			return nil, fmt.Errorf("start %s: %w", s.Name, err)
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		p := &Proc{cmd: cmd, Endpoint: "http://" + addr, exited: make(chan struct{})}
		var werr error
		go func() { werr = cmd.Wait(); close(p.exited) }()
		if err := waitListening(s.Name, addr, s.Ready, p.exited, &werr); err != nil {
			_ = cmd.Process.Kill()
			<-p.exited
			lastErr = err
			if s.Port != 0 {
				break
			}
			continue
		}
		return p, nil
	}
	return nil, fmt.Errorf("%s did not start: %w", s.Name, lastErr)
}

// Stop ends the engine (SIGTERM, then SIGKILL after a second) and returns once it
// has exited. A nil Proc is a no-op.
func (p *Proc) Stop() {
	if p == nil || p.cmd.Process == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// Find returns $env if it is set, or else the first dir/rel that exists with marker
// in it (marker "": rel itself), dir being the working directory or one of its
// parents. If there is none, the error is missing, which should say how to install
// the engine.
func Find(env, rel, marker, missing string) (string, error) {
	if p := os.Getenv(env); p != "" {
		return p, nil
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		p := filepath.Join(dir, rel)
		if _, err := os.Stat(filepath.Join(p, marker)); err == nil {
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New(missing)
		}
		dir = parent
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

func waitListening(name, addr string, d time.Duration, exited <-chan struct{}, werr *error) error {
	deadline := time.Now().Add(d)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("%s exited before listening on %s: %v", name, addr, *werr)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not listening on %s after %s: %w", name, addr, d, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
