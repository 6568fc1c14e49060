package lease_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sockfleet/sockfleet/shared/lease"
	"github.com/sockfleet/sockfleet/shared/schema"
)

func TestReleaseExpired(t *testing.T) {
	f := newFixture(t)
	s := f.store(nil, 0)
	now := time.Now()
	mk := func(id, owner string, v, exp int64) {
		c := started(id)
		c.LeaseOwner, c.LeaseVersion, c.LeaseExpiresAtMs = owner, v, exp
		f.put(c)
	}
	mk("old", "w1", 3, now.UnixMilli()-3_000)
	mk("margin", "w1", 3, now.UnixMilli()-1_000)
	mk("live", "w1", 3, now.UnixMilli()+5_000)
	mk("retaken", "w2", 4, now.UnixMilli()-3_000)
	cases := []struct {
		id, owner string
		v         int64
		want      error
	}{
		{"old", "w1", 3, nil},
		{"old", "w1", 3, nil}, // again: already released by us, not an error
		{"margin", "w1", 3, lease.ErrHeld},
		{"live", "w1", 3, lease.ErrHeld},
		{"retaken", "w1", 3, lease.ErrLost},
		{"live", "w1", 2, lease.ErrLost},
		{"missing", "w1", 1, lease.ErrNotFound},
	}
	for _, tc := range cases {
		err := s.ReleaseExpired(f.ctx, tc.id, tc.owner, tc.v, now)
		if !errors.Is(err, tc.want) && (tc.want != nil || err != nil) {
			t.Errorf("ReleaseExpired(%s, %s, %d) = %v, want %v", tc.id, tc.owner, tc.v, err, tc.want)
		}
	}
	if c := f.get("old"); c.Owned() || c.LeaseVersion != 3 || c.LastSeq != 7 {
		t.Errorf("swept item %+v", c)
	}
	if c := f.get("live"); c.LeaseOwner != "w1" {
		t.Errorf("live lease was swept: %+v", c)
	}
	if f.raw("missing") != nil {
		t.Error("the sweep created an item")
	}
}

func TestReleaseAllOwnedBy(t *testing.T) {
	f := newFixture(t)
	s := f.store(nil, 0)
	for i := range 30 {
		f.put(started(fmt.Sprint("c", i)))
	}
	for i := range 30 {
		w := "dead"
		if i%3 == 0 {
			w = "alive"
		}
		if _, err := s.Acquire(f.ctx, fmt.Sprint("c", i), w); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.ReleaseAllOwnedBy(f.ctx, "dead")
	if err != nil || len(got) != 20 {
		t.Fatalf("released %d (%v), want 20", len(got), err)
	}
	for i := range 30 {
		c := f.get(fmt.Sprint("c", i))
		if i%3 == 0 && c.LeaseOwner != "alive" || i%3 != 0 && c.Owned() {
			t.Errorf("c%d after crash release: %+v", i, c)
		}
	}
	again, err := s.ReleaseAllOwnedBy(f.ctx, "dead")
	if err != nil || len(again) != 0 {
		t.Fatalf("duplicate crash event released %v, %v", again, err)
	}
	if _, err := s.ReleaseAllOwnedBy(f.ctx, "WORKER#x"); !errors.Is(err, lease.ErrInvalid) {
		t.Fatalf("bad worker id: %v", err)
	}
}

// A lease naming a worker that died a while ago may be a stale image written back
// over a live holder's: ReleaseAllOwnedByAfter marks it first and releases it only a
// hold later, and a holder that takes it back in between keeps it.
func TestReleaseAllOwnedByAfterWaitsForTheHolder(t *testing.T) {
	f := newFixture(t)
	s := f.memberStore()
	f.put(started("orphan"))
	f.put(started("held"))
	if _, err := s.Acquire(f.ctx, "orphan", "dead"); err != nil {
		t.Fatal(err)
	}
	old, err := s.Acquire(f.ctx, "held", "dead")
	if err != nil {
		t.Fatal(err)
	}
	image := f.raw("held") // the console page of "held" while dead held it
	if err := s.Release(f.ctx, old, lease.Progress{}); err != nil {
		t.Fatal(err)
	}
	holder, err := s.Acquire(f.ctx, "held", "live")
	if err != nil {
		t.Fatal(err)
	}
	f.putRaw(image) // written back over the live holder's lease

	const hold = 300 * time.Millisecond
	if got, err := s.ReleaseAllOwnedByAfter(f.ctx, "dead", hold); err != nil || len(got) != 0 {
		t.Fatalf("first call released %v (%v), want only marks", got, err)
	}
	if c, err := s.Checkpoint(f.ctx, holder, lease.Progress{LastSeq: 3}); err != nil || c.LeaseOwner != "live" {
		t.Fatalf("the holder's checkpoint: %+v, %v, want it taken back", c, err)
	}
	if it := f.raw("held"); it[schema.AttrUnheldSince] != nil {
		t.Errorf("the reclaim left the mark: %v", it[schema.AttrUnheldSince])
	}
	time.Sleep(hold)
	got, err := s.ReleaseAllOwnedByAfter(f.ctx, "dead", hold)
	if err != nil || !slices.Equal(got, []string{"orphan"}) {
		t.Fatalf("after the hold released %v (%v), want [orphan]", got, err)
	}
	if c := f.get("held"); c.LeaseOwner != "live" || c.LeaseVersion != holder.Version {
		t.Errorf("the holder's lease: %+v", c)
	}
	if _, err := s.ReleaseAllOwnedByAfter(f.ctx, "dead", 0); !errors.Is(err, lease.ErrInvalid) {
		t.Errorf("zero hold: %v", err)
	}
}
