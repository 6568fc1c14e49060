package fleet_test

import (
	"context"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/sockfleet/sockfleet/shared/local/fleet"
	"github.com/sockfleet/sockfleet/shared/schema"
)

// TestEmulatorsRunSideBySide starts two runtime emulators at once, each with the
// reconciler, as two fleets on one machine do: each has its own invocation and
// runtime API ports, and both answer invocations at the same time. (The emulator's
// default runtime API address, 127.0.0.1:9001, would let only one of them run.)
func TestEmulatorsRunSideBySide(t *testing.T) {
	b := binaries(t)
	env := append(fleet.AWSEnv("http://127.0.0.1:1"), // no engine: the event below needs none
		schema.EnvWakeupSecret+"=side-by-side-secret-0123",
		schema.EnvClusterARN+"="+fleet.ClusterARN("mine"))
	var ems []*fleet.Emulator
	for range 2 {
		e, err := fleet.StartEmulator(fleet.EmulatorConfig{RIE: b.RIE, Bootstrap: b.Bootstrap, Addr: "127.0.0.1:0", Env: env, Log: io.Discard})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(e.Stop)
		ems = append(ems, e)
	}
	if ems[0].RuntimeAPIAddr() == ems[1].RuntimeAPIAddr() || ems[0].Addr() == ems[1].Addr() {
		t.Fatalf("the emulators share an address: %s/%s and %s/%s",
			ems[0].Addr(), ems[0].RuntimeAPIAddr(), ems[1].Addr(), ems[1].RuntimeAPIAddr())
	}
	// Another cluster's task: the reconciler ignores it, so it needs no table.
	ev := fleet.TaskStoppedEvent("other", "t1", "Essential container in task exited", time.Now())
	var wg sync.WaitGroup
	for i, e := range ems {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if _, err := e.Invoke(ctx, ev); err != nil {
				t.Errorf("emulator %d (%s, runtime API %s): %v", i, e.Addr(), e.RuntimeAPIAddr(), err)
			}
		})
	}
	wg.Wait()
}
