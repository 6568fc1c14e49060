package lease_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/lease"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

func TestAcquire(t *testing.T) {
	f := newFixture(t)
	s := f.store(nil, 0)
	f.put(started("a"))

	before := nowMs()
	l, err := s.Acquire(f.ctx, "a", "w1")
	if err != nil {
		t.Fatal(err)
	}
	// A fresh item's first version is the wall-clock floor (see the HLC test).
	if l.Version < before || l.Version > nowMs() || l.Owner != "w1" || l.WSURL != "wss://up.example/streams/a" || l.LastSeq != 7 {
		t.Fatalf("lease %+v", l)
	}
	c := f.get("a")
	if c.LeaseOwner != "w1" || c.LeaseVersion != l.Version || c.LeaseExpiresAtMs != l.ExpiresAtMs {
		t.Fatalf("item %+v does not match lease %+v", c, l)
	}
	if d := l.ExpiresAtMs - nowMs(); d < 9_000 || d > 10_500 {
		t.Errorf("expiry %d ms from now, want about the 10 s lease", d)
	}

	// Released: the next acquire bumps the version.
	if err := s.Release(f.ctx, l, lease.Progress{LastSeq: 9}); err != nil {
		t.Fatal(err)
	}
	l2, err := s.Acquire(f.ctx, "a", "w2")
	if err != nil || l2.Version <= l.Version || l2.LastSeq != 9 {
		t.Fatalf("acquire after release: %+v, %v", l2, err)
	}
}

func TestAcquireRefusals(t *testing.T) {
	f := newFixture(t)
	s := f.store(nil, 0)
	live := started("held")
	live.LeaseOwner, live.LeaseExpiresAtMs, live.LeaseVersion = "w9", nowMs()+60_000, 4
	f.put(live)
	stopped := started("stopped")
	stopped.DesiredState = schema.Stopped
	f.put(stopped)
	lower := codec.EncodeConnection(started("lower"))
	lower[schema.AttrDesiredState] = codec.S("started")
	f.putRaw(lower)
	noState := codec.EncodeConnection(started("nostate"))
	delete(noState, schema.AttrDesiredState)
	f.putRaw(noState)
	justExpired := started("fresh-expired") // expired, but within the skew margin
	justExpired.LeaseOwner, justExpired.LeaseExpiresAtMs, justExpired.LeaseVersion = "w9", nowMs()-500, 2
	f.put(justExpired)

	cases := []struct {
		id   string
		want error
	}{
		{"missing", lease.ErrNotFound},
		{"held", lease.ErrHeld},
		{"stopped", lease.ErrNotStarted},
		{"lower", lease.ErrNotStarted},
		{"nostate", lease.ErrNotStarted},
		{"fresh-expired", lease.ErrHeld},
		{"CONN#held", lease.ErrInvalid}, // the seed's double prefix
		{"", lease.ErrInvalid},
	}
	for _, tc := range cases {
		t.Run(tc.id, func(t *testing.T) {
			before := f.raw(tc.id)
			_, err := s.Acquire(f.ctx, tc.id, "w1")
			if !errors.Is(err, tc.want) {
				t.Fatalf("Acquire(%q) = %v, want %v", tc.id, err, tc.want)
			}
			if after := f.raw(tc.id); !reflect.DeepEqual(before, after) {
				t.Errorf("a refused acquire changed the item:\nbefore %v\nafter  %v", before, after)
			}
		})
	}
	if n := f.count(); n != 5 {
		t.Errorf("%d items in the table, want 5: a refused acquire created an item", n)
	}
	if _, err := s.Acquire(f.ctx, "held", "bad worker"); !errors.Is(err, lease.ErrInvalid) {
		t.Errorf("bad worker id: %v", err)
	}
}

func TestAcquireExpiredBeyondMargin(t *testing.T) {
	f := newFixture(t)
	s := f.store(nil, 0)
	c := started("x")
	c.LeaseOwner, c.LeaseExpiresAtMs, c.LeaseVersion = "dead", nowMs()-2_500, 5
	f.put(c)
	l, err := s.Acquire(f.ctx, "x", "w1")
	if err != nil || l.Version <= 5 {
		t.Fatalf("acquire of a lease expired beyond the margin: %+v, %v", l, err)
	}
}

func TestAcquireUnusableItemIsGivenBack(t *testing.T) {
	f := newFixture(t)
	s := f.store(nil, 0)
	for id, url := range map[string]string{"nohost": "ws:///streams/x", "http": "http://up.example/x", "huge": "wss://h/" + strings.Repeat("a", 3000)} {
		it := codec.EncodeConnection(started(id))
		it[schema.AttrWSURL] = codec.S(url)
		f.putRaw(it)
		_, err := s.Acquire(f.ctx, id, "w1")
		if !errors.Is(err, lease.ErrInvalid) || !strings.Contains(err.Error(), "ws_url") {
			t.Fatalf("%s: Acquire = %v, want ErrInvalid naming ws_url", id, err)
		}
		got, _ := codec.DecodeConnection(f.raw(id))
		if got.Owned() || got.Status != "invalid" || !strings.Contains(got.StatusError, "ws_url") {
			t.Errorf("%s: item after refused acquire %+v; want unowned with the reason in status", id, got)
		}
	}
}

func TestClockSkewWithinMarginCannotTakeLiveLease(t *testing.T) {
	f := newFixture(t)
	owner := f.store(nil, 0)
	f.put(started("k"))
	l, err := owner.Acquire(f.ctx, "k", "w1")
	if err != nil {
		t.Fatal(err)
	}
	untilExpiry := time.Duration(l.ExpiresAtMs-nowMs()) * time.Millisecond
	// The owner's lease is live for about 10 s. A worker whose clock runs ahead puts
	// the expiry in its past, but by less than the 2 s margin: it must not take over.
	ahead := f.store(nil, untilExpiry+1500*time.Millisecond)
	if _, err := ahead.Acquire(f.ctx, "k", "w2"); !errors.Is(err, lease.ErrHeld) {
		t.Fatalf("acquire with a clock %s ahead: %v, want ErrHeld", untilExpiry+1500*time.Millisecond, err)
	}
	if err := ahead.ReleaseExpired(f.ctx, "k", "w1", l.Version, time.Now().Add(untilExpiry+1500*time.Millisecond)); !errors.Is(err, lease.ErrHeld) {
		t.Fatalf("sweep with a clock ahead: %v, want ErrHeld", err)
	}
	if _, err := owner.Renew(f.ctx, l, lease.Progress{LastSeq: 1}); err != nil {
		t.Fatalf("the owner lost its lease to a skewed clock: %v", err)
	}
}

// TestAcquireRace: 8 workers compete for 50 items over 20 rounds; every round each
// item must have exactly one winner, and every loser must see ErrHeld.
func TestAcquireRace(t *testing.T) {
	f := newFixture(t)
	s := f.store(nil, 0)
	const workers, items, rounds = 8, 50, 20
	for i := range items {
		f.put(started(fmt.Sprint("i", i)))
	}
	last := map[string]int64{}
	for round := range rounds {
		var mu sync.Mutex
		winners := map[string][]lease.Lease{}
		var wg sync.WaitGroup
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				order := rand.Perm(items)
				for _, i := range order {
					id := fmt.Sprint("i", i)
					l, err := s.Acquire(f.ctx, id, fmt.Sprint("w", w))
					switch {
					case err == nil:
						mu.Lock()
						winners[id] = append(winners[id], l)
						mu.Unlock()
					case !errors.Is(err, lease.ErrHeld):
						t.Errorf("round %d: %s: %v", round, id, err)
					}
				}
			}()
		}
		wg.Wait()
		for i := range items {
			id := fmt.Sprint("i", i)
			ws := winners[id]
			if len(ws) != 1 {
				t.Fatalf("round %d: %s had %d winners: %+v", round, id, len(ws), ws)
			}
			if ws[0].Version <= last[id] {
				t.Fatalf("round %d: %s version %d, not above the previous %d", round, id, ws[0].Version, last[id])
			}
			last[id] = ws[0].Version
			if err := s.Release(f.ctx, ws[0], lease.Progress{LastSeq: int64(round)}); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// A bad per-connection spec is an unusable item like a bad ws_url: given back at
// once, with status_error naming the attribute; a good one comes with the lease.
func TestAcquireBadSpecIsGivenBack(t *testing.T) {
	f := newFixture(t)
	s := f.store(nil, 0)
	it := codec.EncodeConnection(started("badspec"))
	it[schema.AttrKeepalive] = &types.AttributeValueMemberM{Value: codec.Item{schema.FieldMessage: codec.S("ping")}}
	f.putRaw(it)
	_, err := s.Acquire(f.ctx, "badspec", "w1")
	if !errors.Is(err, lease.ErrInvalid) || !strings.Contains(err.Error(), "keepalive: interval") {
		t.Fatalf("Acquire = %v, want ErrInvalid naming keepalive's interval", err)
	}
	got, _ := codec.DecodeConnection(f.raw("badspec"))
	if got.Owned() || got.Status != "invalid" || !strings.Contains(got.StatusError, "keepalive: interval") {
		t.Errorf("item after refused acquire %+v; want unowned with the reason in status", got)
	}

	good := started("goodspec")
	good.Spec = schema.Spec{Subprotocols: []string{"v2"}, Start: schema.StartEarliest}
	f.put(good)
	l, err := s.Acquire(f.ctx, "goodspec", "w1")
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Spec.Subprotocols) != 1 || l.Spec.Start != schema.StartEarliest {
		t.Fatalf("lease spec %+v", l.Spec)
	}
}

// An acquire no stream record drove (the start-up pass) takes a free lease only once
// it has carried the reconciler's unheld mark since the given time: a stale released
// image written back over a live holder's lease carries none (every acquire removes
// it), and its holder takes the lease back before a mark can age.
func TestAcquireUnheldNeedsAnOldMark(t *testing.T) {
	f := newFixture(t)
	s := f.store(nil, 0)
	now := nowMs()
	for _, c := range []struct {
		id   string
		mark types.AttributeValue // nil: none
		ok   bool
	}{
		{"unmarked", nil, false},
		{"young", codec.N(now), false},
		{"old", codec.N(now - 10_000), true},
		{"string", codec.S("1"), false},
		{"zero", codec.N(0), false},
	} {
		it := codec.EncodeConnection(started(c.id))
		if c.mark != nil {
			it[schema.AttrUnheldSince] = c.mark
		}
		f.putRaw(it)
		l, err := s.AcquireUnheld(f.ctx, c.id, "w1", now-5_000)
		if c.ok {
			if err != nil || l.Owner != "w1" {
				t.Errorf("%s: %+v, %v", c.id, l, err)
			}
			if f.raw(c.id)[schema.AttrUnheldSince] != nil {
				t.Errorf("%s: the mark survived the acquire", c.id)
			}
			continue
		}
		if !errors.Is(err, lease.ErrHeld) || !strings.Contains(err.Error(), schema.AttrUnheldSince) {
			t.Errorf("%s: %+v, %v; want ErrHeld naming the mark", c.id, l, err)
		}
		if f.get(c.id).Owned() {
			t.Errorf("%s: acquired without an old enough mark", c.id)
		}
	}
	if _, err := s.AcquireUnheld(f.ctx, "old", "w1", 0); !errors.Is(err, lease.ErrInvalid) {
		t.Errorf("since 0: %v, want ErrInvalid", err)
	}
}

// A stale released image brings back the old mark it was saved with; MarkUnheld
// restarts it, so the start-up pass cannot take the lease before the displaced
// holder's next write. It touches only an unowned item at exactly that version.
func TestMarkUnheldRestartsAStaleMark(t *testing.T) {
	f := newFixture(t)
	s := f.store(nil, 0)
	now := nowMs()
	c := started("stale")
	c.LeaseVersion = 3
	it := codec.EncodeConnection(c)
	it[schema.AttrUnheldSince] = codec.N(now - 60_000)
	f.putRaw(it)
	if err := s.MarkUnheld(f.ctx, "stale", 3, time.UnixMilli(now)); err != nil {
		t.Fatal(err)
	}
	if m, err := codec.Int(f.raw("stale"), schema.AttrUnheldSince); err != nil || m != now {
		t.Fatalf("mark %d, %v: want %d", m, err, now)
	}
	if _, err := s.AcquireUnheld(f.ctx, "stale", "w1", now-5_000); !errors.Is(err, lease.ErrHeld) {
		t.Fatalf("start-up acquire over a restarted mark: %v, want ErrHeld", err)
	}
	if err := s.MarkUnheld(f.ctx, "stale", 2, time.UnixMilli(now)); !errors.Is(err, lease.ErrLost) {
		t.Errorf("another version: %v, want ErrLost", err)
	}
	owned := started("owned")
	owned.LeaseOwner, owned.LeaseVersion, owned.LeaseExpiresAtMs = "w1", 3, schema.LeaseHeldByMember
	f.putRaw(codec.EncodeConnection(owned))
	if err := s.MarkUnheld(f.ctx, "owned", 3, time.UnixMilli(now)); !errors.Is(err, lease.ErrLost) {
		t.Errorf("an owned item: %v, want ErrLost", err)
	}
}
