// Package enginetest shares one local engine process among all the tests of a test
// binary: shared/local/ddbtest (dynoxide) and shared/local/kinesalite/kinesistest
// (kinesalite) are built on it.
//
// The engine starts on first use, once per process, whether that start succeeds or
// fails; Main stops it when the tests end.
package enginetest

import (
	"net"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/sockfleet/sockfleet/shared/local/localengine"
)

// Engine is one engine for the whole test binary.
type Engine struct {
	start func() (*localengine.Proc, error)
	once  sync.Once
	proc  *localengine.Proc
	err   error
}

// New returns an Engine that start runs on first use.
func New(start func() (*localengine.Proc, error)) *Engine {
	return &Engine{start: start}
}

// Endpoint starts the engine once per process and returns its URL.
func (e *Engine) Endpoint() (string, error) {
	e.once.Do(func() { e.proc, e.err = e.start() })
	if e.err != nil {
		return "", e.err
	}
	return e.proc.Endpoint, nil
}

// Stop ends the engine, if it was started.
func (e *Engine) Stop() { e.proc.Stop() }

// Main runs the tests, stops the engine and exits with the tests' code.
func (e *Engine) Main(m *testing.M) {
	code := m.Run()
	e.Stop()
	os.Exit(code)
}

// Sanitize turns a test name into at most max characters of [A-Za-z0-9_.-], for a
// table or stream name.
func Sanitize(name string, max int) string {
	var b strings.Builder
	for _, r := range name {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-' || r == '.' {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	s := b.String()
	if len(s) > max {
		s = s[:max]
	}
	return s
}

// CheckMissing checks that outside the repository, with env unset, both find and
// start fail with an error naming `make tools` (find's also names env).
func CheckMissing(t *testing.T, env string, find, start func() error) {
	t.Helper()
	t.Chdir(t.TempDir())
	t.Setenv(env, "")
	if err := find(); err == nil || !strings.Contains(err.Error(), "make tools") || !strings.Contains(err.Error(), env) {
		t.Fatalf("find outside the repository: %v; want an error naming make tools and %s", err, env)
	}
	if err := start(); err == nil || !strings.Contains(err.Error(), "make tools") {
		t.Fatalf("start outside the repository: %v", err)
	}
}

// CheckStartStop checks that an engine start serves on loopback and that Stop
// returns once it has exited, so its port is closed.
func CheckStartStop(t *testing.T, start func() (*localengine.Proc, error)) {
	t.Helper()
	p, err := start()
	if err != nil {
		t.Fatal(err)
	}
	addr, ok := strings.CutPrefix(p.Endpoint, "http://")
	if !ok || !strings.HasPrefix(addr, "127.0.0.1:") {
		t.Errorf("endpoint %s, want loopback", p.Endpoint)
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("not listening after start: %v", err)
	}
	c.Close()
	p.Stop()
	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Fatal("still listening after Stop")
	}
}
