package owner

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sockfleet/sockfleet/shared/lease"
	"github.com/sockfleet/sockfleet/shared/registry"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/shared/wakeup"
)

// fakeMembers is a strict fake of the membership registry and the store's
// membership operations.
type fakeMembers struct {
	t      *testing.T
	mu     sync.Mutex
	renew  func(ctx context.Context) error
	renews int
	// checkpoint, if set, answers checkpoints.
	checkpoint func(ctx context.Context) error
	left       bool
}

func (f *fakeMembers) Join(context.Context, codec.Worker, time.Time, time.Duration) (bool, error) {
	return false, nil
}

func (f *fakeMembers) Renew(ctx context.Context, w codec.Worker) error {
	f.mu.Lock()
	f.renews++
	h := f.renew
	f.mu.Unlock()
	if w.Incarnation != "inc" {
		f.t.Errorf("renew with incarnation %q", w.Incarnation)
	}
	if h == nil {
		return nil
	}
	return h(ctx)
}

func (f *fakeMembers) Leave(context.Context, string, string, time.Time) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.left = true
	return nil
}

func (f *fakeMembers) setRenew(h func(ctx context.Context) error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.renew = h
}

func (f *fakeMembers) Checkpoint(ctx context.Context, l lease.Lease, _ lease.Progress) (codec.Connection, error) {
	if f.checkpoint != nil {
		if err := f.checkpoint(ctx); err != nil {
			return codec.Connection{}, err
		}
	}
	return started(l.ID), nil
}

func (f *fakeMembers) ReadOwned(context.Context, []string) (map[string]lease.Snapshot, float64, error) {
	return nil, 0, nil
}

func (f *fakeMembers) Naming(context.Context, string) ([]string, float64, error) { return nil, 0, nil }

func (f *fakeMembers) Get(_ context.Context, id string) (codec.Connection, error) {
	f.t.Errorf("unexpected Get of %s", id)
	return codec.Connection{}, lease.ErrNotFound
}

func (f *fakeMembers) AcquireUnheld(context.Context, string, string, int64) (lease.Lease, error) {
	panic("unexpected AcquireUnheld")
}

func (f *fakeMembers) Renumber(_ context.Context, l lease.Lease, _ lease.Progress) (lease.Lease, codec.Connection, error) {
	f.t.Errorf("unexpected Renumber of %s", l.ID)
	return lease.Lease{}, codec.Connection{}, lease.ErrLost
}

func (f *fakeMembers) ReleaseAllOwnedBy(context.Context, string) ([]string, error) {
	f.t.Error("unexpected ReleaseAllOwnedBy")
	return nil, nil
}

// flakyReleases wraps the rig's store: releases fail while down is set.
type flakyReleases struct {
	*fakeStore
	mu   sync.Mutex
	down bool
}

func (f *flakyReleases) Release(ctx context.Context, l lease.Lease, p lease.Progress) error {
	f.mu.Lock()
	down := f.down
	f.mu.Unlock()
	if down {
		return fmt.Errorf("release: %w", lease.ErrUnavailable)
	}
	return f.fakeStore.Release(ctx, l, p)
}

// newMemberRig is newRig in membership mode: lease 10s, fence 6s, renew 2s.
func newMemberRig(t *testing.T) (*rig, *fakeMembers, *flakyReleases) {
	r := newRig(t, 5)
	fm := &fakeMembers{t: t}
	fr := &flakyReleases{fakeStore: r.store}
	r.store.renew = func(_ context.Context, l lease.Lease, _ lease.Progress) (codec.Connection, error) {
		t.Errorf("per-connection renew of %s in membership mode", l.ID)
		return codec.Connection{}, errors.New("unexpected")
	}
	cfg := r.m.cfg
	cfg.Store = fr
	cfg.Member = &MemberConfig{Incarnation: "inc", Registry: fm, Store: fm, CheckpointInterval: 30 * time.Second,
		BackstopInterval: time.Minute}
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.m = m
	return r, fm, fr
}

// The membership lease fences every connection at the last good renew's start plus
// the deadline, on the monotonic clock, with no per-connection renew; once the
// table answers again, the releases that failed are retried.
func TestMembershipFenceAndRetriedRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, fm, fr := newMemberRig(t)
		stop := r.start(t)
		synctest.Wait()
		for _, id := range []string{"a", "b"} {
			if got := r.wake(t, wakeup.Conn{ID: id, Reason: wakeup.NeedsOwner}); got != wakeup.Acquired {
				t.Fatalf("wake %s: %s", id, got)
			}
		}
		time.Sleep(4*time.Second + time.Millisecond) // renews at 2s and 4s succeed
		synctest.Wait()
		t0 := time.Now().Add(-time.Millisecond) // the 4s renew's start
		fm.setRenew(func(ctx context.Context) error {
			<-ctx.Done() // an unreachable table
			return ctx.Err()
		})
		fr.mu.Lock()
		fr.down = true
		fr.mu.Unlock()
		time.Sleep(t0.Add(6*time.Second - time.Millisecond).Sub(time.Now()))
		synctest.Wait()
		if !r.stream("a").running.Load() || !r.stream("b").running.Load() {
			t.Fatal("fenced before the membership deadline")
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if r.stream("a").running.Load() || r.stream("b").running.Load() {
			t.Fatal("still streaming at the membership deadline")
		}
		if n := r.m.cfg.Metrics.SelfFences.Load(); n != 2 {
			t.Fatalf("self-fences %d, want 2", n)
		}
		if got := r.wake(t, wakeup.Conn{ID: "c", Reason: wakeup.NeedsOwner}); got != wakeup.Failed {
			t.Fatalf("wake while fenced: %s, want failed", got)
		}
		if _, ok := r.store.released("a"); ok {
			t.Fatal("release recorded while the table was down")
		}
		// The table is back (an outage longer than the lease): the next renew
		// succeeds and the failed releases are retried with their checkpoints.
		fm.setRenew(nil)
		fr.mu.Lock()
		fr.down = false
		fr.mu.Unlock()
		time.Sleep(4 * time.Second)
		synctest.Wait()
		for _, id := range []string{"a", "b"} {
			if p, ok := r.store.released(id); !ok || p.Status != "fenced" || p.LastSeq != 10 {
				t.Fatalf("%s: release %+v %v, want the fenced release retried", id, p, ok)
			}
		}
		if got := r.wake(t, wakeup.Conn{ID: "c", Reason: wakeup.NeedsOwner}); got != wakeup.Acquired {
			t.Fatalf("wake after recovery: %s", got)
		}
		stop()
		if !fm.left {
			t.Fatal("drain did not leave the membership")
		}
	})
}

// A renew that says "not a member" stops everything and makes Run return
// ErrExpelled.
func TestNotAMemberExpels(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, fm, _ := newMemberRig(t)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- r.m.Run(ctx) }()
		synctest.Wait()
		if got := r.wake(t, wakeup.Conn{ID: "a", Reason: wakeup.NeedsOwner}); got != wakeup.Acquired {
			t.Fatalf("wake: %s", got)
		}
		fm.setRenew(func(context.Context) error {
			return fmt.Errorf("renew membership w: %w: declared dead", registry.ErrNotMember)
		})
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if err := <-done; !errors.Is(err, ErrExpelled) {
			t.Fatalf("Run returned %v, want ErrExpelled", err)
		}
		if r.stream("a").running.Load() {
			t.Fatal("still streaming after expulsion")
		}
		if p, ok := r.store.released("a"); !ok || p.Status != "expelled" {
			t.Fatalf("release %+v %v", p, ok)
		}
		if fm.left {
			t.Fatal("an expelled worker deleted the item the reconciler goes by")
		}
	})
}

// A checkpoint pass longer than the fence deadline (every checkpoint times out, one
// at a time) delays neither the membership renews nor keeps them from holding the
// fence off.
func TestSlowCheckpointsDoNotDelayTheRenew(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, fm, _ := newMemberRig(t)
		var tried atomic.Int64
		fm.checkpoint = func(ctx context.Context) error {
			tried.Add(1)
			<-ctx.Done() // a swamped table: each times out after the renew interval
			return ctx.Err()
		}
		cfg := r.m.cfg
		cfg.RenewConcurrency = 1
		cfg.Member.CheckpointInterval = time.Second
		m, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		r.m = m
		stop := r.start(t)
		defer stop()
		synctest.Wait()
		ids := []string{"a", "b", "c", "d", "e"}
		for _, id := range ids {
			if got := r.wake(t, wakeup.Conn{ID: id, Reason: wakeup.NeedsOwner}); got != wakeup.Acquired {
				t.Fatalf("wake %s: %s", id, got)
			}
			r.stream(id).seq.Store(11) // delivered since the acquire: a checkpoint is due
		}
		fm.mu.Lock()
		n0 := fm.renews
		fm.mu.Unlock()
		time.Sleep(30 * time.Second) // passes of 5 x 2s = 10s, the fence is at 6s
		synctest.Wait()
		fm.mu.Lock()
		n := fm.renews - n0
		fm.mu.Unlock()
		if n < 15 {
			t.Fatalf("%d renews in 30s at a 2s interval", n)
		}
		if f := r.m.cfg.Metrics.SelfFences.Load(); f != 0 {
			t.Fatalf("%d self-fences", f)
		}
		if c := tried.Load(); c < 10 {
			t.Fatalf("%d checkpoints tried: the passes did not run", c)
		}
		for _, id := range ids {
			if !r.stream(id).running.Load() {
				t.Fatalf("%s stopped", id)
			}
		}
	})
}

// The backstop read looks closer at what no stream record reports on an owned item:
// a deleted or zeroed expiry, and a mistyped field no write repairs (issue 21).
func TestBackstopSeesConsoleEdits(t *testing.T) {
	s := &fakeStream{}
	s.SetURL(url0)
	o := &owned{lease: lease.Lease{ID: "c", Owner: "w1", Version: 7}, s: s}
	held := lease.Snapshot{Found: true, DesiredState: schema.Started, WSURL: url0, LeaseOwner: "w1", LeaseVersion: 7,
		ExpiresAtMs: schema.LeaseHeldByMember}
	if differs(o, held, "w1") {
		t.Fatal("an unchanged item differs")
	}
	for name, edit := range map[string]func(*lease.Snapshot){
		"expiry deleted or zeroed": func(sn *lease.Snapshot) { sn.ExpiresAtMs = 0 },
		"owner deleted":            func(sn *lease.Snapshot) { sn.LeaseOwner = "" },
		"stale version":            func(sn *lease.Snapshot) { sn.LeaseVersion = 6 },
		"mistyped nudged_at_ms":    func(sn *lease.Snapshot) { sn.Unrunnable = errors.New("invalid nudged_at_ms") },
	} {
		sn := held
		edit(&sn)
		if !differs(o, sn, "w1") {
			t.Errorf("%s: not seen", name)
		}
	}
}
