package kinesalite

import (
	"net"
	"strings"
	"testing"
)

// Without the engine installed, the error says how to install it.
func TestMissingEngineNamesMakeTools(t *testing.T) {
	t.Chdir(t.TempDir())
	t.Setenv(DirEnv, "")
	_, err := FindDir()
	if err == nil || !strings.Contains(err.Error(), "make tools") || !strings.Contains(err.Error(), DirEnv) {
		t.Fatalf("FindDir outside the repository: %v; want an error naming make tools and %s", err, DirEnv)
	}
	if _, err := Start(Options{}); err == nil || !strings.Contains(err.Error(), "make tools") {
		t.Fatalf("Start outside the repository: %v", err)
	}
}

// Started from the repository, it serves on loopback and stops: Stop returns once
// the engine has exited, so its port is closed.
func TestStartStop(t *testing.T) {
	p, err := Start(Options{})
	if err != nil {
		t.Fatal(err)
	}
	addr, ok := strings.CutPrefix(p.Endpoint, "http://")
	if !ok || !strings.HasPrefix(addr, "127.0.0.1:") {
		t.Errorf("endpoint %s, want loopback", p.Endpoint)
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("not listening after Start: %v", err)
	}
	c.Close()
	p.Stop()
	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Fatal("still listening after Stop")
	}
}
