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

	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/wakeup"
)

var secret = []byte("server-test-secret-0123")

// fakeOwner answers every id "acquired" and records what it was asked.
type fakeOwner struct {
	mu       sync.Mutex
	calls    [][]wakeup.Conn
	draining bool
	health   error
}

func (f *fakeOwner) Wake(_ context.Context, conns []wakeup.Conn) []wakeup.ConnResult {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, conns)
	out := make([]wakeup.ConnResult, len(conns))
	for i, c := range conns {
		out[i] = wakeup.ConnResult{ID: c.ID, Result: wakeup.Acquired}
	}
	return out
}

func (f *fakeOwner) Draining() bool { return f.draining }
func (f *fakeOwner) Healthy() error { return f.health }

// Load is one per id it was ever asked about, as if it acquired them all.
func (f *fakeOwner) Load() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		n += len(c)
	}
	return n
}

func (f *fakeOwner) nCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}

func post(h http.Handler, body []byte, ts, sig string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, wakeup.Path, strings.NewReader(string(body)))
	if ts != "" {
		req.Header.Set(wakeup.HeaderTimestamp, ts)
	}
	if sig != "" {
		req.Header.Set(wakeup.HeaderSignature, sig)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func signed(h http.Handler, now time.Time, body []byte) *httptest.ResponseRecorder {
	ts := wakeup.Timestamp(now)
	return post(h, body, ts, wakeup.Sign(secret, ts, body))
}

const good = `{"v":1,"conns":[{"id":"a","lease_version":3,"reason":"needs_owner"},{"id":"b","lease_version":0,"reason":"check"}]}`

func TestWakeupAnswersPerID(t *testing.T) {
	o := &fakeOwner{}
	h := (&Server{Secret: secret, Owner: o}).Handler()
	rec := signed(h, time.Now(), []byte(good))
	if rec.Code != 200 {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	resp, err := wakeup.DecodeResponse(rec.Body.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if resp.V != 1 || len(resp.Results) != 2 || resp.Results[1].ID != "b" {
		t.Fatalf("response %+v", resp)
	}
	// The reply carries the load as it is once the ids were handled.
	if resp.Load == nil || *resp.Load != 2 {
		t.Errorf("reply load %v, want 2", resp.Load)
	}
}

func TestDrainingAnswers503(t *testing.T) {
	o := &fakeOwner{draining: true}
	h := (&Server{Secret: secret, Owner: o}).Handler()
	rec := signed(h, time.Now(), []byte(good))
	var resp wakeup.Response
	_ = json.Unmarshal(rec.Body.Bytes(), &resp)
	if rec.Code != 503 || len(resp.Results) != 2 || resp.Results[0].Result != wakeup.Draining {
		t.Fatalf("status %d body %s", rec.Code, rec.Body)
	}
	if o.nCalls() != 0 {
		t.Fatal("a draining worker handled a wakeup")
	}
	// Authentication still comes first.
	if rec := post(h, []byte(good), wakeup.Timestamp(time.Now()), "v1=00"); rec.Code != 401 {
		t.Fatalf("unsigned request to a draining worker: %d", rec.Code)
	}
}

func TestHealthz(t *testing.T) {
	o := &fakeOwner{}
	h := (&Server{Secret: secret, Owner: o}).Handler()
	get := func() int {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		return rec.Code
	}
	if get() != 200 {
		t.Fatal("healthy owner, unhealthy answer")
	}
	o.health = context.DeadlineExceeded
	if get() != 503 {
		t.Fatal("stalled loop, healthy answer")
	}
}

// FuzzWakeupHandler drives the handler's decoding path with signed bodies: whatever
// the body, the answer is 200, 400 or 413, and only valid requests reach the owner.
func FuzzWakeupHandler(f *testing.F) {
	f.Add([]byte(good))
	f.Add([]byte(`{"v":1,"conns":[]}`))
	f.Add([]byte(`{"v":1,"conns":[{"id":"a#b","lease_version":1,"reason":"check"}]}`))
	f.Add([]byte(`{"v":1,"conns":[{"id":"a","lease_version":-1,"reason":"x"}]} trailing`))
	f.Add([]byte("\xff\x00"))
	now := time.Now()
	f.Fuzz(func(t *testing.T, body []byte) {
		o := &fakeOwner{}
		h := (&Server{Secret: secret, Owner: o, Now: func() time.Time { return now }}).Handler()
		rec := signed(h, now, body)
		switch rec.Code {
		case 200:
			if o.nCalls() != 1 {
				t.Fatalf("200 without a call to the owner")
			}
			for _, c := range o.calls[0] {
				if schema.ValidateID(c.ID) != nil || (c.Reason != wakeup.NeedsOwner && c.Reason != wakeup.Check) {
					t.Fatalf("invalid conn reached the owner: %+v", c)
				}
			}
		case 400, 413:
			if o.nCalls() != 0 {
				t.Fatalf("refused request reached the owner")
			}
		default:
			t.Fatalf("status %d for a signed body %q", rec.Code, body)
		}
	})
}

// FuzzSignature: a request whose signature is not the HMAC of its timestamp and body
// never gets past 401, and never reaches the owner.
func FuzzSignature(f *testing.F) {
	now := time.Now()
	ts := wakeup.Timestamp(now)
	f.Add(ts, wakeup.Sign(secret, ts, []byte(good)), []byte(good))
	f.Add(ts, "v1=", []byte(good))
	f.Add("", "", []byte{})
	f.Add("1e3", strings.Repeat("v1=0", 20), []byte("x"))
	f.Fuzz(func(t *testing.T, ts, sig string, body []byte) {
		o := &fakeOwner{}
		h := (&Server{Secret: secret, Owner: o, Now: func() time.Time { return now }}).Handler()
		valid := wakeup.Verify(secret, now, ts, sig, body) == nil
		if valid && sig != wakeup.Sign(secret, ts, body) {
			t.Fatalf("Verify accepted a signature that is not the HMAC: %q", sig)
		}
		if strings.ContainsAny(ts+sig, "\r\n\x00") {
			return // not representable as a header value
		}
		rec := post(h, body, ts, sig)
		if !valid && len(body) <= wakeup.MaxBody && rec.Code != 401 {
			t.Fatalf("bad signature answered %d", rec.Code)
		}
		if !valid && o.nCalls() != 0 {
			t.Fatal("unauthenticated request reached the owner")
		}
	})
}
