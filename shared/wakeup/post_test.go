package wakeup

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// The signed POST on the wire, header for header: the signature is HMAC-SHA256 over
// "<timestamp>.<body>", hex, after "v1=" (computed independently of Sign).
func TestSignedPostGolden(t *testing.T) {
	const body = `{"v":1,"conns":[{"id":"a","lease_version":3,"reason":"needs_owner"}]}`
	type seen struct{ method, path, ctype, ts, sig, body string }
	got := make(chan seen, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{r.Method, r.URL.Path, r.Header.Get("Content-Type"), r.Header.Get(HeaderTimestamp), r.Header.Get(HeaderSignature), string(b)}
		_, _ = io.WriteString(w, `{"v":1}`)
	}))
	defer srv.Close()
	p := SignedPost{Secret: secret, HTTP: srv.Client(), Now: func() time.Time { return time.UnixMilli(1_764_680_000_000) }}
	req := Request{V: Version, Conns: []Conn{{ID: "a", LeaseVersion: 3, Reason: NeedsOwner}}}
	reply, err := p.JSON(context.Background(), srv.URL+Path, req, MaxBody)
	if err != nil || string(reply) != `{"v":1}` {
		t.Fatalf("Do = %q, %v", reply, err)
	}
	want := seen{http.MethodPost, Path, "application/json", "1764680000000",
		"v1=20b425a16bc6b136939260b7d48725f905b288bcde958f71eebac21a47464bbc", body}
	if s := <-got; s != want {
		t.Errorf("request\n got %+v\nwant %+v", s, want)
	}
}

// A receiver that checks with Verify and Replay accepts a SignedPost once.
func TestSignedPostVerifies(t *testing.T) {
	var replay Replay
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		sig := r.Header.Get(HeaderSignature)
		if err := Verify(secret, time.Now(), r.Header.Get(HeaderTimestamp), sig, b); err != nil || replay.Seen(sig, time.Now()) {
			http.Error(w, "refused", http.StatusUnauthorized)
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	defer srv.Close()
	p := SignedPost{Secret: secret, Timeout: 5 * time.Second} // its own client
	if reply, err := p.Do(context.Background(), srv.URL, []byte(`{}`), 16); err != nil || string(reply) != "ok" {
		t.Fatalf("Do = %q, %v", reply, err)
	}
	at := time.Now()
	fixed := SignedPost{Secret: secret, HTTP: srv.Client(), Now: func() time.Time { return at }}
	if _, err := fixed.Do(context.Background(), srv.URL, []byte(`{"n":1}`), 16); err != nil {
		t.Fatalf("first send: %v", err)
	}
	// The same body at the same timestamp is the same signature: a replay.
	if _, err := fixed.Do(context.Background(), srv.URL, []byte(`{"n":1}`), 16); err == nil ||
		!strings.Contains(err.Error(), "status 401: refused") {
		t.Fatalf("a replayed request: %v, want status 401 quoted", err)
	}
	wrong := SignedPost{Secret: []byte("another-secret-of-16"), HTTP: srv.Client()}
	if _, err := wrong.Do(context.Background(), srv.URL, []byte(`{}`), 16); err == nil {
		t.Fatal("a request signed with another secret was accepted")
	}
}
