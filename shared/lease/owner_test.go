package lease_test

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/lease"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

func TestRenew(t *testing.T) {
	f := newFixture(t)
	s := f.store(nil, 0)
	f.put(started("r"))
	l, err := s.Acquire(f.ctx, "r", "w1")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	c, err := s.Renew(f.ctx, l, lease.Progress{LastSeq: 100, Status: "streaming"})
	if err != nil {
		t.Fatal(err)
	}
	if c.LastSeq != 100 || c.LeaseExpiresAtMs <= l.ExpiresAtMs || c.DesiredState != schema.Started || c.Status != "streaming" {
		t.Fatalf("renewed item %+v", c)
	}
	// Renew reports the operator's changes.
	if _, err := f.env.DB.UpdateItem(f.ctx, &dynamodb.UpdateItemInput{TableName: &f.env.Table,
		Key:                       map[string]types.AttributeValue{schema.AttrPK: codec.S("CONN#r")},
		UpdateExpression:          aws.String("SET desired_state = :s, ws_url = :u"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":s": codec.S("STOPPED"), ":u": codec.S("ws://new/x")}}); err != nil {
		t.Fatal(err)
	}
	c, err = s.Renew(f.ctx, l, lease.Progress{LastSeq: 101})
	if err != nil || c.DesiredState != schema.Stopped || c.WSURL != "ws://new/x" || c.LastSeq != 101 || c.Status != "streaming" {
		t.Fatalf("renew after flip: %+v, %v", c, err)
	}
	// Deleted item: not found, and no phantom item.
	if _, err := f.env.DB.DeleteItem(f.ctx, &dynamodb.DeleteItemInput{TableName: &f.env.Table,
		Key: map[string]types.AttributeValue{schema.AttrPK: codec.S("CONN#r")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Renew(f.ctx, l, lease.Progress{LastSeq: 102}); !errors.Is(err, lease.ErrNotFound) {
		t.Fatalf("renew of deleted item: %v, want ErrNotFound", err)
	}
	if err := s.Release(f.ctx, l, lease.Progress{LastSeq: 102}); !errors.Is(err, lease.ErrNotFound) {
		t.Fatalf("release of deleted item: %v, want ErrNotFound", err)
	}
	if f.raw("r") != nil {
		t.Fatal("renew or release re-created a deleted item")
	}
}

func TestRelease(t *testing.T) {
	f := newFixture(t)
	s := f.store(nil, 0)
	f.put(started("r"))
	l, _ := s.Acquire(f.ctx, "r", "w1")
	if err := s.Release(f.ctx, Lease(l, "w2", l.Version-1), lease.Progress{LastSeq: 1}); !errors.Is(err, lease.ErrLost) {
		t.Fatalf("release by another worker: %v", err)
	}
	if err := s.Release(f.ctx, l, lease.Progress{LastSeq: 55}); err != nil {
		t.Fatal(err)
	}
	c := f.get("r")
	if c.Owned() || c.LeaseOwner != "" || c.LeaseExpiresAtMs != 0 || c.LastSeq != 55 || c.LeaseVersion != l.Version || c.Status != "released" {
		t.Fatalf("released item %+v", c)
	}
	// Releasing twice is not an error the caller must handle specially: it is lost.
	if err := s.Release(f.ctx, l, lease.Progress{LastSeq: 56}); !errors.Is(err, lease.ErrLost) {
		t.Fatalf("second release: %v", err)
	}
	if f.get("r").LastSeq != 55 {
		t.Fatal("a refused release moved the checkpoint")
	}
}

func TestFencingAfterTakeover(t *testing.T) {
	f := newFixture(t)
	old := f.store(nil, 0)
	f.put(started("f"))
	l1, err := old.Acquire(f.ctx, "f", "w1")
	if err != nil {
		t.Fatal(err)
	}
	// w2's clock is past w1's expiry plus the margin: a takeover.
	taker := f.store(nil, 13*time.Second)
	l2, err := taker.Acquire(f.ctx, "f", "w2")
	if err != nil || l2.Version <= l1.Version {
		t.Fatalf("takeover: %+v, %v", l2, err)
	}
	before := f.raw("f")
	if _, err := old.Renew(f.ctx, l1, lease.Progress{LastSeq: 8}); !errors.Is(err, lease.ErrLost) {
		t.Errorf("old owner's renew: %v, want ErrLost", err)
	}
	if _, err := old.Renew(f.ctx, l1, lease.Progress{LastSeq: 999, Status: "streaming"}); !errors.Is(err, lease.ErrLost) {
		t.Errorf("old owner's checkpoint: %v, want ErrLost", err)
	}
	if err := old.Release(f.ctx, l1, lease.Progress{LastSeq: 999}); !errors.Is(err, lease.ErrLost) {
		t.Errorf("old owner's release: %v, want ErrLost", err)
	}
	// The same worker id with the old version is fenced too (a restarted w1, say).
	if _, err := old.Renew(f.ctx, Lease(l1, "w2", l1.Version), lease.Progress{LastSeq: 1}); !errors.Is(err, lease.ErrLost) {
		t.Errorf("stale version under the new owner's name: %v, want ErrLost", err)
	}
	if after := f.raw("f"); !reflect.DeepEqual(before, after) {
		t.Fatalf("fenced writes changed the item:\nbefore %v\nafter  %v", before, after)
	}
	if _, err := taker.Renew(f.ctx, l2, lease.Progress{LastSeq: 8}); err != nil {
		t.Fatalf("new owner's renew: %v", err)
	}
}

// The sequence epoch travels with the checkpoint: renews and the release write it,
// and the next acquire returns it, so the next owner labels messages alike.
func TestEpochIsCheckpointed(t *testing.T) {
	f := newFixture(t)
	s := f.store(nil, 0)
	f.put(started("ep"))
	l, err := s.Acquire(f.ctx, "ep", "w1")
	if err != nil {
		t.Fatal(err)
	}
	if c, err := s.Renew(f.ctx, l, lease.Progress{LastSeq: 3, Epoch: 1}); err != nil || c.Epoch != 1 || c.LastSeq != 3 {
		t.Fatalf("renew: %+v, %v", c, err)
	}
	if err := s.Release(f.ctx, l, lease.Progress{LastSeq: 9, Epoch: 2, Status: "seq_reset", Error: "sequence reset", Stop: true}); err != nil {
		t.Fatal(err)
	}
	// A halted stream's release stops the item: nobody takes it up until the operator does.
	if c := f.get("ep"); c.Epoch != 2 || c.LastSeq != 9 || c.Status != "seq_reset" || c.DesiredState != schema.Stopped {
		t.Fatalf("released item %+v", c)
	}
	if _, err := s.Acquire(f.ctx, "ep", "w2"); err == nil {
		t.Fatal("a halted item was acquired")
	}
	f.put(codec.Connection{ID: "ep", DesiredState: schema.Started, WSURL: "wss://up.example/streams/ep", LastSeq: 9, Epoch: 2})
	l, err = s.Acquire(f.ctx, "ep", "w2")
	if err != nil || l.Epoch != 2 || l.LastSeq != 9 {
		t.Fatalf("acquire: %+v, %v", l, err)
	}
}

// Renumber moves a lease to a version above its own, conditioned on owner and
// version: the old version can write nothing after it, and a lease held by another
// is refused.
func TestRenumber(t *testing.T) {
	f := newFixture(t)
	s := f.store(nil, 0)
	f.put(started("rn"))
	l, err := s.Acquire(f.ctx, "rn", "w1")
	if err != nil {
		t.Fatal(err)
	}
	nl, c, err := s.Renumber(f.ctx, l, lease.Progress{LastSeq: 7})
	if err != nil || nl.Version <= l.Version || c.LeaseVersion != nl.Version || c.LastSeq != 7 || nl.WSURL == "" {
		t.Fatalf("renumber: %+v %+v %v", nl, c, err)
	}
	if _, err := s.Checkpoint(f.ctx, l, lease.Progress{LastSeq: 8}); !errors.Is(err, lease.ErrLost) {
		t.Fatalf("checkpoint under the old version: %v, want ErrLost", err)
	}
	if _, _, err := s.Renumber(f.ctx, Lease(l, "w2", l.Version), lease.Progress{}); !errors.Is(err, lease.ErrLost) {
		// (At the holder's own version another owner's write would be a reclaim: versions
		// are unique per connection, so the lease package reads it as a stale image.)
		t.Fatalf("renumber by another worker: %v, want ErrLost", err)
	}
}
