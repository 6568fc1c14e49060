package localengine

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The engines in these tests are this test binary, re-run as a small server (a real
// process on a real loopback port) in the role named by roleEnv.
const (
	roleEnv = "SOCKFLEET_LOCALENGINE_ROLE"
	portEnv = "SOCKFLEET_LOCALENGINE_PORT"
)

func TestMain(m *testing.M) {
	if role := os.Getenv(roleEnv); role != "" {
		os.Exit(serve(role, os.Getenv(portEnv)))
	}
	os.Exit(m.Run())
}

// serve plays one engine: "listen" serves until signalled, "stubborn" does too but
// ignores SIGTERM, "exit" fails at once, "silent" runs without ever listening.
func serve(role, port string) int {
	switch role {
	case "exit":
		return 3
	case "silent":
		select {}
	case "stubborn":
		signal.Ignore(syscall.SIGTERM)
	}
	l, err := net.Listen("tcp", "127.0.0.1:"+port)
	if err != nil {
		return 4
	}
	for {
		c, err := l.Accept()
		if err != nil {
			return 5
		}
		c.Close()
	}
}

// engine returns a Spec.Command running roles[i] at its i-th call (the last role
// from then on), and records the commands it made.
func engine(cmds *[]*exec.Cmd, roles ...string) func(port int) *exec.Cmd {
	return func(port int) *exec.Cmd {
		role := roles[min(len(*cmds), len(roles)-1)]
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), roleEnv+"="+role, fmt.Sprintf("%s=%d", portEnv, port))
		*cmds = append(*cmds, cmd)
		return cmd
	}
}

// killedBy reports whether cmd has exited (and was reaped) on signal sig.
func killedBy(cmd *exec.Cmd, sig syscall.Signal) bool {
	if cmd.ProcessState == nil {
		return false
	}
	ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
	return ws.Signaled() && ws.Signal() == sig
}

func fixedPort(t *testing.T) int {
	t.Helper()
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// Start returns once the port accepts connections; Stop ends the engine with
// SIGTERM and returns once it has exited, after which the port is closed.
func TestStartStop(t *testing.T) {
	var cmds []*exec.Cmd
	p, err := Start(Spec{Name: "fake", Ready: 30 * time.Second, Command: engine(&cmds, "listen")})
	if err != nil {
		t.Fatal(err)
	}
	addr, ok := strings.CutPrefix(p.Endpoint, "http://127.0.0.1:")
	if !ok {
		t.Fatalf("endpoint %s, want loopback", p.Endpoint)
	}
	addr = "127.0.0.1:" + addr
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("engine not listening after Start: %v", err)
	}
	c.Close()
	p.Stop()
	select {
	case <-p.exited:
	default:
		t.Fatal("still running after Stop")
	}
	if !killedBy(cmds[0], syscall.SIGTERM) {
		t.Errorf("engine ended with %v, want SIGTERM", cmds[0].ProcessState)
	}
	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Errorf("%s still accepts connections after Stop", addr)
	}
}

// An engine that ignores SIGTERM is killed.
func TestStopKillsStubbornEngine(t *testing.T) {
	var cmds []*exec.Cmd
	p, err := Start(Spec{Name: "fake", Ready: 30 * time.Second, Command: engine(&cmds, "stubborn")})
	if err != nil {
		t.Fatal(err)
	}
	p.Stop()
	if !killedBy(cmds[0], syscall.SIGKILL) {
		t.Errorf("engine ended with %v, want SIGKILL", cmds[0].ProcessState)
	}
}

// On a free port, an engine that fails is retried on a fresh port, up to 5 times;
// on a fixed port it is tried once. Each failed process is reaped, and the error
// names the engine and why.
func TestStartRetries(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fixed bool
		roles []string
		calls int
		err   string // "": Start succeeds
	}{
		{"free port, fails every time", false, []string{"exit"}, attempts, "fake did not start: fake exited before listening"},
		{"free port, second try listens", false, []string{"exit", "listen"}, 2, ""},
		{"fixed port, one try", true, []string{"exit", "listen"}, 1, "fake did not start: fake exited before listening"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var cmds []*exec.Cmd
			s := Spec{Name: "fake", Ready: 30 * time.Second, Command: engine(&cmds, tc.roles...)}
			if tc.fixed {
				s.Port = fixedPort(t)
			}
			p, err := Start(s)
			if tc.err == "" {
				if err != nil {
					t.Fatal(err)
				}
				p.Stop()
			} else if err == nil || !strings.Contains(err.Error(), tc.err) {
				p.Stop()
				t.Fatalf("Start: %v, want %q", err, tc.err)
			}
			if len(cmds) != tc.calls {
				t.Errorf("%d tries, want %d", len(cmds), tc.calls)
			}
			for i, cmd := range cmds {
				if cmd.ProcessState == nil {
					t.Errorf("try %d not reaped", i)
				}
			}
		})
	}
}

// An engine that never listens is killed and reaped when Ready runs out.
func TestStartGivesUpOnSilentEngine(t *testing.T) {
	var cmds []*exec.Cmd
	_, err := Start(Spec{Name: "fake", Port: fixedPort(t), Ready: 300 * time.Millisecond, Command: engine(&cmds, "silent")})
	if err == nil || !strings.Contains(err.Error(), "fake not listening on 127.0.0.1:") {
		t.Fatalf("Start: %v, want not listening", err)
	}
	if len(cmds) != 1 {
		t.Fatalf("%d tries, want 1", len(cmds))
	}
	if !killedBy(cmds[0], syscall.SIGKILL) {
		t.Fatalf("silent engine ended with %v, want killed and reaped", cmds[0].ProcessState)
	}
}

// A command that cannot start is reported with the engine's name.
func TestStartMissingBinary(t *testing.T) {
	_, err := Start(Spec{Name: "fake", Ready: time.Second, Command: func(int) *exec.Cmd {
		return exec.Command(filepath.Join(t.TempDir(), "no-such-engine"))
	}})
	if err == nil || !strings.HasPrefix(err.Error(), "start fake: ") || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Start: %v, want start fake: … not exist", err)
	}
}

// Stop on a nil Proc (an engine never started) does nothing.
func TestStopNil(t *testing.T) {
	var p *Proc
	p.Stop()
}

func TestFind(t *testing.T) {
	root := t.TempDir()
	for _, f := range []string{"tools/bin/engine", "tools/pkg/index.js", "tools/empty/README"} {
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	deep := filepath.Join(root, "a", "b")
	if err := os.MkdirAll(deep, 0o755); err != nil {
		t.Fatal(err)
	}
	const env = "SOCKFLEET_LOCALENGINE_FIND"
	for _, tc := range []struct {
		name, env, rel, marker string
		want                   string // "": the missing error
	}{
		{"file in a parent", "", "tools/bin/engine", "", filepath.Join(root, "tools/bin/engine")},
		{"directory with its marker", "", "tools/pkg", "index.js", filepath.Join(root, "tools/pkg")},
		{"directory without its marker", "", "tools/empty", "index.js", ""},
		{"not installed", "", "tools/bin/other", "", ""},
		{"environment wins", "/elsewhere/engine", "tools/bin/engine", "", "/elsewhere/engine"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Chdir(deep)
			t.Setenv(env, tc.env)
			got, err := Find(env, tc.rel, tc.marker, "not installed: run make tools")
			if tc.want == "" {
				if err == nil || err.Error() != "not installed: run make tools" {
					t.Fatalf("Find = %q, %v; want the missing error", got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("Find = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}
