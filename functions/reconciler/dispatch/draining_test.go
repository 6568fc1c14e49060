package dispatch

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sockfleet/sockfleet/functions/reconciler/records"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/shared/wakeup"
)

// TestDeliverCheckToADrainingOwner: a draining worker answers every wakeup 503 with
// a per-id "draining" (worker/internal/server). For an owner-must-act check that is
// final — the drain ends each session it holds (a handoff of a STOPPED or deleted
// item is refused, so it releases) — so the record must not fail the batch and be
// retried until the drain is over; a needs-owner id still goes to the next worker.
func TestDeliverCheckToADrainingOwner(t *testing.T) {
	secret := []byte("test-secret")
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req wakeup.Request
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			t.Errorf("decode: %v", err)
		}
		calls.Add(1)
		resp := wakeup.Response{V: wakeup.Version}
		for _, c := range req.Conns {
			resp.Results = append(resp.Results, wakeup.ConnResult{ID: c.ID, Result: wakeup.Draining})
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_ = json.NewEncoder(w).Encode(resp)
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	owner := codec.Worker{ID: "w1", Addr: addr, Capacity: 10, Load: 3, HeartbeatExpiresAtMs: now.Add(60e9).UnixMilli()}
	ds := []records.Decision{
		{Action: records.OwnerMustAct, ID: "stopped", Owner: "w1", LeaseVersion: 7},
		{Action: records.NeedsOwner, ID: "new", LeaseVersion: 0},
	}
	d := &Delivery{Sender: &wakeup.Client{Secret: secret}}
	out := d.Deliver(context.Background(), []codec.Worker{owner}, now, ds)
	if o := out["stopped"]; !o.Done || o.Result != wakeup.Draining {
		t.Errorf("check answered draining: %+v, want done (the drain releases it)", o)
	}
	if o := out["new"]; o.Done {
		t.Errorf("needs-owner id answered draining by the only worker: %+v, want not done", o)
	}
	if calls.Load() == 0 {
		t.Error("no wakeup reached the owner")
	}
}
