package kinesalite

import (
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

// Started from the repository, it serves on loopback and stops.
func TestStartStop(t *testing.T) {
	p, err := Start(Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(p.Endpoint, "http://127.0.0.1:") {
		t.Errorf("endpoint %s, want loopback", p.Endpoint)
	}
	p.Stop()
	select {
	case <-p.exited:
	default:
		t.Fatal("still running after Stop")
	}
}
