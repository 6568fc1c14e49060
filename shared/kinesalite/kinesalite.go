// Package kinesalite finds and starts kinesalite, the local Kinesis Data Streams
// engine (npm, on LevelDB with a prebuilt native module) that `make tools` installs
// under .tools/. Tests and `make run` use it.
package kinesalite

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

// DirEnv overrides where the kinesalite package is looked for.
const DirEnv = "SOCKFLEET_KINESALITE"

// dirRel is where `make tools` installs the engine, relative to the repo root.
const dirRel = ".tools/node_modules/kinesalite"

// launcher binds kinesalite to loopback (its own CLI listens on every interface)
// and makes streams ACTIVE at once instead of after 500 ms.
const launcher = `
const k = require(process.env.KINESALITE_DIR);
const opts = {createStreamMs: 0, deleteStreamMs: 0, updateStreamMs: 0, shardLimit: 1000};
if (process.env.KINESALITE_PATH) opts.path = process.env.KINESALITE_PATH;
const s = k(opts).listen(Number(process.env.KINESALITE_PORT), '127.0.0.1', () => console.log('listening on', s.address()));
`

// Proc is a running engine.
type Proc struct {
	cmd      *exec.Cmd
	exited   chan struct{}
	Endpoint string // http://127.0.0.1:PORT
}

// Options for Start.
type Options struct {
	Port int    // 0: pick a free port
	Path string // LevelDB directory; "": in memory
	Log  *os.File
}

// Start runs the engine and waits until it accepts connections. The engine is killed
// if this process dies (Linux parent-death signal), so a crashed test leaves nothing.
func Start(o Options) (*Proc, error) {
	dir, err := FindDir()
	if err != nil {
		return nil, err
	}
	node, err := exec.LookPath("node")
	if err != nil {
		return nil, errors.New("kinesalite needs Node.js (node) on PATH: install Node.js ≥ 20, then run `make tools`")
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port := o.Port
		if port == 0 {
			if port, err = freePort(); err != nil {
				return nil, err
			}
		}
		cmd := exec.Command(node, "-e", launcher)
		cmd.Env = append(os.Environ(), "KINESALITE_DIR="+dir, fmt.Sprintf("KINESALITE_PORT=%d", port), "KINESALITE_PATH="+o.Path)
		// Its own process group: a Ctrl-C in the terminal must not stop the engine
		// before the workers have drained into it.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		if o.Log != nil {
			cmd.Stdout, cmd.Stderr = o.Log, o.Log
		}
		if err := cmd.Start(); err != nil {
			return nil, fmt.Errorf("start kinesalite: %w", err)
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		p := &Proc{cmd: cmd, Endpoint: "http://" + addr, exited: make(chan struct{})}
		var werr error
		go func() { werr = cmd.Wait(); close(p.exited) }()
		if err := waitListening(addr, 15*time.Second, p.exited, &werr); err != nil {
			_ = cmd.Process.Kill()
			<-p.exited
			lastErr = err
			if o.Port != 0 {
				break
			}
			continue
		}
		return p, nil
	}
	return nil, fmt.Errorf("kinesalite did not start: %w", lastErr)
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

// FindDir returns the kinesalite package directory: $SOCKFLEET_KINESALITE, or
// .tools/… in this or a parent directory. Its error says how to install it.
func FindDir() (string, error) {
	if p := os.Getenv(DirEnv); p != "" {
		return p, nil
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		p := filepath.Join(dir, dirRel)
		if _, err := os.Stat(filepath.Join(p, "index.js")); err == nil {
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("the local Kinesis engine (kinesalite) is not installed: run `make tools` in the repository root (make test and make run do this), or set " + DirEnv)
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
			return fmt.Errorf("kinesalite exited before listening on %s: %v", addr, *werr)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kinesalite not listening on %s after %s: %w", addr, d, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
