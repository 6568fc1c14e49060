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
	"github.com/sockfleet/sockfleet/worker/internal/peer"
)

// TestEndedVersionsBounded drives many ended sessions over hours: the record of
// versions that ended here (which refuses a late commit or a standby's adopt of a
// version this worker already let go) keeps each one as long as such a call can
// still arrive, and no longer, so it does not grow with every connection ever held.
func TestEndedVersionsBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, 10)
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
		const n = 2000
		for i := range n {
			r.m.drop(&owned{lease: lease.Lease{ID: fmt.Sprintf("c%d", i), Version: 7}})
			time.Sleep(5 * time.Second)
		}
		// Just ended: still refused.
		last := fmt.Sprintf("c%d", n-1)
		if resp := r.m.adopt(context.Background(), last, 7, 0, 0, "test"); !strings.Contains(resp.Detail, "already ended here") {
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

type nopHandoffStore struct{ HandoffStore }
