package dispatch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sockfleet/sockfleet/functions/reconciler/records"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/shared/wakeup"
)

var now = time.UnixMilli(1_764_680_000_000)

// fakeSender is strict: a call to an address with no behaviour fails the test.
type fakeSender struct {
	t     *testing.T
	mu    sync.Mutex
	by    map[string]func(wakeup.Request) (wakeup.Response, error)
	calls map[string][]wakeup.Request
}

func newFake(t *testing.T) *fakeSender {
	return &fakeSender{t: t, by: map[string]func(wakeup.Request) (wakeup.Response, error){}, calls: map[string][]wakeup.Request{}}
}

func (f *fakeSender) Send(_ context.Context, addr string, req wakeup.Request) (wakeup.Response, error) {
	f.mu.Lock()
	f.calls[addr] = append(f.calls[addr], req)
	fn := f.by[addr]
	f.mu.Unlock()
	if fn == nil {
		f.t.Errorf("unexpected wakeup to %s: %+v", addr, req)
		return wakeup.Response{}, errors.New("unexpected")
	}
	if len(req.Conns) == 0 || len(req.Conns) > wakeup.MaxConns || req.V != wakeup.Version {
		f.t.Errorf("bad request to %s: %d ids, v%d", addr, len(req.Conns), req.V)
	}
	return fn(req)
}

// answer returns a behaviour that gives every id the same result.
func answer(r wakeup.Result) func(wakeup.Request) (wakeup.Response, error) {
	return func(req wakeup.Request) (wakeup.Response, error) {
		var out wakeup.Response
		for _, c := range req.Conns {
			out.Results = append(out.Results, wakeup.ConnResult{ID: c.ID, Result: r})
		}
		return out, nil
	}
}

func unreachable(wakeup.Request) (wakeup.Response, error) {
	return wakeup.Response{}, errors.New("dial tcp: connection refused")
}

func worker(id string, capacity, load int) codec.Worker {
	return codec.Worker{ID: id, Addr: id + ":8080", Capacity: capacity, Load: load, HeartbeatExpiresAtMs: now.Add(time.Minute).UnixMilli()}
}

func needs(n int) []records.Decision {
	ds := make([]records.Decision, n)
	for i := range ds {
		ds[i] = records.Decision{Action: records.NeedsOwner, ID: fmt.Sprintf("c%03d", i), LeaseVersion: int64(i % 3)}
	}
	return ds
}

// offered counts, per address, the ids offered, and checks that no round offered an
// id to two workers at once.
func (f *fakeSender) offered() map[string]int {
	out := map[string]int{}
	for addr, reqs := range f.calls {
		for _, r := range reqs {
			out[addr] += len(r.Conns)
		}
	}
	return out
}

func TestDeliverSpreadsByCapacity(t *testing.T) {
	f := newFake(t)
	f.by["small:8080"] = answer(wakeup.Acquired)
	f.by["big:8080"] = answer(wakeup.Acquired)
	d := Delivery{Sender: f}
	out := d.Deliver(context.Background(), []codec.Worker{worker("small", 10, 0), worker("big", 30, 0)}, now, needs(20))
	got := f.offered()
	if got["small:8080"] != 5 || got["big:8080"] != 15 {
		t.Errorf("offered %v, want small 5 and big 15 (in proportion to capacity)", got)
	}
	if len(out) != 20 {
		t.Fatalf("%d outcomes", len(out))
	}
	for id, o := range out {
		if !o.Done || o.Result != wakeup.Acquired {
			t.Errorf("%s: %+v", id, o)
		}
	}
	// Each id was offered to exactly one worker, with the version the record showed.
	seen := map[string]bool{}
	for _, reqs := range f.calls {
		for _, r := range reqs {
			for _, c := range r.Conns {
				if seen[c.ID] {
					t.Errorf("%s offered twice", c.ID)
				}
				seen[c.ID] = true
				if c.Reason != wakeup.NeedsOwner {
					t.Errorf("%s: reason %s", c.ID, c.Reason)
				}
			}
		}
	}
}

func TestDeliverLeastLoadedFirst(t *testing.T) {
	f := newFake(t)
	f.by["busy:8080"] = answer(wakeup.Acquired)
	f.by["idle:8080"] = answer(wakeup.Acquired)
	d := Delivery{Sender: f}
	d.Deliver(context.Background(), []codec.Worker{worker("busy", 10, 8), worker("idle", 10, 1)}, now, needs(1))
	if got := f.offered(); got["idle:8080"] != 1 || got["busy:8080"] != 0 {
		t.Errorf("offered %v, want the one id to the idle worker", got)
	}
}

func TestDeliverSkipsDrainingFullAndDead(t *testing.T) {
	f := newFake(t)
	f.by["ok:8080"] = answer(wakeup.Acquired)
	draining := worker("draining", 10, 0)
	draining.Draining = true
	dead := worker("dead", 10, 0)
	dead.HeartbeatExpiresAtMs = now.Add(-time.Second).UnixMilli()
	d := Delivery{Sender: f}
	out := d.Deliver(context.Background(), []codec.Worker{draining, worker("full", 5, 5), dead, worker("ok", 10, 0)}, now, needs(3))
	for id, o := range out {
		if !o.Done || o.Worker != "ok" {
			t.Errorf("%s: %+v", id, o)
		}
	}
}

func TestDeliverReroutesRefusals(t *testing.T) {
	cases := []struct {
		name  string
		first func(wakeup.Request) (wakeup.Response, error)
	}{
		{"unreachable", unreachable},
		{"no capacity", answer(wakeup.NoCapacity)},
		{"draining", answer(wakeup.Draining)},
		{"failed", answer(wakeup.Failed)},
		{"no answer", func(wakeup.Request) (wakeup.Response, error) { return wakeup.Response{V: 1}, nil }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t)
			f.by["a:8080"] = tc.first
			f.by["b:8080"] = answer(wakeup.Acquired)
			d := Delivery{Sender: f}
			// a is the least loaded, so it is offered everything first.
			out := d.Deliver(context.Background(), []codec.Worker{worker("a", 100, 0), worker("b", 100, 50)}, now, needs(4))
			for id, o := range out {
				if !o.Done || o.Worker != "b" || o.Result != wakeup.Acquired {
					t.Errorf("%s: %+v, want acquired by b", id, o)
				}
			}
			if got := f.offered(); got["a:8080"] != 4 || got["b:8080"] != 4 {
				t.Errorf("offered %v", got)
			}
		})
	}
}

func TestDeliverConclusiveAnswers(t *testing.T) {
	for _, r := range []wakeup.Result{wakeup.AlreadyOwned, wakeup.LostRace, wakeup.Stale, wakeup.NotStartable} {
		f := newFake(t)
		f.by["a:8080"] = answer(r)
		out := (&Delivery{Sender: f}).Deliver(context.Background(), []codec.Worker{worker("a", 10, 0), worker("b", 10, 5)}, now, needs(2))
		for id, o := range out {
			if !o.Done || o.Result != r {
				t.Errorf("%s: %s: %+v", r, id, o)
			}
		}
	}
}

func TestDeliverUndeliverable(t *testing.T) {
	t.Run("no workers", func(t *testing.T) {
		out := (&Delivery{Sender: newFake(t)}).Deliver(context.Background(), nil, now, needs(2))
		for id, o := range out {
			if o.Done || o.Why == "" {
				t.Errorf("%s: %+v", id, o)
			}
		}
	})
	t.Run("every worker refuses", func(t *testing.T) {
		f := newFake(t)
		f.by["a:8080"] = unreachable
		f.by["b:8080"] = answer(wakeup.NoCapacity)
		out := (&Delivery{Sender: f}).Deliver(context.Background(), []codec.Worker{worker("a", 10, 0), worker("b", 10, 0)}, now, needs(3))
		if len(out) != 3 {
			t.Fatalf("%d outcomes", len(out))
		}
		for id, o := range out {
			if o.Done {
				t.Errorf("%s: %+v", id, o)
			}
		}
	})
	t.Run("capacity runs out", func(t *testing.T) {
		f := newFake(t)
		f.by["a:8080"] = answer(wakeup.Acquired)
		out := (&Delivery{Sender: f}).Deliver(context.Background(), []codec.Worker{worker("a", 2, 0)}, now, needs(3))
		done := 0
		for _, o := range out {
			if o.Done {
				done++
			}
		}
		if done != 2 || f.offered()["a:8080"] != 2 {
			t.Errorf("done %d, offered %v: want 2 of 3 (capacity 2)", done, f.offered())
		}
	})
}

func TestDeliverChecksGoToTheOwnerOnly(t *testing.T) {
	f := newFake(t)
	f.by["w1:8080"] = answer(wakeup.AlreadyOwned)
	f.by["w2:8080"] = unreachable
	f.by["w3:8080"] = answer(wakeup.Failed)
	ds := []records.Decision{
		{Action: records.OwnerMustAct, ID: "a", Owner: "w1", LeaseVersion: 7},
		{Action: records.OwnerMustAct, ID: "b", Owner: "w2", LeaseVersion: 1},
		{Action: records.OwnerMustAct, ID: "c", Owner: "gone", LeaseVersion: 2},
		{Action: records.OwnerMustAct, ID: "d", Owner: "w3", LeaseVersion: 2},
		{Action: records.Ignore, ID: "e"},
	}
	// w0 is idle and would be everyone's first choice for a needs-owner id.
	ws := []codec.Worker{worker("w0", 100, 0), worker("w1", 10, 9), worker("w2", 10, 9), worker("w3", 10, 9)}
	out := (&Delivery{Sender: f}).Deliver(context.Background(), ws, now, ds)
	if o := out["a"]; !o.Done || o.Worker != "w1" {
		t.Errorf("a: %+v", o)
	}
	if o := out["b"]; o.Done {
		t.Errorf("b (owner unreachable): %+v", o)
	}
	if o := out["c"]; !o.Done {
		t.Errorf("c (owner not live: nobody to tell): %+v", o)
	}
	if o := out["d"]; o.Done {
		t.Errorf("d (owner failed): %+v", o)
	}
	if _, ok := out["e"]; ok {
		t.Error("an ignored decision was delivered")
	}
	if len(f.calls["w1:8080"]) != 1 || len(f.calls["w2:8080"]) != 1 {
		t.Errorf("calls %v", f.calls)
	}
	if c := f.calls["w1:8080"][0].Conns[0]; c.Reason != wakeup.Check || c.LeaseVersion != 7 {
		t.Errorf("check %+v", c)
	}
}

func TestDeliverChunksLargeBursts(t *testing.T) {
	f := newFake(t)
	f.by["a:8080"] = answer(wakeup.Acquired)
	out := (&Delivery{Sender: f}).Deliver(context.Background(), []codec.Worker{worker("a", 2000, 0)}, now, needs(wakeup.MaxConns+1))
	if len(f.calls["a:8080"]) != 2 || len(out) != wakeup.MaxConns+1 {
		t.Errorf("%d requests, %d outcomes", len(f.calls["a:8080"]), len(out))
	}
}

func TestDeliverTimesOutSlowWorkers(t *testing.T) {
	f := newFake(t)
	f.by["b:8080"] = answer(wakeup.Acquired)
	slow := &blocking{next: f}
	d := Delivery{Sender: slow, Timeout: 20 * time.Millisecond}
	start := time.Now()
	out := d.Deliver(context.Background(), []codec.Worker{worker("a", 10, 0), worker("b", 10, 5)}, now, needs(1))
	if o := out["c000"]; !o.Done || o.Worker != "b" {
		t.Errorf("%+v", o)
	}
	if time.Since(start) > 2*time.Second {
		t.Errorf("took %s", time.Since(start))
	}
}

// blocking hangs on a:8080 until the request's context ends.
type blocking struct{ next Sender }

func (b *blocking) Send(ctx context.Context, addr string, req wakeup.Request) (wakeup.Response, error) {
	if addr == "a:8080" {
		<-ctx.Done()
		return wakeup.Response{}, ctx.Err()
	}
	return b.next.Send(ctx, addr, req)
}

func TestWorkersOrder(t *testing.T) {
	ws := []codec.Worker{worker("c", 10, 5), worker("a", 10, 5), worker("b", 20, 2), worker("d", 4, 4)}
	var ids []string
	for _, w := range Workers(ws, now) {
		ids = append(ids, w.ID)
	}
	if fmt.Sprint(ids) != "[b a c]" {
		t.Errorf("order %v", ids)
	}
}

// Scale-in: two workers drain at once. The releases of one are never placed on the
// other, whether the registry already says it drains (it is not offered) or not yet
// (it answers draining and the ids go on to a live worker, even though the draining
// one is the least loaded).
func TestDeliverScaleInNeverPlacesOnADrainingWorker(t *testing.T) {
	f := newFake(t)
	f.by["late:8080"] = answer(wakeup.Draining) // draining, its registry item not yet renewed
	f.by["live:8080"] = answer(wakeup.Acquired)
	flagged := worker("flagged", 100, 0)
	flagged.Draining = true
	d := Delivery{Sender: f, Recent: &Recent{}}
	ws := []codec.Worker{flagged, worker("late", 100, 0), worker("live", 100, 60)}
	out := d.Deliver(context.Background(), ws, now, needs(20))
	for id, o := range out {
		if !o.Done || o.Worker != "live" || o.Result != wakeup.Acquired {
			t.Errorf("%s: %+v, want acquired by live", id, o)
		}
	}
	if got := f.offered(); got["flagged:8080"] != 0 {
		t.Errorf("offered to the flagged draining worker: %v", got)
	}
	// The next batch, with the same registry view, offers late again (the pool lives
	// one call; its next renew, within one renew interval, flags it), and again
	// nothing lands on it.
	for id, o := range d.Deliver(context.Background(), ws, now, needs(5)) {
		if o.Worker != "live" {
			t.Errorf("second batch: %s: %+v", id, o)
		}
	}
}
