package lease_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/lease"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

// statusOf returns the raw status_error and last_repair of id.
func (f *fixture) notes(id string) (statusErr, lastRepair string) {
	f.t.Helper()
	it := f.raw(id)
	if v, ok := it[schema.AttrStatusError].(*types.AttributeValueMemberS); ok {
		statusErr = v.Value
	}
	if v, ok := it[schema.AttrLastRepair].(*types.AttributeValueMemberS); ok {
		lastRepair = v.Value
	}
	return statusErr, lastRepair
}

// Versions come from a hybrid logical clock: at least the wall clock in ms, at least
// the stored version + 1, so a stale image that rolls the version back cannot make an
// acquire hand out a version twice.
func TestVersionsNeverRepeat(t *testing.T) {
	f := newFixture(t)
	s := f.store(nil, 0)

	t.Run("stored version ahead of the clock", func(t *testing.T) {
		c := started("ahead")
		c.LeaseVersion = nowMs() + 3_600_000
		f.put(c)
		l, err := s.Acquire(f.ctx, "ahead", "w1")
		if err != nil || l.Version != c.LeaseVersion+1 {
			t.Fatalf("acquire: %+v, %v; want version %d", l, err, c.LeaseVersion+1)
		}
	})

	t.Run("stale image rolls the version back", func(t *testing.T) {
		f.put(started("roll"))
		l0, err := s.Acquire(f.ctx, "roll", "w0")
		if err != nil {
			t.Fatal(err)
		}
		image := f.raw("roll") // what a console user has open: w0 at l0's version
		if err := s.Release(f.ctx, l0, lease.Progress{LastSeq: 8}); err != nil {
			t.Fatal(err)
		}
		l1, err := s.Acquire(f.ctx, "roll", "w1")
		if err != nil || l1.Version <= l0.Version {
			t.Fatalf("second acquire %+v, %v", l1, err)
		}
		if err := s.Release(f.ctx, l1, lease.Progress{LastSeq: 9}); err != nil {
			t.Fatal(err)
		}
		// The old image is written back, with its lease released as an operator
		// trying to "unstick" it would.
		image[schema.AttrLeaseExpires] = codec.N(0)
		delete(image, schema.AttrLeaseOwner)
		f.putRaw(image)
		seen := map[int64]bool{l0.Version: true, l1.Version: true}
		for _, w := range []string{"w2", "w3"} {
			l, err := s.Acquire(f.ctx, "roll", w)
			if err != nil {
				t.Fatal(err)
			}
			if seen[l.Version] || l.Version <= l1.Version {
				t.Fatalf("%s got version %d; handed out before: %v", w, l.Version, seen)
			}
			seen[l.Version] = true
			if err := s.Release(f.ctx, l, lease.Progress{}); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// An operator deletes lease_version or writes it as a string: no owner-and-version
// condition can match, which used to strand the connection for good.
func TestUnusableLeaseVersionIsRepaired(t *testing.T) {
	bad := map[string]func(codec.Item){
		"deleted":     func(it codec.Item) { delete(it, schema.AttrLeaseVersion) },
		"string":      func(it codec.Item) { it[schema.AttrLeaseVersion] = codec.S("7") },
		"non-integer": func(it codec.Item) { it[schema.AttrLeaseVersion] = &types.AttributeValueMemberN{Value: "1.5"} },
		"bool":        func(it codec.Item) { it[schema.AttrLeaseVersion] = &types.AttributeValueMemberBOOL{Value: true} },
	}
	for name, edit := range bad {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			s := f.store(nil, 0)
			edited := func(id string) {
				it := f.raw(id)
				edit(it)
				f.putRaw(it)
			}

			// The holder's next write restores its version instead of stopping on ErrLost.
			f.put(started("held"))
			l, err := s.Acquire(f.ctx, "held", "w1")
			if err != nil {
				t.Fatal(err)
			}
			edited("held")
			if _, err := s.Renew(f.ctx, l, lease.Progress{LastSeq: 11}); err != nil {
				t.Fatalf("renew after the edit: %v", err)
			}
			if c := f.get("held"); c.LeaseOwner != "w1" || c.LeaseVersion != l.Version || c.LastSeq != 11 {
				t.Fatalf("after renew: %+v", c)
			}
			if se, lr := f.notes("held"); !strings.Contains(se, "lease_version") || !strings.Contains(lr, "restored") {
				t.Errorf("status_error %q, last_repair %q: want the field named and the repair said", se, lr)
			}

			// Acquire of a free item whose version is unusable replaces it.
			f.put(started("free"))
			if name != "deleted" {
				edited("free")
			}
			la, err := s.Acquire(f.ctx, "free", "w2")
			if err != nil || la.Version < nowMs()-60_000 {
				t.Fatalf("acquire: %+v, %v", la, err)
			}
			if se, _ := f.notes("free"); name != "deleted" && !strings.Contains(se, "lease_version") {
				t.Errorf("status_error %q does not name lease_version", se)
			}

			// The sweep's release of an expired lease (it read version 0 from the decode).
			c := started("expired")
			c.LeaseOwner, c.LeaseExpiresAtMs, c.LeaseVersion = "dead", nowMs()-5_000, 3
			f.put(c)
			edited("expired")
			if err := s.ReleaseExpired(f.ctx, "expired", "dead", 0, time.Now()); err != nil {
				t.Fatalf("release expired: %v", err)
			}
			got := f.get("expired")
			if got.Owned() || got.Status != "expired" || got.LeaseVersion <= 3 {
				t.Fatalf("after release expired: %+v", got)
			}
			// A sweep that read the item before the repair is refused, as for any change
			// since its scan (the sweep ignores ErrLost).
			if err := s.ReleaseExpired(f.ctx, "expired", "dead", 0, time.Now()); !errors.Is(err, lease.ErrLost) {
				t.Errorf("second release expired: %v, want ErrLost", err)
			}

			// The crash path.
			c = started("crashed")
			c.LeaseOwner, c.LeaseExpiresAtMs, c.LeaseVersion = "gone", nowMs()+60_000, 4
			f.put(c)
			edited("crashed")
			ids, err := s.ReleaseAllOwnedBy(f.ctx, "gone")
			if err != nil || len(ids) != 1 {
				t.Fatalf("release all: %v, %v", ids, err)
			}
			if got := f.get("crashed"); got.Owned() || got.Status != "owner stopped" || got.LeaseVersion == 0 {
				t.Fatalf("after release all: %+v", got)
			}
			if se, _ := f.notes("crashed"); !strings.Contains(se, "lease_version") {
				t.Errorf("status_error %q does not name lease_version", se)
			}
			// And the next acquire still works.
			if _, err := s.Acquire(f.ctx, "crashed", "w3"); err != nil {
				t.Fatalf("acquire after the repair: %v", err)
			}
		})
	}
}

// The scenario: w0 held at v1, w1 took it at v2, then a console edit wrote the
// old image back (owner w0, version 1, old expiry). w1 must not stop on ErrLost and
// leave "streaming" on an item nobody streams: the rollback is no acquire's doing, the
// stale lease is expired, so w1 takes its lease back on its next write.
func TestStaleImageIsReclaimedByTheHolder(t *testing.T) {
	f := newFixture(t)
	s := f.store(nil, 0)
	f.put(started("s"))
	l0, _ := s.Acquire(f.ctx, "s", "w0")
	if _, err := s.Renew(f.ctx, l0, lease.Progress{LastSeq: 3, Status: "streaming"}); err != nil {
		t.Fatal(err)
	}
	image := f.raw("s")
	image[schema.AttrLeaseExpires] = codec.N(nowMs() - 30_000) // the console image is old
	if err := s.Release(f.ctx, l0, lease.Progress{LastSeq: 5}); err != nil {
		t.Fatal(err)
	}
	l1, err := s.Acquire(f.ctx, "s", "w1")
	if err != nil {
		t.Fatal(err)
	}
	f.putRaw(image)

	c, err := s.Renew(f.ctx, l1, lease.Progress{LastSeq: 6})
	if err != nil {
		t.Fatalf("renew after the stale image: %v", err)
	}
	if c.LeaseOwner != "w1" || c.LeaseVersion != l1.Version || c.LastSeq != 6 {
		t.Fatalf("after renew: %+v", c)
	}
	if _, lr := f.notes("s"); !strings.Contains(lr, "stale image") || !strings.Contains(lr, "w0") {
		t.Errorf("last_repair %q: want the stale image and its owner named", lr)
	}

	// A stale image naming another worker with a lease that still looks live is
	// stale all the same: its version is below the holder's, so its session ended
	// before the holder's acquire. The holder takes it back.
	image2 := f.raw("s")
	image2[schema.AttrLeaseOwner] = codec.S("w9")
	image2[schema.AttrLeaseVersion] = codec.N(l0.Version)
	image2[schema.AttrLeaseExpires] = codec.N(nowMs() + 60_000)
	f.putRaw(image2)
	if c, err := s.Renew(f.ctx, l1, lease.Progress{LastSeq: 7}); err != nil || c.LeaseOwner != "w1" || c.LeaseVersion != l1.Version {
		t.Fatalf("renew under a live-looking stale lease: %+v, %v, want it taken back", c, err)
	}

	// The holder's own version under another owner (lease_owner edited by hand) is
	// taken back too; a higher version is not: that is a real acquire.
	image3 := f.raw("s")
	image3[schema.AttrLeaseOwner] = codec.S("w9")
	f.putRaw(image3)
	if c, err := s.Renew(f.ctx, l1, lease.Progress{LastSeq: 8}); err != nil || c.LeaseOwner != "w1" {
		t.Fatalf("renew under its own version with another owner: %+v, %v, want it taken back", c, err)
	}
	image4 := f.raw("s")
	image4[schema.AttrLeaseOwner] = codec.S("w9")
	image4[schema.AttrLeaseVersion] = codec.N(l1.Version + 1)
	f.putRaw(image4)
	if _, err := s.Renew(f.ctx, l1, lease.Progress{LastSeq: 9}); !errors.Is(err, lease.ErrLost) {
		t.Fatalf("renew under a higher version: %v, want ErrLost", err)
	}
	if c := f.get("s"); c.LeaseOwner != "w9" || c.LastSeq != 8 {
		t.Fatalf("the refused write changed the item: %+v", c)
	}
}

// An undecodable last_seq is reset to 0 only with a status that says so.
func TestUndecodableCheckpointIsResetAndSaid(t *testing.T) {
	f := newFixture(t)
	s := f.store(nil, 0)
	it := codec.EncodeConnection(started("seq"))
	it[schema.AttrLastSeq] = codec.S("12x")
	f.putRaw(it)
	l, err := s.Acquire(f.ctx, "seq", "w1")
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	if l.LastSeq != 0 {
		t.Fatalf("lease resumes from %d, want 0", l.LastSeq)
	}
	c := f.get("seq")
	if c.LastSeq != 0 || c.LeaseOwner != "w1" {
		t.Fatalf("item %+v", c)
	}
	se, lr := f.notes("seq")
	for _, want := range []string{"last_seq", `"12x"`, "reset to 0"} {
		if !strings.Contains(se, want) || !strings.Contains(lr, want) {
			t.Errorf("status_error %q / last_repair %q: want %q", se, lr, want)
		}
	}
}

// Polling mode: an unusable item given back leaves the seed's orphan query for
// InvalidRetry, so the fleet does not take and give it back on every poll.
func TestInvalidItemGivenBackOutOfThePollingQuery(t *testing.T) {
	f := newFixture(t)
	s, err := lease.New(f.env.DB, lease.Config{Table: f.env.Table, Duration: 10 * time.Second, SkewMargin: 2 * time.Second,
		InvalidRetry: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	c := started("bad")
	c.WSURL = "http://up.example/x"
	f.put(c)
	if _, err := s.Acquire(f.ctx, "bad", "w1"); !errors.Is(err, lease.ErrInvalid) {
		t.Fatalf("acquire: %v, want ErrInvalid", err)
	}
	it := f.raw("bad")
	exp, _ := codec.Int(it, schema.AttrLeaseExpires)
	if d := exp - nowMs(); d < 50_000 || d > 61_000 {
		t.Fatalf("lease_expires_at_ms %d ms from now, want about InvalidRetry", d)
	}
	if se, _ := f.notes("bad"); !strings.Contains(se, "ws_url") || !strings.Contains(se, "http://up.example/x") {
		t.Errorf("status_error %q: want the field and the value", se)
	}
	if _, ok := it[schema.AttrLeaseOwner]; ok {
		t.Error("given back with an owner")
	}
}

// The reconciler's writes for operator edits, against the engine.
func TestReportInvalidAndReleaseStale(t *testing.T) {
	f := newFixture(t)
	s := f.store(nil, 0)

	it := codec.EncodeConnection(started("typo"))
	it[schema.AttrDesiredState] = codec.S("started")
	f.putRaw(it)
	const problem = `invalid desired_state "started": want STARTED or STOPPED`
	if err := s.ReportInvalid(f.ctx, "typo", problem); err != nil {
		t.Fatal(err)
	}
	got := f.raw("typo")
	if st, _ := got[schema.AttrStatus].(*types.AttributeValueMemberS); st == nil || st.Value != "invalid" {
		t.Errorf("status %v", got[schema.AttrStatus])
	}
	if se, _ := f.notes("typo"); se != problem {
		t.Errorf("status_error %q", se)
	}
	at, _ := codec.Int(got, schema.AttrStatusAt)
	// Said already: no second write (status_at_ms stays), so its record is not news.
	time.Sleep(5 * time.Millisecond)
	if err := s.ReportInvalid(f.ctx, "typo", problem); err != nil {
		t.Fatal(err)
	}
	if at2, _ := codec.Int(f.raw("typo"), schema.AttrStatusAt); at2 != at {
		t.Errorf("a second report rewrote the item (%d → %d)", at, at2)
	}
	// An owned item is its owner's to report.
	f.put(started("owned"))
	l, _ := s.Acquire(f.ctx, "owned", "w1")
	if err := s.ReportInvalid(f.ctx, "owned", problem); err != nil {
		t.Fatal(err)
	}
	if se, _ := f.notes("owned"); se != "" {
		t.Errorf("owned item got status_error %q", se)
	}
	if err := s.ReportInvalid(f.ctx, "owned", ""); !errors.Is(err, lease.ErrInvalid) {
		t.Errorf("empty problem: %v", err)
	}

	// A stale lease of w0 at a version below the holder's: released, version above both.
	c := started("stale")
	c.LeaseOwner, c.LeaseExpiresAtMs, c.LeaseVersion = "w0", nowMs()+60_000, 3
	f.put(c)
	if err := s.ReleaseStale(f.ctx, "stale", "w0", 4, l.Version); !errors.Is(err, lease.ErrLost) {
		t.Fatalf("release of a lease the record did not show: %v, want ErrLost", err)
	}
	if err := s.ReleaseStale(f.ctx, "stale", "w0", 3, l.Version); err != nil {
		t.Fatal(err)
	}
	after := f.get("stale")
	if after.Owned() || after.LeaseVersion <= l.Version || after.Status != "repaired" || !strings.Contains(after.StatusError, "stale image") {
		t.Fatalf("after release stale: %+v", after)
	}
	next, err := s.Acquire(f.ctx, "stale", "w2")
	if err != nil || next.Version <= after.LeaseVersion {
		t.Fatalf("acquire after the repair: %+v, %v", next, err)
	}
}

// counting passes calls to the engine and counts the writes.
type counting struct {
	lease.DynamoDB
	updates int
}

func (c *counting) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, o ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	c.updates++
	return c.DynamoDB.UpdateItem(ctx, in, o...)
}

// The clock-floor version costs nothing in the common case: one write per acquire, as
// before; a second write only when the stored version is at or above the floor, or
// unusable.
func TestAcquireWrites(t *testing.T) {
	f := newFixture(t)
	db := &counting{DynamoDB: f.env.DB}
	s := f.store(db, 0)
	ahead := started("ahead")
	ahead.LeaseVersion = nowMs() + 3_600_000
	bad := codec.EncodeConnection(started("bad"))
	bad[schema.AttrLeaseVersion] = codec.S("x")
	f.put(started("fresh"))
	f.put(ahead)
	f.putRaw(bad)
	for id, want := range map[string]int{"fresh": 1, "ahead": 2, "bad": 2} {
		db.updates = 0
		if _, err := s.Acquire(f.ctx, id, "w1"); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		if db.updates != want {
			t.Errorf("%s: %d writes, want %d", id, db.updates, want)
		}
	}
}

// Fencing versions after a rollback, with clocks that disagree by up to the skew
// margin (2 s here). Worker A's clock runs 1 s ahead, B's 1 s behind. A acquires
// (version ≈ its clock), releases, and a stale image rolls the item back to an
// older version. Then:
//   - B acquiring more than the margin after A's version was issued gets a version
//     above it from its clock alone, whatever the item shows;
//   - B acquiring at once would get one below it from its clock (the residual the
//     package doc states); given the version the reconciler saw issued (the stream
//     record's old image, carried by its wakeup) as a floor, it gets one above.
func TestVersionsIncreaseUnderClockLag(t *testing.T) {
	f := newFixture(t)
	a := f.store(nil, time.Second)
	b := f.store(nil, -time.Second)
	rollback := func(t *testing.T, id string) lease.Lease {
		t.Helper()
		f.put(started(id))
		old, err := a.Acquire(f.ctx, id, "wa")
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Release(f.ctx, old, lease.Progress{}); err != nil {
			t.Fatal(err)
		}
		image := f.raw(id)
		la, err := a.Acquire(f.ctx, id, "wa")
		if err != nil || la.Version <= old.Version {
			t.Fatalf("second acquire by A: %+v, %v", la, err)
		}
		if err := a.Release(f.ctx, la, lease.Progress{}); err != nil {
			t.Fatal(err)
		}
		f.putRaw(image) // the console's stale save: back to old's version, released
		return la
	}

	t.Run("beyond the margin: the clock alone", func(t *testing.T) {
		la := rollback(t, "late")
		time.Sleep(2*time.Second + 100*time.Millisecond) // past A's issue by more than the margin
		lb, err := b.Acquire(f.ctx, "late", "wb")
		if err != nil || lb.Version <= la.Version {
			t.Fatalf("B's acquire after the margin: %+v, %v; want a version above A's %d", lb, err, la.Version)
		}
	})

	t.Run("within the margin: the wakeup's floor", func(t *testing.T) {
		la := rollback(t, "soon")
		if lb, err := b.Acquire(f.ctx, "soon", "wb"); err != nil {
			t.Fatal(err)
		} else if lb.Version > la.Version {
			t.Logf("B's clock alone gave %d above A's %d (slow machine); the floor is still checked", lb.Version, la.Version)
		} else if err := b.Release(f.ctx, lb, lease.Progress{}); err != nil {
			t.Fatal(err)
		}
		la2 := rollback(t, "soon2")
		lb, err := b.AcquireAbove(f.ctx, "soon2", "wb", la2.Version)
		if err != nil || lb.Version <= la2.Version {
			t.Fatalf("B's acquire above %d: %+v, %v", la2.Version, lb, err)
		}
		if _, err := b.AcquireAbove(f.ctx, "soon2", "wb", -1); !errors.Is(err, lease.ErrInvalid) {
			t.Fatalf("negative floor: %v, want ErrInvalid", err)
		}
	})
}
