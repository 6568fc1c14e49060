package server

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sockfleet/sockfleet/shared/wakeup"
	"github.com/sockfleet/sockfleet/worker/internal/peer"
)

type fakeHandoffs struct {
	mu    sync.Mutex
	calls []peer.Request
}

func (f *fakeHandoffs) Handoff(_ context.Context, r peer.Request) peer.Response {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, r)
	return peer.Response{V: 1, Result: peer.Ready}
}

func postTo(h http.Handler, path string, body []byte, ts, sig string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(string(body)))
	if ts != "" {
		req.Header.Set(wakeup.HeaderTimestamp, ts)
		req.Header.Set(wakeup.HeaderSignature, sig)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

const goodHandoff = `{"v":1,"op":"prepare","conn":"c1","from":"w1","to":"w2","version":7,"seq":42,"epoch":0}`

// A handoff call is authenticated as a wakeup is; anything refused reaches nobody.
// It is answered while draining (commits must still be heard).
func TestHandoffEndpoint(t *testing.T) {
	f := &fakeHandoffs{}
	o := &fakeOwner{draining: true}
	h := (&Server{Secret: secret, Owner: o, Handoffs: f}).Handler()
	now := time.Now()
	ts := wakeup.Timestamp(now)
	body := []byte(goodHandoff)
	sig := wakeup.Sign(secret, ts, body)
	if rec := postTo(h, peer.Path, body, ts, sig); rec.Code != 200 {
		t.Fatalf("good call: %d %s", rec.Code, rec.Body)
	} else {
		var resp peer.Response
		if err := json.Unmarshal(rec.Body.Bytes(), &resp); err != nil || resp.Result != peer.Ready {
			t.Fatalf("reply %s: %v", rec.Body, err)
		}
	}
	old := wakeup.Timestamp(now.Add(-2 * wakeup.Window))
	bad := []byte(strings.Replace(goodHandoff, `"op":"prepare"`, `"op":"steal"`, 1))
	bts := wakeup.Timestamp(now.Add(time.Millisecond))
	for _, tc := range []struct {
		name    string
		body    []byte
		ts, sig string
		code    int
	}{
		{"replayed", body, ts, sig, 401},
		{"unsigned", body, "", "", 401},
		{"wrong secret", body, ts, wakeup.Sign([]byte("another-secret-0123456"), ts, body), 401},
		{"stale", body, old, wakeup.Sign(secret, old, body), 401},
		{"malformed", bad, bts, wakeup.Sign(secret, bts, bad), 400},
		{"too large", []byte(strings.Repeat(" ", peer.MaxBody+1)), ts, "v1=00", 413},
	} {
		if rec := postTo(h, peer.Path, tc.body, tc.ts, tc.sig); rec.Code != tc.code {
			t.Errorf("%s: %d, want %d (%s)", tc.name, rec.Code, tc.code, rec.Body)
		}
	}
	if len(f.calls) != 1 {
		t.Fatalf("%d calls reached the owner, want 1", len(f.calls))
	}
	// Without handoffs the path is not served.
	h2 := (&Server{Secret: secret, Owner: o}).Handler()
	if rec := postTo(h2, peer.Path, body, bts, wakeup.Sign(secret, bts, body)); rec.Code != 404 {
		t.Fatalf("handoff path without handoffs: %d", rec.Code)
	}
}
