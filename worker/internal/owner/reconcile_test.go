package owner

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/sockfleet/sockfleet/shared/lease"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/shared/wakeup"
	"github.com/sockfleet/sockfleet/worker/internal/peer"
)

// confirmStore is a handoff store whose item names worker "w" at version 9 after a
// transfer; its confirming write answers confirm.
type confirmStore struct {
	nopHandoffStore
	confirm error
}

func (confirmStore) Get(_ context.Context, id string) (codec.Connection, error) {
	c := started(id)
	c.LeaseOwner, c.LeaseVersion, c.Status, c.LastSeq = "w", 9, lease.StatusHandedOff, 42
	return c, nil
}

func (s confirmStore) Checkpoint(_ context.Context, l lease.Lease, _ lease.Progress) (codec.Connection, error) {
	if s.confirm != nil {
		return codec.Connection{}, s.confirm
	}
	c := started(l.ID)
	c.LeaseOwner, c.LeaseVersion = l.Owner, l.Version
	return c, nil
}

// An adopt whose confirming write fails (the table did not answer) must not answer
// refused and leave it at that: the old owner takes refused as final, so the table
// would name this worker, which runs nothing. It gives the lease back instead.
func TestAdoptReleasesWhenTheConfirmingWriteFails(t *testing.T) {
	r := newRig(t, 10)
	ho := withHandoffs(t, r)
	ho.cfg.Store = confirmStore{confirm: fmt.Errorf("checkpoint c1: %w", lease.ErrUnavailable)}
	resp := r.m.adopt(context.Background(), "c1", 9, 42, 0, "test", false)
	if resp.Result != peer.Refused {
		t.Fatalf("adopt with a failed confirming write: %+v", resp)
	}
	p, ok := r.store.released("c1")
	if !ok {
		t.Fatal("refused without a release: the table still names this worker, which runs nothing")
	}
	if p.LastSeq != 42 || p.Error == "" {
		t.Errorf("released with %+v", p)
	}
	// A lease already gone is not released (nothing of ours to give back).
	ho.cfg.Store = confirmStore{confirm: fmt.Errorf("checkpoint c2: %w", lease.ErrLost)}
	if resp := r.m.adopt(context.Background(), "c2", 9, 42, 0, "test", false); resp.Result != peer.Refused {
		t.Fatalf("adopt of a lost lease: %+v", resp)
	}
	if _, ok := r.store.released("c2"); ok {
		t.Error("released a lease that is not ours")
	}
}

// A standby whose stream ended before its timer (its buffer overflowed, say) is gone
// from the standby table when the old owner's commit arrives or is lost. The timer
// must still read the item: if the transfer landed, the item names this worker, and
// nobody else will ever run it.
func TestStandbyEndedEarlyStillAdoptsATransfer(t *testing.T) {
	r := newRig(t, 10)
	ho := withHandoffs(t, r)
	ho.cfg.Store = confirmStore{}
	sb := &standby{id: "c1", from: "w0", version: 4} // ended: not in ho.standby
	r.m.standbyExpired(sb)
	if !r.m.runs("c1") {
		t.Fatal("the item names this worker after a transfer, and it runs nothing")
	}
	if s := r.stream("c1"); s == nil || s.LastSeq() != 42 {
		t.Fatalf("adopted stream %+v, want one resuming after 42", s)
	}
	r.m.mu.Lock()
	o := r.m.conns["c1"]
	r.m.mu.Unlock()
	o.cancel(errLost) // end it without a release
	<-o.done
}

// floorStore records the version floor of each acquire.
type floorStore struct {
	*fakeStore
	mu     sync.Mutex
	floors map[string]int64
}

func (f *floorStore) AcquireAbove(ctx context.Context, id, worker string, floor int64) (lease.Lease, error) {
	f.mu.Lock()
	f.floors[id] = floor
	f.mu.Unlock()
	return f.fakeStore.Acquire(ctx, id, worker)
}

// A needs-owner wakeup's lease_version (a version the reconciler saw issued) is the
// floor of the acquire's version, so a rollback plus a lagging clock cannot hand out
// a version below it.
func TestNeedsOwnerVersionIsTheAcquireFloor(t *testing.T) {
	r := newRig(t, 10)
	fs := &floorStore{fakeStore: r.store, floors: map[string]int64{}}
	r.m.cfg.Store = fs
	if got := r.wake(t, wakeup.Conn{ID: "c1", LeaseVersion: 1234, Reason: wakeup.NeedsOwner}); got != wakeup.Acquired {
		t.Fatalf("wake: %s", got)
	}
	if fs.floors["c1"] != 1234 {
		t.Fatalf("acquire floor %d, want the wakeup's 1234 (floors %v)", fs.floors["c1"], fs.floors)
	}
	r.m.mu.Lock()
	o := r.m.conns["c1"]
	r.m.mu.Unlock()
	o.cancel(errLost)
	<-o.done
}
