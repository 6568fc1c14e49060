// Package dynoxide finds and starts dynoxide, the local DynamoDB engine (with
// Streams) that `make tools` installs under .tools/. Tests and `make run` use it.
package dynoxide

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

// BinaryEnv overrides where the engine binary is looked for.
const BinaryEnv = "SOCKFLEET_DYNOXIDE"

// binRel is where `make tools` installs the engine, relative to the repo root.
const binRel = ".tools/node_modules/@dynoxide/linux-x64/dynoxide"

// Proc is a running engine.
type Proc struct {
	cmd      *exec.Cmd
	exited   chan struct{}
	Endpoint string // http://127.0.0.1:PORT
}

// Options for Start.
type Options struct {
	Port   int    // 0: pick a free port
	DBPath string // "": in memory
	Log    *os.File
}

// Start runs the engine and waits until it accepts connections. The engine is killed
// if this process dies (Linux parent-death signal), so a crashed test leaves nothing.
func Start(o Options) (*Proc, error) {
	bin, err := FindBinary()
	if err != nil {
		return nil, err
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port := o.Port
		if port == 0 {
			if port, err = freePort(); err != nil {
				return nil, err
			}
		}
		args := []string{"serve", "--host", "127.0.0.1", "--port", fmt.Sprint(port)}
		if o.DBPath != "" {
			args = append(args, "--db-path", o.DBPath)
		}
		cmd := exec.Command(bin, args...)
		// Its own process group: a Ctrl-C in the terminal must not stop the engine
		// before the workers have drained into it.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		if o.Log != nil {
			cmd.Stdout, cmd.Stderr = o.Log, o.Log
		}
		if err := cmd.Start(); err != nil {
			return nil, fmt.Errorf("start dynoxide %s: %w", bin, err)
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		p := &Proc{cmd: cmd, Endpoint: "http://" + addr, exited: make(chan struct{})}
		var werr error
		go func() { werr = cmd.Wait(); close(p.exited) }()
		if err := waitListening(addr, 10*time.Second, p.exited, &werr); err != nil {
			_ = cmd.Process.Kill()
			lastErr = err
			if o.Port != 0 {
				break
			}
			continue
		}
		return p, nil
	}
	return nil, fmt.Errorf("dynoxide did not start: %w", lastErr)
}

// Stop ends the engine (SIGTERM, then SIGKILL after a second).
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

// FindBinary returns the engine binary: $SOCKFLEET_DYNOXIDE, or .tools/… in this or
// a parent directory. Its error says how to install it.
func FindBinary() (string, error) {
	if p := os.Getenv(BinaryEnv); p != "" {
		return p, nil
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		p := filepath.Join(dir, binRel)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("the local DynamoDB engine (dynoxide) is not installed: run `make tools` in the repository root (make test and make run do this), or set " + BinaryEnv)
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

func waitListening(addr string, d time.Duration, exited <-chan struct{}, werr *error) error {
	deadline := time.Now().Add(d)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("dynoxide exited before listening on %s: %v", addr, *werr)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("dynoxide not listening on %s after %s: %w", addr, d, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
