package member

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sockfleet/sockfleet/shared/registry"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

// fakeRegistry is a strict fake: Join and Renew answer with the set handlers
// (nil: success); anything else fails the test.
type fakeRegistry struct {
	t      *testing.T
	mu     sync.Mutex
	join   func() (bool, error)
	renew  func(ctx context.Context) error
	renews []codec.Worker
	left   int
}

func (f *fakeRegistry) Join(_ context.Context, w codec.Worker, _ time.Time, skew time.Duration) (bool, error) {
	f.mu.Lock()
	h := f.join
	f.mu.Unlock()
	if w.Incarnation != "inc" || skew != time.Second {
		f.t.Errorf("join with %+v, skew %s", w, skew)
	}
	if h == nil {
		return false, nil
	}
	return h()
}

func (f *fakeRegistry) Renew(ctx context.Context, w codec.Worker) error {
	f.mu.Lock()
	f.renews = append(f.renews, w)
	h := f.renew
	f.mu.Unlock()
	if h == nil {
		return nil
	}
	return h(ctx)
}

func (f *fakeRegistry) Leave(_ context.Context, id, inc string, _ time.Time) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if id != "w" || inc != "inc" {
		f.t.Errorf("leave %s %s", id, inc)
	}
	f.left++
	return nil
}

func (f *fakeRegistry) setRenew(h func(ctx context.Context) error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.renew = h
}

func (f *fakeRegistry) lastRenew() codec.Worker {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.renews[len(f.renews)-1]
}

// newSession: lease 10s, fence 6s, renew every 2s, margin 1s; the worker holds 3
// connections.
func newSession(t *testing.T) (*Session, *fakeRegistry, *bool) {
	f := &fakeRegistry{t: t}
	draining := new(bool)
	s, err := New(Config{
		WorkerID: "w", Incarnation: "inc", Addr: "127.0.0.1:1", Capacity: 5, Registry: f,
		Lease: 10 * time.Second, RenewInterval: 2 * time.Second, Fence: 6 * time.Second, SkewMargin: time.Second,
		State: func() (int, bool) { return 3, *draining },
	})
	if err != nil {
		t.Fatal(err)
	}
	return s, f, draining
}

func TestConfigRules(t *testing.T) {
	ok := Config{WorkerID: "w", Incarnation: "i", Registry: &fakeRegistry{t: t}, State: func() (int, bool) { return 0, false },
		Lease: 10 * time.Second, RenewInterval: 2 * time.Second, Fence: 6 * time.Second}
	for name, tc := range map[string]struct {
		edit func(*Config)
		ok   bool
	}{
		"valid":                  {func(*Config) {}, true},
		"no incarnation":         {func(c *Config) { c.Incarnation = "" }, false},
		"no state":               {func(c *Config) { c.State = nil }, false},
		"fence not below lease":  {func(c *Config) { c.Fence = c.Lease }, false},
		"no renew interval":      {func(c *Config) { c.RenewInterval = 0 }, false},
		"lease past a tombstone": {func(c *Config) { c.Lease = registry.MaxMemberLease + time.Second }, false},
	} {
		t.Run(name, func(t *testing.T) {
			c := ok
			tc.edit(&c)
			if _, err := New(c); (err == nil) != tc.ok {
				t.Fatalf("New: %v, want ok %v", err, tc.ok)
			}
		})
	}
}

// Before the join the session is not valid; after it, it is valid until the start
// of the last good renew plus the fence, when Ctx is cancelled with ErrFenced; a
// renew that succeeds afterwards makes it valid again with a fresh Ctx.
func TestFenceAndRecovery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, f, _ := newSession(t)
		if s.Valid() || s.Ctx().Err() == nil {
			t.Fatal("valid before the join")
		}
		if _, err := s.Join(context.Background()); err != nil {
			t.Fatal(err)
		}
		ctx := s.Ctx()
		if !s.Valid() || ctx.Err() != nil {
			t.Fatal("not valid after the join")
		}
		select {
		case <-s.Renewed():
		default:
			t.Fatal("the join did not say the table answers")
		}
		runCtx, stop := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Go(func() { s.Run(runCtx) })
		time.Sleep(2*time.Second + time.Millisecond) // the renew at 2s succeeds
		synctest.Wait()
		t0 := time.Now().Add(-time.Millisecond)
		f.setRenew(func(ctx context.Context) error {
			<-ctx.Done() // an unreachable table
			return ctx.Err()
		})
		time.Sleep(t0.Add(6*time.Second).Sub(time.Now()) - time.Millisecond)
		synctest.Wait()
		if !s.Valid() || ctx.Err() != nil {
			t.Fatal("fenced before the deadline")
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if s.Valid() || !errors.Is(context.Cause(ctx), ErrFenced) {
			t.Fatalf("at the deadline: valid %v, cause %v", s.Valid(), context.Cause(ctx))
		}
		f.setRenew(nil) // the table is back
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if !s.Valid() || s.Ctx().Err() != nil || ctx.Err() == nil {
			t.Fatal("a good renew did not lift the fence with a fresh context")
		}
		if s.Err() != nil {
			t.Fatalf("Err %v after a fence", s.Err())
		}
		stop()
		wg.Wait()
	})
}

// "Not a member" ends the session for good: Done, Err wrapping ErrExpelled, Ctx
// cancelled with it, not valid, and no further write.
func TestNotAMemberEndsTheSession(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, f, draining := newSession(t)
		if _, err := s.Join(context.Background()); err != nil {
			t.Fatal(err)
		}
		*draining = true
		if err := s.Renew(context.Background()); err != nil {
			t.Fatal(err)
		}
		if w := f.lastRenew(); w.Load != 3 || !w.Draining || w.Capacity != 5 || w.Incarnation != "inc" {
			t.Fatalf("renew wrote %+v", w)
		}
		ctx := s.Ctx()
		f.setRenew(func(context.Context) error {
			return fmt.Errorf("renew membership w: %w: declared dead", registry.ErrNotMember)
		})
		if err := s.Renew(context.Background()); !errors.Is(err, ErrExpelled) {
			t.Fatalf("renew: %v, want ErrExpelled", err)
		}
		select {
		case <-s.Done():
		default:
			t.Fatal("Done not closed")
		}
		if !errors.Is(s.Err(), ErrExpelled) || !errors.Is(context.Cause(ctx), ErrExpelled) || s.Valid() {
			t.Fatalf("Err %v, cause %v, valid %v", s.Err(), context.Cause(ctx), s.Valid())
		}
		f.setRenew(nil)
		n := len(f.renews)
		if err := s.Renew(context.Background()); !errors.Is(err, ErrExpelled) || len(f.renews) != n {
			t.Fatalf("renew after expulsion: %v, %d writes", err, len(f.renews)-n)
		}
		if s.Ctx().Err() == nil {
			t.Fatal("a renew revived an expelled session")
		}
	})
}

// A live item of the same id at join ends the session; a failed join is retried.
func TestJoin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, f, _ := newSession(t)
		tries := 0
		f.join = func() (bool, error) {
			tries++
			if tries < 3 {
				return false, errors.New("throttled")
			}
			return true, nil
		}
		replaced, err := s.Join(context.Background())
		if err != nil || !replaced || tries != 3 {
			t.Fatalf("join: replaced %v, err %v after %d tries", replaced, err, tries)
		}
		if err := s.Leave(context.Background()); err != nil || f.left != 1 {
			t.Fatalf("leave: %v, %d", err, f.left)
		}

		s2, f2, _ := newSession(t)
		f2.join = func() (bool, error) { return false, fmt.Errorf("join w: %w", registry.ErrInUse) }
		if _, err := s2.Join(context.Background()); !errors.Is(err, ErrExpelled) || s2.Err() == nil {
			t.Fatalf("join over a live item: %v", err)
		}
	})
}
