package lease_test

import (
	"errors"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"maps"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/sockfleet/sockfleet/shared/lease"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

// A transfer hands the lease over in one write: new owner, a version above the old,
// the checkpoint and epoch, moved_at_ms, a status naming the old owner; the old owner
// can write nothing after it, the new one can.
func TestTransfer(t *testing.T) {
	f := newFixture(t)
	s := f.memberStore()
	f.put(codec.Connection{ID: "c1", DesiredState: schema.Started, WSURL: "ws://h/c1"})
	l, err := s.Acquire(f.ctx, "c1", "w1")
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now().UnixMilli()
	nl, err := s.Transfer(f.ctx, l, "w2", lease.Progress{LastSeq: 42, Epoch: 3}, true)
	if err != nil {
		t.Fatal(err)
	}
	c := f.get("c1")
	switch {
	case nl.Owner != "w2" || nl.Version <= l.Version || nl.LastSeq != 42 || nl.WSURL != "ws://h/c1":
		t.Fatalf("transfer returned %+v (old %+v)", nl, l)
	case c.LeaseOwner != "w2" || c.LeaseVersion != nl.Version || c.LastSeq != 42 || c.Epoch != 3:
		t.Fatalf("stored %+v, returned %+v", c, nl)
	case c.LeaseExpiresAtMs != schema.LeaseHeldByMember:
		t.Fatalf("expiry %d: a transferred lease lasts as long as its new owner's membership", c.LeaseExpiresAtMs)
	case c.MovedAtMs < before || c.MovedAtMs > time.Now().UnixMilli():
		t.Fatalf("moved_at_ms %d, want the transfer's time (after %d)", c.MovedAtMs, before)
	case c.Status != lease.StatusHandedOff || c.StatusError != "handed off from w1 (version "+itoa(l.Version)+")":
		t.Fatalf("status %q, %q", c.Status, c.StatusError)
	}
	if _, err := s.Checkpoint(f.ctx, l, lease.Progress{LastSeq: 50}); !errors.Is(err, lease.ErrLost) {
		t.Fatalf("old owner's checkpoint after the transfer: %v, want ErrLost", err)
	}
	if err := s.Release(f.ctx, l, lease.Progress{LastSeq: 50}); !errors.Is(err, lease.ErrLost) {
		t.Fatalf("old owner's release after the transfer: %v, want ErrLost", err)
	}
	if _, err := s.Checkpoint(f.ctx, nl, lease.Progress{LastSeq: 43}); err != nil {
		t.Fatalf("new owner's checkpoint: %v", err)
	}
	// A second transfer back gets a higher version again.
	back, err := s.Transfer(f.ctx, nl, "w1", lease.Progress{LastSeq: 43}, true)
	if err != nil || back.Version <= nl.Version {
		t.Fatalf("transfer back: %+v %v", back, err)
	}
}

// A forced move (a drain) does not start the cooling period: moved_at_ms keeps the
// last rebalance move's time, so rounds may even out what a drain left uneven.
func TestTransferForcedKeepsMovedAt(t *testing.T) {
	f := newFixture(t)
	s := f.memberStore()
	f.put(codec.Connection{ID: "c1", DesiredState: schema.Started, WSURL: "ws://h/c1"})
	l, err := s.Acquire(f.ctx, "c1", "w1")
	if err != nil {
		t.Fatal(err)
	}
	nl, err := s.Transfer(f.ctx, l, "w2", lease.Progress{LastSeq: 4}, false)
	if err != nil {
		t.Fatal(err)
	}
	if c := f.get("c1"); c.LeaseOwner != "w2" || c.MovedAtMs != 0 {
		t.Fatalf("after a forced transfer: owner %q, moved_at_ms %d, want w2 and never moved", c.LeaseOwner, c.MovedAtMs)
	}
	nl, err = s.Transfer(f.ctx, nl, "w3", lease.Progress{LastSeq: 5}, true)
	if err != nil {
		t.Fatal(err)
	}
	moved := f.get("c1").MovedAtMs
	if moved == 0 {
		t.Fatal("a rebalance transfer wrote no moved_at_ms")
	}
	if _, err := s.Transfer(f.ctx, nl, "w1", lease.Progress{LastSeq: 6}, false); err != nil {
		t.Fatal(err)
	}
	if c := f.get("c1"); c.LeaseOwner != "w1" || c.MovedAtMs != moved {
		t.Fatalf("after a forced transfer: owner %q, moved_at_ms %d, want w1 and %d kept", c.LeaseOwner, c.MovedAtMs, moved)
	}
}

// Refusals write nothing: a wrong owner or version is ErrLost, a stopped or deleted
// connection is ErrNotStarted or ErrNotFound, bad arguments are ErrInvalid.
func TestTransferRefusals(t *testing.T) {
	f := newFixture(t)
	s := f.memberStore()
	f.put(codec.Connection{ID: "c1", DesiredState: schema.Started, WSURL: "ws://h/c1"})
	l, err := s.Acquire(f.ctx, "c1", "w1")
	if err != nil {
		t.Fatal(err)
	}
	orig := f.raw("c1")
	wrongOwner, wrongVersion := l, l
	// Versions never repeat: another worker's lease has another version.
	wrongOwner.Owner, wrongOwner.Version, wrongVersion.Version = "w3", l.Version-2, l.Version-1
	cases := []struct {
		name string
		l    lease.Lease
		to   string
		want error
	}{
		{"wrong owner", wrongOwner, "w2", lease.ErrLost},
		{"wrong version", wrongVersion, "w2", lease.ErrLost},
		{"to itself", l, "w1", lease.ErrInvalid},
		{"bad target id", l, "", lease.ErrInvalid},
		{"bad connection id", lease.Lease{ID: "bad id", Owner: "w1", Version: l.Version}, "w2", lease.ErrInvalid},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := s.Transfer(f.ctx, tc.l, tc.to, lease.Progress{LastSeq: 9}, true); !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if got := f.raw("c1"); !equalItems(got, orig) {
				t.Fatalf("item changed by a refused transfer:\n%v\n%v", orig, got)
			}
		})
	}
	f.put(codec.Connection{ID: "c2", DesiredState: schema.Started, WSURL: "ws://h/c2"})
	l2, err := s.Acquire(f.ctx, "c2", "w1")
	if err != nil {
		t.Fatal(err)
	}
	f.putRaw(withAttr(f.raw("c2"), schema.AttrDesiredState, codec.S(string(schema.Stopped))))
	if _, err := s.Transfer(f.ctx, l2, "w2", lease.Progress{LastSeq: 9}, true); !errors.Is(err, lease.ErrNotStarted) {
		t.Fatalf("transfer of a stopped connection: %v, want ErrNotStarted", err)
	}
	if c := f.get("c2"); c.LeaseOwner != "w1" || c.LeaseVersion != l2.Version {
		t.Fatalf("stopped connection after a refused transfer: %+v", c)
	}
	if err := s.Release(f.ctx, l2, lease.Progress{LastSeq: 9, Status: "stopped"}); err != nil {
		t.Fatalf("the old owner still releases a refused transfer: %v", err)
	}
	f.del("c2")
	if _, err := s.Transfer(f.ctx, l2, "w2", lease.Progress{}, true); !errors.Is(err, lease.ErrNotFound) {
		t.Fatalf("transfer of a deleted connection: %v, want ErrNotFound", err)
	}
}

// A transfer whose response is lost is resolved by reading the item back (or, with
// SDK retries, by recognising the retry's refusal as our own write); one that never
// reached the table is ErrUnavailable and leaves the lease with its owner.
func TestTransferAmbiguousOutcome(t *testing.T) {
	for _, attempts := range []int{1, 3} {
		t.Run(itoa(int64(attempts))+"-attempts", func(t *testing.T) {
			f := newFixture(t)
			d := &dropper{drop: map[string]int{}, fail: map[string]int{}}
			db := f.env.Client(d, func(o *dynamodb.Options) { o.RetryMaxAttempts = attempts })
			s, err := lease.New(db, lease.Config{Table: f.env.Table, SkewMargin: 2 * time.Second, Membership: true})
			if err != nil {
				t.Fatal(err)
			}
			f.put(codec.Connection{ID: "c1", DesiredState: schema.Started, WSURL: "ws://h/c1"})
			l, err := s.Acquire(f.ctx, "c1", "w1")
			if err != nil {
				t.Fatal(err)
			}
			d.drop["UpdateItem"] = 1
			nl, err := s.Transfer(f.ctx, l, "w2", lease.Progress{LastSeq: 7}, true)
			if err != nil {
				t.Fatalf("transfer whose response was dropped: %v", err)
			}
			if c := f.get("c1"); c.LeaseOwner != "w2" || c.LeaseVersion != nl.Version || c.LastSeq != 7 {
				t.Fatalf("item %+v, transfer returned %+v", c, nl)
			}
			// Applied by someone else meanwhile (not ours): the read-back says lost.
			d.drop["UpdateItem"] = 1
			if _, err := s.Transfer(f.ctx, l, "w3", lease.Progress{LastSeq: 8}, true); !errors.Is(err, lease.ErrLost) {
				t.Fatalf("stale transfer with a dropped response: %v, want ErrLost", err)
			}
			// Never applied: unavailable, and the lease is still the owner's.
			d.fail["UpdateItem"] = attempts
			if _, err := s.Transfer(f.ctx, nl, "w1", lease.Progress{LastSeq: 9}, true); !errors.Is(err, lease.ErrUnavailable) {
				t.Fatalf("failed transfer: %v, want ErrUnavailable", err)
			}
			if c := f.get("c1"); c.LeaseOwner != "w2" || c.LeaseVersion != nl.Version || c.LastSeq != 7 {
				t.Fatalf("after a failed transfer: %+v", c)
			}
		})
	}
}

// The repair rules of every owner write hold for a transfer: a lease_version an
// operator deleted on the owner's item is restored and the transfer goes through.
func TestTransferRepairsADeletedVersion(t *testing.T) {
	f := newFixture(t)
	s := f.memberStore()
	f.put(codec.Connection{ID: "c1", DesiredState: schema.Started, WSURL: "ws://h/c1"})
	l, err := s.Acquire(f.ctx, "c1", "w1")
	if err != nil {
		t.Fatal(err)
	}
	it := f.raw("c1")
	delete(it, schema.AttrLeaseVersion)
	f.putRaw(it)
	nl, err := s.Transfer(f.ctx, l, "w2", lease.Progress{LastSeq: 5}, true)
	if err != nil {
		t.Fatalf("transfer after the version was deleted: %v", err)
	}
	if c := f.get("c1"); c.LeaseOwner != "w2" || c.LeaseVersion != nl.Version || nl.Version <= l.Version {
		t.Fatalf("item %+v, returned %+v", c, nl)
	}
	if lr := f.raw("c1")[schema.AttrLastRepair]; lr == nil {
		t.Fatal("repair not recorded in last_repair")
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func equalItems(a, b codec.Item) bool { return reflect.DeepEqual(a, b) }

func withAttr(it codec.Item, name string, v types.AttributeValue) codec.Item {
	it = maps.Clone(it)
	it[name] = v
	return it
}

func (f *fixture) del(id string) {
	f.t.Helper()
	if _, err := f.env.DB.DeleteItem(f.ctx, &dynamodb.DeleteItemInput{TableName: &f.env.Table,
		Key: map[string]types.AttributeValue{schema.AttrPK: codec.S(schema.ConnKey(id))}}); err != nil {
		f.t.Fatal(err)
	}
}
