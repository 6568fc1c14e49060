package lease_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sockfleet/sockfleet/shared/lease"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

func (f *fixture) memberStore() *lease.Store {
	f.t.Helper()
	s, err := lease.New(f.env.DB, lease.Config{Table: f.env.Table, SkewMargin: 2 * time.Second, Membership: true})
	if err != nil {
		f.t.Fatal(err)
	}
	return s
}

// In stream mode a lease has no expiry of its own: nobody can take it over by
// waiting, only a release (by its owner, or by the reconciler once the owner is a
// dead member) frees it.
func TestMembershipLeaseHasNoExpiry(t *testing.T) {
	f := newFixture(t)
	s := f.memberStore()
	f.put(codec.Connection{ID: "c1", DesiredState: schema.Started, WSURL: "ws://h/c1"})
	l, err := s.Acquire(f.ctx, "c1", "w1")
	if err != nil {
		t.Fatal(err)
	}
	if c := f.get("c1"); c.LeaseExpiresAtMs != schema.LeaseHeldByMember || c.LeaseOwner != "w1" || c.LeaseVersion != l.Version || l.Version <= 0 {
		t.Fatalf("acquired item %+v", c)
	}
	// Even a store whose clock runs far ahead cannot take it.
	ahead, _ := lease.New(f.env.DB, lease.Config{Table: f.env.Table, Membership: true,
		Now: func() time.Time { return time.Now().Add(24 * time.Hour) }})
	if _, err := ahead.Acquire(f.ctx, "c1", "w2"); !errors.Is(err, lease.ErrHeld) {
		t.Fatalf("acquire of a held membership lease: %v, want ErrHeld", err)
	}
	if err := s.Release(f.ctx, l, lease.Progress{LastSeq: 7}); err != nil {
		t.Fatal(err)
	}
	if l2, err := ahead.Acquire(f.ctx, "c1", "w2"); err != nil || l2.Version <= l.Version {
		t.Fatalf("acquire after release: %+v %v", l2, err)
	}
}

// A checkpoint stores last_seq and status, leaves the expiry alone, returns the
// item, and is refused to anyone but the owner at its version.
func TestCheckpoint(t *testing.T) {
	f := newFixture(t)
	s := f.memberStore()
	f.put(codec.Connection{ID: "c1", DesiredState: schema.Started, WSURL: "ws://h/c1"})
	l, err := s.Acquire(f.ctx, "c1", "w1")
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.Checkpoint(f.ctx, l, lease.Progress{LastSeq: 42, Status: "streaming"})
	if err != nil {
		t.Fatal(err)
	}
	if c.LastSeq != 42 || c.Status != "streaming" || c.LeaseExpiresAtMs != schema.LeaseHeldByMember || c.WSURL != "ws://h/c1" {
		t.Fatalf("checkpoint returned %+v", c)
	}
	if got := f.get("c1"); got.LastSeq != 42 || got.LeaseExpiresAtMs != schema.LeaseHeldByMember {
		t.Fatalf("stored %+v", got)
	}
	stale := l
	stale.Version--
	if _, err := s.Checkpoint(f.ctx, stale, lease.Progress{LastSeq: 99}); !errors.Is(err, lease.ErrLost) {
		t.Fatalf("checkpoint at an old version: %v, want ErrLost", err)
	}
	other := l // a worker whose lease ended before l was acquired: a lower version
	other.Owner, other.Version = "w2", l.Version-1
	if _, err := s.Checkpoint(f.ctx, other, lease.Progress{LastSeq: 99}); !errors.Is(err, lease.ErrLost) {
		t.Fatalf("checkpoint by another worker: %v, want ErrLost", err)
	}
	if got := f.get("c1"); got.LastSeq != 42 {
		t.Fatalf("a refused checkpoint wrote: %+v", got)
	}
	bad := l
	bad.ID = "has#hash"
	if _, err := s.Checkpoint(f.ctx, bad, lease.Progress{}); !errors.Is(err, lease.ErrInvalid) {
		t.Fatalf("bad id: %v, want ErrInvalid", err)
	}
	if err := s.Release(f.ctx, l, lease.Progress{LastSeq: 43}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Checkpoint(f.ctx, l, lease.Progress{LastSeq: 44}); !errors.Is(err, lease.ErrLost) {
		t.Fatalf("checkpoint after release: %v, want ErrLost", err)
	}
}

// ReadOwned reads up to 100 items in one eventually consistent BatchGetItem, says
// which are absent, and counts the read units.
func TestReadOwned(t *testing.T) {
	f := newFixture(t)
	s := f.memberStore()
	var ids []string
	for i := range 100 {
		id := fmt.Sprintf("c%03d", i)
		ids = append(ids, id)
		if i == 99 {
			continue // absent
		}
		st := schema.Started
		if i == 5 {
			st = schema.Stopped
		}
		f.put(codec.Connection{ID: id, DesiredState: st, WSURL: "ws://h/" + id, LeaseOwner: "w1", LeaseVersion: int64(i),
			LeaseExpiresAtMs: schema.LeaseHeldByMember})
	}
	bad := codec.EncodeConnection(codec.Connection{ID: "c007", WSURL: "ws://h/c007", LeaseOwner: "w1", LeaseVersion: 7})
	bad[schema.AttrDesiredState] = codec.S("started") // an operator's lowercase value
	f.putRaw(bad)
	snaps, units, err := s.ReadOwned(f.ctx, ids)
	if err != nil {
		t.Fatal(err)
	}
	if units <= 0 {
		t.Errorf("read units %v, want them counted", units)
	}
	t.Logf("100 keys, 99 items: %.1f read units", units)
	if sn, ok := snaps["c099"]; !ok || sn.Found {
		t.Errorf("absent item: %+v %v", sn, ok)
	}
	if sn := snaps["c005"]; !sn.Found || sn.DesiredState != schema.Stopped {
		t.Errorf("stopped item: %+v", sn)
	}
	if sn := snaps["c007"]; !sn.Found || sn.DesiredState == schema.Started || sn.LeaseOwner != "w1" || sn.LeaseVersion != 7 {
		t.Errorf("unusable item: %+v, want a desired state that is not STARTED and the lease fields", sn)
	}
	if sn := snaps["c042"]; !sn.Found || sn.DesiredState != schema.Started || sn.LeaseVersion != 42 || sn.WSURL != "ws://h/c042" {
		t.Errorf("item: %+v", sn)
	}
	if _, _, err := s.ReadOwned(f.ctx, append(ids, "c100")); !errors.Is(err, lease.ErrInvalid) {
		t.Errorf("101 ids: %v, want ErrInvalid", err)
	}
	if _, _, err := s.ReadOwned(f.ctx, []string{"a#b"}); !errors.Is(err, lease.ErrInvalid) {
		t.Errorf("bad id: %v, want ErrInvalid", err)
	}
}
