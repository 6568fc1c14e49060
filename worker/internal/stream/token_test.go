package stream

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sockfleet/sockfleet/shared/local/demoupstream"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/worker/internal/sink"
)

// bulletSpec is a KuCoin-style spec: a token minted by POST /bullet before each
// dial, whose endpoint and token make the URL.
func bulletSpec(restBase string) (string, schema.Spec) {
	return "{{token:data.instanceServers.0.endpoint}}/c1?token={{token:data.token}}", schema.Spec{
		TokenRequest: &schema.TokenRequest{
			Request: schema.Request{Method: "POST", URL: restBase + "/bullet"},
			Expires: "data.expires_in",
		},
	}
}

// A token minted before each dial fills ws_url; the upstream refuses a handshake
// without it. Its expiry rotates the socket (with a new token) before the upstream
// ends it: no reconnect, no socket closed for a lapsed token, no gap or repeat.
func TestTokenFillsURLAndItsExpiryRotates(t *testing.T) {
	up := upstream(t, demoupstream.Config{Rate: 200, Size: 8, RequireToken: true, TokenTTL: 2 * time.Second})
	snk := &memSink{}
	cfg := testConfig(t, snk, "seq")
	raw, sp := bulletSpec("http://" + up.Addr())
	if err := schema.ValidateURL(raw); err != nil {
		t.Fatal(err)
	}
	s := specStream(t, cfg, raw, "c1", 0, sp)
	stop := run(s)
	waitFor(t, 10*time.Second, "two rotations", func() bool { return cfg.Metrics.Rotations.Load() >= 2 })
	stop(ErrGraceful)
	contiguous(t, snk.seqs(), 1)
	ts := up.TokenStats()
	if ts.Minted < 3 || ts.ExpiredCloses != 0 {
		t.Fatalf("token stats %+v: want a token per socket (3+) and no socket closed for a lapsed token", ts)
	}
	if n := cfg.Metrics.Reconnects.Load(); n != 0 {
		t.Fatalf("%d reconnects: the token's expiry should rotate, not break, the socket", n)
	}
	if st := up.Stats("c1"); st.Refused != 0 {
		t.Fatalf("%d handshakes refused", st.Refused)
	}
}

// Without the token the demo upstream refuses the handshake (the test above would
// pass vacuously otherwise).
func TestDemoUpstreamRefusesAMissingToken(t *testing.T) {
	up := upstream(t, demoupstream.Config{Rate: 200, Size: 8, RequireToken: true})
	snk := &memSink{}
	s := New(testConfig(t, snk, "seq"), "c1", up.URL("c1")+"?token=made-up", 0)
	stop := run(s)
	waitFor(t, 5*time.Second, "a refusal", func() bool { return up.Stats("c1").Refused >= 1 })
	stop(ErrGraceful)
	if st := s.Status(); !strings.Contains(st.Error, "401") || len(snk.seqs()) != 0 {
		t.Fatalf("status %+v, %d delivered: want a 401 and nothing", st, len(snk.seqs()))
	}
}

// A Binance-style listenKey: the refresh keeps it alive past its TTL, with no
// rotation; a refresh that fails rotates the socket to a new key, without a gap.
func TestRefreshKeepsTheKeyAndItsFailureRotates(t *testing.T) {
	up := upstream(t, demoupstream.Config{Rate: 200, Size: 8, RequireToken: true, TokenTTL: 1500 * time.Millisecond})
	var fail atomic.Bool
	var calls atomic.Int64
	// The keepalive goes through a relay that can be made to answer 500.
	relay := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if fail.Load() {
			http.Error(w, "boom", http.StatusInternalServerError)
			return
		}
		r.URL.Scheme, r.URL.Host, r.RequestURI = "http", up.Addr(), ""
		resp, err := http.DefaultTransport.RoundTrip(r.WithContext(r.Context()))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		w.WriteHeader(resp.StatusCode)
	}))
	defer relay.Close()
	snk := &memSink{}
	cfg := testConfig(t, snk, "seq")
	sp := schema.Spec{TokenRequest: &schema.TokenRequest{
		Request: schema.Request{Method: "POST", URL: "http://" + up.Addr() + "/listenKey"},
		Refresh: &schema.Refresh{Request: schema.Request{Method: "PUT", URL: relay.URL + "/listenKey?listenKey={{token:listenKey}}"},
			Interval: 500 * time.Millisecond},
	}}
	s := specStream(t, cfg, "ws://"+up.Addr()+"/streams/c1?listenKey={{token:listenKey}}", "c1", 0, sp)
	stop := run(s)
	waitFor(t, 10*time.Second, "keepalives past the key's TTL", func() bool { return up.TokenStats().Refreshes >= 5 })
	if r, ts := cfg.Metrics.Rotations.Load(), up.TokenStats(); r != 0 || ts.ExpiredCloses != 0 || ts.Minted != 1 {
		t.Fatalf("rotations %d, token stats %+v: want one key kept alive", r, ts)
	}
	fail.Store(true)
	waitFor(t, 5*time.Second, "a rotation after the failed refresh", func() bool { return cfg.Metrics.Rotations.Load() >= 1 })
	fail.Store(false)
	n := len(snk.seqs())
	waitFor(t, 5*time.Second, "messages on the new socket", func() bool { return len(snk.seqs()) > n+50 })
	stop(ErrGraceful)
	contiguous(t, snk.seqs(), 1)
	if cfg.Metrics.RefreshFailures.Load() < 1 || up.TokenStats().Minted < 2 {
		t.Fatalf("refresh failures %d, minted %d", cfg.Metrics.RefreshFailures.Load(), up.TokenStats().Minted)
	}
	if n := cfg.Metrics.Reconnects.Load(); n != 0 {
		t.Fatalf("%d reconnects: a failed refresh rotates make-before-break", n)
	}
}

// A token endpoint that misbehaves stops the dial with a clear status naming the
// request, never a secret's value nor the token's: a timeout, a 500, an answer
// without the field a template uses, a huge answer, an answer that is not JSON, an
// expiry that is neither seconds nor epoch milliseconds.
func TestTokenRequestFailures(t *testing.T) {
	const secret = "api-key-7f3a"
	const tokenValue = "tok-value-9d1c"
	cases := []struct {
		name   string
		answer func(w http.ResponseWriter, r *http.Request)
		want   string
		tweak  func(*schema.Spec)
	}{
		{"timeout", func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
			case <-time.After(3 * time.Second):
			}
		}, "no answer within 200ms", nil},
		{"500", func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "internal "+tokenValue, http.StatusInternalServerError)
		}, "status 500", nil},
		{"no such field", func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write([]byte(`{"data":{"tokn":"` + tokenValue + `"}}`))
		}, "the answer has no field data.token (used in ws_url)", nil},
		{"huge body", func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write([]byte(`{"data":{"token":"` + strings.Repeat("x", 1<<20) + `"}}`))
		}, "answer over 65536 bytes", nil},
		{"not json", func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write([]byte(tokenValue))
		}, "the answer is not JSON", nil},
		{"expiry in seconds since the epoch", func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write([]byte(`{"data":{"token":"` + tokenValue + `","exp":1764800000}}`))
		}, "want seconds (below 10^8) or epoch milliseconds", func(sp *schema.Spec) { sp.TokenRequest.Expires = "data.exp" }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var sawKey atomic.Bool
			rest := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				sawKey.Store(r.Header.Get("X-Api-Key") == secret)
				c.answer(w, r)
			}))
			defer rest.Close()
			up := upstream(t, demoupstream.Config{Rate: 200, Size: 8})
			cfg := testConfig(t, &memSink{}, "seq")
			cfg.Secrets = secretsFile(t, `{"api": {"value": "`+secret+`", "allowed_hosts": ["127.0.0.1"]}}`)
			sp := schema.Spec{TokenRequest: &schema.TokenRequest{Request: schema.Request{
				Method: "POST", URL: rest.URL + "/token", Headers: map[string]string{"X-Api-Key": "{{secret:api}}"},
				Timeout: 200 * time.Millisecond,
			}}}
			if c.name != "timeout" {
				sp.TokenRequest.Timeout = 5 * time.Second // only the timeout case is about time
			}
			if c.tweak != nil {
				c.tweak(&sp)
			}
			s := specStream(t, cfg, up.URL("c1")+"?token={{token:data.token}}", "c1", 0, sp)
			stop := run(s)
			waitFor(t, 5*time.Second, "a status naming the failure", func() bool { return strings.Contains(s.Status().Error, c.want) })
			stop(ErrGraceful)
			st := s.Status()
			if !strings.Contains(st.Error, schema.AttrTokenRequest) || strings.Contains(st.Error, secret) || strings.Contains(st.Error, tokenValue) {
				t.Fatalf("status %+v: want the request named, neither the secret nor the token", st)
			}
			// The status can come from the client's timeout before the handler ran (a
			// loaded machine); some attempt reaches it.
			waitFor(t, 5*time.Second, "the secret header at the token endpoint", sawKey.Load)
			if n := up.Stats("c1").Connects; n != 0 {
				t.Fatalf("%d dials without a token", n)
			}
			if cfg.Metrics.TokenErrors.Load() == 0 {
				t.Fatal("token errors not counted")
			}
		})
	}
}

// A secret in the token request obeys the host allowance of header secrets: one
// not allowed to the token endpoint's host stops the connection with status
// invalid, and the endpoint is never called.
func TestTokenRequestSecretBoundToItsHost(t *testing.T) {
	var calls atomic.Int64
	rest := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls.Add(1) }))
	defer rest.Close()
	cfg := testConfig(t, &memSink{}, "seq")
	cfg.Secrets = secretsFile(t, `{"api": {"value": "v-123", "allowed_hosts": ["api.example.com"]}}`)
	sp := schema.Spec{TokenRequest: &schema.TokenRequest{Request: schema.Request{
		Method: "POST", URL: rest.URL + "/token?sig={{secret:api}}"}}}
	s := specStream(t, cfg, "ws://127.0.0.1:1/x?token={{token:t}}", "c1", 0, sp)
	stop := run(s)
	waitFor(t, 5*time.Second, "status invalid", func() bool { return s.Status().State == schema.StatusInvalid })
	stop(ErrGraceful)
	if st := s.Status(); !strings.Contains(st.Error, "secret api") || strings.Contains(st.Error, "v-123") || calls.Load() != 0 {
		t.Fatalf("status %+v, %d calls: want the secret named, its value not, and no call", st, calls.Load())
	}
}

func TestTokenValue(t *testing.T) {
	tok := &token{}
	tok.doc = map[string]any{"data": map[string]any{"token": "T", "n": 7.0,
		"instanceServers": []any{map[string]any{"endpoint": "wss://e"}}}}
	for path, want := range map[string]string{"data.token": "T", "data.n": "7", "data.instanceServers.0.endpoint": "wss://e"} {
		if got, err := tok.value(path); err != nil || got != want {
			t.Errorf("%s: %q, %v; want %q", path, got, err, want)
		}
	}
	for _, path := range []string{"data.nope", "data.instanceServers.1.endpoint", "data.token.x", "data.instanceServers.x"} {
		if _, err := tok.value(path); err == nil {
			t.Errorf("%s: found", path)
		}
	}
	at := time.Unix(1000, 0)
	tok.doc = map[string]any{"s": "60", "ms": 1764800000000.0, "sec": 1764800000.0, "neg": -1.0, "txt": "soon"}
	if e, err := tok.expiry("s", at); err != nil || !e.Equal(at.Add(time.Minute)) {
		t.Errorf("seconds: %v %v", e, err)
	}
	if e, err := tok.expiry("ms", at); err != nil || e.UnixMilli() != 1764800000000 {
		t.Errorf("epoch ms: %v %v", e, err)
	}
	for _, p := range []string{"sec", "neg", "txt", "none"} {
		if _, err := tok.expiry(p, at); err == nil {
			t.Errorf("%s: accepted", p)
		}
	}
	if _, err := tok.expiry("ms", time.UnixMilli(1764800000001)); err == nil {
		t.Error("a passed epoch accepted")
	}
}

var _ sink.Sink = (*memSink)(nil)

// FuzzTokenAnswer feeds arbitrary answers and paths: reading a field or an expiry
// never panics, and a value found is what filling a template inserts.
func FuzzTokenAnswer(f *testing.F) {
	f.Add(`{"data":{"token":"T","instanceServers":[{"endpoint":"wss://e"}]}}`, "data.instanceServers.0.endpoint")
	f.Add(`{"listenKey":"k","exp":1764800000000}`, "exp")
	f.Add(`[1,[2,{"a":null}]]`, "1.1.a")
	f.Fuzz(func(t *testing.T, doc, path string) {
		tok := &token{}
		dec := json.NewDecoder(strings.NewReader(doc))
		dec.UseNumber()
		if dec.Decode(&tok.doc) != nil || schema.CheckTokenPath(path) != nil {
			return
		}
		_, _ = tok.expiry(path, time.Now())
		v, err := tok.value(path)
		got, ferr := tok.fill("<{{token:" + path + "}}>")
		if (err == nil) != (ferr == nil) || (err == nil && got != "<"+v+">") {
			t.Fatalf("value %q %v, fill %q %v", v, err, got, ferr)
		}
	})
}
