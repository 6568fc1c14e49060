package fleet_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sockfleet/sockfleet/shared/local/fleet"
	"github.com/sockfleet/sockfleet/shared/schema"
)

// exitingWorker writes a script that records its environment to $ENV_OUT and exits,
// standing in for a worker that dies at once.
func exitingWorker(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "worker.sh")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\nenv > \"$ENV_OUT\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// runSupervisor starts one worker per slot with restarts on, lets it go through n
// starts per slot in total, stops, and returns every worker id it saw exit.
func runSupervisor(t *testing.T, slots, n int) []string {
	t.Helper()
	bin, dir := exitingWorker(t), t.TempDir()
	var mu sync.Mutex
	var ids []string
	enough := make(chan struct{})
	sup := &fleet.Supervisor{
		Bin: bin, Restart: true, RestartDelay: time.Millisecond,
		Env: func(_ int, id string, _ int) []string { return []string{"ENV_OUT=" + filepath.Join(dir, id)} },
		OnExit: func(_ int, id string, _ error) {
			mu.Lock()
			defer mu.Unlock()
			ids = append(ids, id)
			if len(ids) == slots*n {
				close(enough)
			}
		},
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for slot := range slots {
		if _, err := sup.Start(ctx, slot, 0); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-enough:
	case <-time.After(30 * time.Second):
		t.Fatal("workers did not exit and restart in 30s")
	}
	sup.Stop(5 * time.Second)
	mu.Lock()
	defer mu.Unlock()
	return slices.Clone(ids)
}

// TestWorkerIDsNeverRepeat restarts each slot's worker several times, under two
// supervisors one after the other (two runs of the local fleet): no id comes back.
func TestWorkerIDsNeverRepeat(t *testing.T) {
	first := runSupervisor(t, 2, 5)
	second := runSupervisor(t, 2, 5)
	seen := map[string]bool{}
	for _, id := range append(first, second...) {
		if seen[id] {
			t.Errorf("worker id %s repeats (first run %v, second %v)", id, first, second)
		}
		seen[id] = true
		if err := schema.ValidateID(id); err != nil {
			t.Errorf("worker id %s: %v", id, err)
		}
	}
	if len(seen) < 20 {
		t.Errorf("saw %d distinct ids, want at least 20", len(seen))
	}
}

// TestSupervisorPassesNoInheritedWorkerSettings: a SOCKFLEET_* variable in the
// supervisor's own environment does not reach a worker; Env's settings do, and other
// variables (PATH) still pass through.
func TestSupervisorPassesNoInheritedWorkerSettings(t *testing.T) {
	t.Setenv(schema.EnvSeqPath, "inherited.seq")
	t.Setenv("SOCKFLEET_TEST_STRAY", "1")
	out := filepath.Join(t.TempDir(), "env")
	done := make(chan struct{})
	sup := &fleet.Supervisor{
		Bin: exitingWorker(t),
		Env: func(int, string, int) []string {
			return []string{"ENV_OUT=" + out, schema.EnvResume + "=none"}
		},
		OnExit: func(int, string, error) { close(done) },
	}
	if _, err := sup.Start(context.Background(), 0, 0); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the worker did not exit")
	}
	sup.Stop(time.Second)
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	env := strings.Split(string(b), "\n")
	if slices.Contains(env, schema.EnvSeqPath+"=inherited.seq") || slices.Contains(env, "SOCKFLEET_TEST_STRAY=1") {
		t.Errorf("an inherited SOCKFLEET_ variable reached the worker:\n%s", b)
	}
	if !slices.Contains(env, schema.EnvResume+"=none") {
		t.Errorf("the setting passed in Env is missing:\n%s", b)
	}
	if !slices.Contains(env, "PATH="+os.Getenv("PATH")) {
		t.Errorf("PATH did not pass through:\n%s", b)
	}
}

// TestExitCode: the exit code the local fleet's worker-exited events carry is the
// one ECS reports: the process's status, or 128+signal when a signal killed it.
func TestExitCode(t *testing.T) {
	for _, tc := range []struct {
		script string
		want   int
	}{{"exit 0", 0}, {"exit 3", 3}, {"kill -9 $$", 137}, {"kill -15 $$", 143}} {
		err := exec.Command("/bin/sh", "-c", tc.script).Run()
		if got := fleet.ExitCode(err); got != tc.want {
			t.Errorf("%q: exit code %d, want %d (%v)", tc.script, got, tc.want, err)
		}
	}
}
