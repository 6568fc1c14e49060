package dispatch

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sockfleet/sockfleet/functions/reconciler/records"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/shared/wakeup"
)

// fleetSim is a strict fake of workers that acquire every id offered (up to their
// capacity) and report their true load in every reply, as the worker's server does.
type fleetSim struct {
	mu       sync.Mutex
	capacity int
	held     map[string]int // addr -> connections held
	noLoad   bool           // reply without a load, as workers that predate it
}

func (f *fleetSim) Send(_ context.Context, addr string, req wakeup.Request) (wakeup.Response, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := wakeup.Response{V: wakeup.Version}
	for _, c := range req.Conns {
		r := wakeup.Acquired
		if f.held[addr] >= f.capacity {
			r = wakeup.NoCapacity
		} else {
			f.held[addr]++
		}
		out.Results = append(out.Results, wakeup.ConnResult{ID: c.ID, Result: r})
	}
	if !f.noLoad {
		n := f.held[addr]
		out.Load = &n
	}
	return out, nil
}

func idle(n, capacity int) []codec.Worker {
	ws := make([]codec.Worker, n)
	for i := range ws {
		ws[i] = worker(fmt.Sprintf("w%d", i), capacity, 0)
	}
	return ws
}

// burst delivers n needs-owner ids through d, per batch sizes taken in turn from
// sizes, always against the same registry snapshot (the registry not refreshed
// during the burst), and returns how many each worker holds.
func burst(t *testing.T, d *Delivery, f *fleetSim, ws []codec.Worker, n int, sizes []int) map[string]int {
	t.Helper()
	at := now
	for i, b := 0, 0; i < n; b++ {
		k := min(sizes[b%len(sizes)], n-i)
		ds := make([]records.Decision, k)
		for j := range ds {
			ds[j] = records.Decision{Action: records.NeedsOwner, ID: fmt.Sprintf("n%03d", i+j)}
		}
		for id, o := range d.Deliver(context.Background(), ws, at, ds) {
			if !o.Done {
				t.Fatalf("%s not delivered: %+v", id, o)
			}
		}
		i += k
		at = at.Add(100 * time.Millisecond)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]int{}
	for addr, n := range f.held {
		out[addr] = n
	}
	return out
}

func within(t *testing.T, got map[string]int, workers, want, slack int) {
	t.Helper()
	if len(got) != workers {
		t.Errorf("%d workers hold connections, want %d: %v", len(got), workers, got)
	}
	for addr, n := range got {
		if n < want-slack || n > want+slack {
			t.Errorf("%s holds %d, want %d ± %d (all: %v)", addr, n, want, slack, got)
		}
	}
}

func TestBurstAcrossCallsSpreadsWithMemory(t *testing.T) {
	cases := []struct {
		name   string
		sizes  []int
		noLoad bool
	}{
		{"one id per batch", []int{1}, false},
		{"uneven batches", []int{1, 4, 2, 7, 1, 1, 3}, false},
		{"one id per batch, replies without load", []int{1}, true},
		{"uneven batches, replies without load", []int{1, 4, 2, 7, 1, 1, 3}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := &fleetSim{capacity: 100, held: map[string]int{}, noLoad: tc.noLoad}
			d := &Delivery{Sender: f, Recent: &Recent{}}
			within(t, burst(t, d, f, idle(3, 100), 30, tc.sizes), 3, 10, 1)
		})
	}
}

// Without memory each call sees the same idle registry. The hash tie-break still
// spreads a burst (at random, not evenly) instead of piling it on the lowest id.
func TestBurstAcrossCallsColdReconciler(t *testing.T) {
	f := &fleetSim{capacity: 100, held: map[string]int{}}
	got := burst(t, &Delivery{Sender: f}, f, idle(3, 100), 30, []int{1})
	t.Logf("cold, one id per call: %v", got)
	within(t, got, 3, 10, 9) // every worker gets some; no ±1 promise without memory
}

// Two reconcilers with their own memory (two warm processes, one per shard) take
// turns: each learns the other's acquisitions from the workers' replies.
func TestBurstAcrossTwoReconcilers(t *testing.T) {
	f := &fleetSim{capacity: 100, held: map[string]int{}}
	ws := idle(3, 100)
	ds := []*Delivery{{Sender: f, Recent: &Recent{}}, {Sender: f, Recent: &Recent{}}}
	for i := range 30 {
		d := ds[i%2]
		d.Deliver(context.Background(), ws, now.Add(time.Duration(i)*100*time.Millisecond),
			[]records.Decision{{Action: records.NeedsOwner, ID: fmt.Sprintf("n%03d", i)}})
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	t.Logf("two reconcilers, alternating: %v", f.held)
	within(t, f.held, 3, 10, 2)
}

func TestReportedLoadBeatsStaleRegistry(t *testing.T) {
	f := newFake(t)
	f.by["a:8080"] = answer(wakeup.Acquired)
	f.by["b:8080"] = answer(wakeup.Acquired)
	r := &Recent{}
	r.put("a", 5, now) // a reported 5 a moment ago; the registry still says 0
	d := Delivery{Sender: f, Recent: r}
	d.Deliver(context.Background(), []codec.Worker{worker("a", 10, 0), worker("b", 10, 2)}, now.Add(time.Second), needs(1))
	if got := f.offered(); got["b:8080"] != 1 || got["a:8080"] != 0 {
		t.Errorf("offered %v, want b (2 registered) over a (5 reported)", got)
	}
	// A registry load above the remembered one wins: it is newer.
	f2 := newFake(t)
	f2.by["a:8080"] = answer(wakeup.Acquired)
	f2.by["b:8080"] = answer(wakeup.Acquired)
	r.put("b", 1, now)
	(&Delivery{Sender: f2, Recent: r}).Deliver(context.Background(),
		[]codec.Worker{worker("a", 10, 4), worker("b", 10, 6)}, now.Add(time.Second), needs(1))
	if got := f2.offered(); got["a:8080"] != 1 {
		t.Errorf("offered %v, want a (max(4, 5) = 5 < max(6, 1) = 6)", got)
	}
}

func TestRecentExpires(t *testing.T) {
	r := &Recent{TTL: 10 * time.Second}
	r.put("a", 7, now)
	if l, ok := r.get("a", now.Add(9*time.Second)); !ok || l != 7 {
		t.Errorf("get before TTL = %d, %v", l, ok)
	}
	if _, ok := r.get("a", now.Add(10*time.Second)); ok {
		t.Error("entry outlived its TTL")
	}
	f := newFake(t)
	f.by["a:8080"] = answer(wakeup.Acquired)
	f.by["b:8080"] = answer(wakeup.Acquired)
	r.put("a", 9, now)
	(&Delivery{Sender: f, Recent: r}).Deliver(context.Background(),
		[]codec.Worker{worker("a", 10, 0), worker("b", 10, 3)}, now.Add(30*time.Second), needs(1))
	if got := f.offered(); got["a:8080"] != 1 {
		t.Errorf("offered %v, want a: the remembered 9 has expired, the registry says 0", got)
	}
}

func TestRecentIsBounded(t *testing.T) {
	r := &Recent{TTL: time.Hour, Max: 3}
	for i := range 10 {
		r.put(fmt.Sprintf("w%d", i), i, now.Add(time.Duration(i)*time.Second))
	}
	if r.Len() != 3 {
		t.Fatalf("%d remembered, want 3", r.Len())
	}
	for i := range 10 {
		_, ok := r.get(fmt.Sprintf("w%d", i), now.Add(time.Minute))
		if want := i >= 7; ok != want {
			t.Errorf("w%d remembered %v, want %v (the newest 3 are kept)", i, ok, want)
		}
	}
	var nilRecent *Recent
	nilRecent.put("a", 1, now)
	if _, ok := nilRecent.get("a", now); ok || nilRecent.Len() != 0 {
		t.Error("a nil Recent remembered something")
	}
}

// A worker remembered as full while the registry shows room is still offered ids:
// if it is full it answers NoCapacity; if it shed load it takes them.
func TestRememberedFullStillOffered(t *testing.T) {
	f := newFake(t)
	f.by["a:8080"] = answer(wakeup.Acquired)
	r := &Recent{}
	r.put("a", 10, now)
	out := (&Delivery{Sender: f, Recent: r}).Deliver(context.Background(), []codec.Worker{worker("a", 10, 4)}, now.Add(time.Second), needs(2))
	for id, o := range out {
		if !o.Done {
			t.Errorf("%s: %+v", id, o)
		}
	}
}

// An unreachable worker's non-answer is not remembered as a load.
func TestUnreachableNotRemembered(t *testing.T) {
	f := newFake(t)
	f.by["a:8080"] = unreachable
	f.by["b:8080"] = answer(wakeup.Acquired)
	r := &Recent{}
	(&Delivery{Sender: f, Recent: r}).Deliver(context.Background(), []codec.Worker{worker("a", 10, 0), worker("b", 10, 5)}, now, needs(1))
	if _, ok := r.get("a", now); ok {
		t.Error("unreachable worker remembered")
	}
	if l, ok := r.get("b", now); !ok || l != 6 {
		t.Errorf("b remembered %d, %v; want 6 (5 registered + 1 acquired, no load in the reply)", l, ok)
	}
}
