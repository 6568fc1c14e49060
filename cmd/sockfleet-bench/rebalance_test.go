package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// The reconciler's log holds the emulator's own lines too; only the function's
// "rebalance round" lines count.
func TestReadRounds(t *testing.T) {
	path := filepath.Join(t.TempDir(), "reconciler.log")
	log := `START RequestId: 1 Version: $LATEST
{"time":"x","level":"INFO","msg":"rebalance round","accepted":30,"results":{"handing_off":30},"read_units":8.5}
{"time":"x","level":"INFO","msg":"wakeup delivered","accepted":99}
{"time":"2026-12-03T13:00:05.5Z","level":"INFO","msg":"rebalance round","accepted":2,"results":{"handing_off":2,"target_unavailable":1},"read_units":1}
rebalance round (not JSON)
`
	if err := os.WriteFile(path, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	r := &RebalanceResult{Results: map[string]int{}, shrinkAt: time.Date(2026, 12, 3, 13, 0, 0, 0, time.UTC)}
	if err := r.readRounds(path); err != nil {
		t.Fatal(err)
	}
	if r.Rounds != 2 || r.Accepted != 30 || r.ShrinkAccepted != 2 || r.ReadUnits != 9.5 || r.Results["handing_off"] != 32 || r.Results["target_unavailable"] != 1 {
		t.Fatalf("%+v", r)
	}
}

func TestMinimumMoves(t *testing.T) {
	owners := map[string]string{}
	for i := range 300 {
		owners[string(rune('a'+i%3))+string(rune(i))] = []string{"a", "b", "c"}[i%3]
	}
	if got := minimumMoves([]string{"a", "b", "c", "d", "e"}, owners, 150); got != 108 {
		t.Fatalf("minimum %d, want 108", got)
	}
}
