package owner

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sockfleet/sockfleet/shared/lease"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/shared/wakeup"
	"github.com/sockfleet/sockfleet/worker/internal/peer"
)

// TestEndedVersionsBounded drives many ended sessions over hours: the record of
// versions that ended here (which refuses a late commit or a standby's adopt of a
// version this worker already let go) keeps each one as long as such a call can
// still arrive, and no longer, so it does not grow with every connection ever held.
func TestEndedVersionsBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, 10)
		ho := withHandoffs(t, r)
		const n = 2000
		for i := range n {
			r.m.drop(&owned{lease: lease.Lease{ID: fmt.Sprintf("c%d", i), Version: 7}})
			time.Sleep(5 * time.Second)
		}
		// Just ended: still refused.
		last := fmt.Sprintf("c%d", n-1)
		if resp := r.m.adopt(context.Background(), last, 7, 0, 0, "test", false); !strings.Contains(resp.Detail, "already ended here") {
			t.Errorf("adopt of a version that just ended here: %+v, want refused as ended", resp)
		}
		keep := ho.keepEnded()
		if max := int(keep*3/2/(5*time.Second)) + 2; len(ho.ended) > max {
			t.Errorf("%d ended versions remembered after %d sessions over %s; want at most %d (those of the last %s and a half)",
				len(ho.ended), n, n*5*time.Second, max, keep)
		}
	})
}

type nopPeer struct{}

func (nopPeer) Send(context.Context, string, peer.Request) (peer.Response, error) {
	return peer.Response{}, fmt.Errorf("unexpected peer call")
}

// nopHandoffStore: any call but Get panics (the nil interface); Get reads an item
// released by its old owner.
type nopHandoffStore struct{ HandoffStore }

func (nopHandoffStore) Get(_ context.Context, id string) (codec.Connection, error) {
	c := started(id)
	c.LeaseOwner, c.LeaseVersion, c.Status = "w0", 4, "released"
	return c, nil
}

// withHandoffs turns planned handoffs on in r's manager, with strict fakes.
func withHandoffs(t *testing.T, r *rig) *handoffs {
	ho, err := newHandoffs(&HandoffConfig{
		Peer: nopPeer{}, Store: nopHandoffStore{},
		Workers:    func(context.Context) ([]codec.Worker, error) { return nil, nil },
		NewStandby: func(lease.Lease, func() bool, func(error)) (Stream, *peer.Gate) { return nil, nil },
		Resumable:  func(lease.Lease) error { return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	r.m.ho = ho
	return ho
}

// TestStandbyDoesNotConsumeNeedsOwner: a worker that only stands by for a handoff
// of a connection (it does not own it) must not answer a needs-owner wakeup for it
// with an answer the reconciler takes as final (already_owned): the old owner
// released it, so if the standby then ends, nobody would take it until the sweep.
// It answers one the reconciler offers to the next worker instead.
func TestStandbyDoesNotConsumeNeedsOwner(t *testing.T) {
	r := newRig(t, 10)
	ho := withHandoffs(t, r)
	r.m.mu.Lock()
	ho.standby["c1"] = &standby{id: "c1", from: "w0", version: 4}
	r.m.mu.Unlock()
	got := r.wake(t, wakeup.Conn{ID: "c1", LeaseVersion: 4, Reason: wakeup.NeedsOwner})
	switch got {
	case wakeup.Acquired, wakeup.AlreadyOwned, wakeup.LostRace, wakeup.Stale, wakeup.NotStartable:
		t.Errorf("needs-owner wakeup to a standby answered %q, which the reconciler takes as final", got)
	}
}
