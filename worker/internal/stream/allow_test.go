package stream

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/sockfleet/sockfleet/shared/local/demoupstream"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/worker/internal/secrets"
)

// trap is a TCP listener on 127.0.0.1 standing for a host an attacker controls: it
// accepts anything and keeps every byte it is sent.
type trap struct {
	ln    net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
	data  bytes.Buffer
}

func newTrap(t *testing.T) *trap {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tr := &trap{ln: ln}
	tr.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			tr.mu.Lock()
			tr.conns = append(tr.conns, c)
			tr.mu.Unlock()
			tr.wg.Go(func() {
				b, _ := io.ReadAll(c)
				tr.mu.Lock()
				tr.data.Write(b)
				tr.mu.Unlock()
			})
		}
	})
	t.Cleanup(func() { tr.close() })
	return tr
}

func (tr *trap) addr() string { return tr.ln.Addr().String() }

func (tr *trap) accepted() int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return len(tr.conns)
}

// close stops the trap and returns how many connections it accepted and what they sent.
func (tr *trap) close() (int, string) {
	tr.ln.Close()
	tr.mu.Lock()
	for _, c := range tr.conns {
		c.Close()
	}
	tr.mu.Unlock()
	tr.wg.Wait()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return len(tr.conns), tr.data.String()
}

// secretsFile writes a local secrets file and returns a cache over it.
func secretsFile(t *testing.T, body string) *secrets.Cache {
	t.Helper()
	file := filepath.Join(t.TempDir(), "secrets.json")
	if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return &secrets.Cache{Source: secrets.File{Path: file}, TTL: time.Hour}
}

// The attack: someone who can write the table names a secret in the spec and points
// ws_url at a listener of theirs. Wherever the spec lets the secret be templated, and
// whether the secret allows other hosts or none, the listener gets no connection at
// all, the status is invalid naming the secret and the host, and the value appears
// nowhere (status, logs, sink).
func TestSecretNeverGoesToAHostItsOwnerDidNotAllow(t *testing.T) {
	const value, plain, field = "db-pass-5521", "plain-pass-8813", "field-pass-3390"
	cache := secretsFile(t, `{
		"db": {"value": "`+value+`", "allowed_hosts": ["db.example.com", "*.feeds.example.com", "127.0.0.1:1"]},
		"legacy": "`+plain+`",
		"creds": {"value": "{\"password\": \"`+field+`\"}", "allowed_hosts": ["db.example.com"]}
	}`)
	for name, c := range map[string]struct {
		ref  string // the secret named in the error
		spec func(tmpl string) schema.Spec
		tmpl string
	}{
		"header":          {"db", func(v string) schema.Spec { return schema.Spec{Headers: map[string]string{"Authorization": v}} }, "Bearer {{secret:db}}"},
		"header no allow": {"legacy", func(v string) schema.Spec { return schema.Spec{Headers: map[string]string{"X-Key": v}} }, "{{secret:legacy}}"},
		"header json key": {"creds", func(v string) schema.Spec { return schema.Spec{Headers: map[string]string{"X-Key": v}} }, "{{secret:creds#password}}"},
		"open message":    {"db", func(v string) schema.Spec { return schema.Spec{OpenMessages: []schema.OpenMessage{{Text: v}}} }, `{"auth":"{{secret:db}}"}`},
		"keepalive": {"db", func(v string) schema.Spec {
			return schema.Spec{Keepalive: &schema.Keepalive{Message: v, Interval: time.Second}}
		}, "ping {{secret:db}}"},
		"after a template": {"db", func(v string) schema.Spec { return schema.Spec{Headers: map[string]string{"X-Key": v}} }, "{conn}:{{secret:db}}"},
	} {
		t.Run(name, func(t *testing.T) {
			tr := newTrap(t)
			var logs bytes.Buffer
			var logMu sync.Mutex
			snk := &memSink{}
			cfg := testConfig(t, snk, "seq")
			cfg.Log = slog.New(slog.NewJSONHandler(syncWriter{&logs, &logMu}, &slog.HandlerOptions{Level: slog.LevelDebug}))
			cfg.Secrets = cache
			s := specStream(t, cfg, "ws://"+tr.addr()+"/feed", "c1", 0, c.spec(c.tmpl))
			stop := run(s)
			// Two refusals (the retry after the backoff does not dial either), each said
			// in the status after it is counted, or a leak.
			waitFor(t, 5*time.Second, "two refused attempts", func() bool {
				return cfg.Metrics.SecretErrors.Load() >= 2 && s.Status().State == schema.StatusInvalid || tr.accepted() > 0
			})
			stop(ErrGraceful)
			conns, got := tr.close()
			if conns != 0 || got != "" {
				t.Fatalf("the listener was dialed %d times and sent %q", conns, got)
			}
			st := s.Status()
			if st.State != schema.StatusInvalid || !strings.Contains(st.Error, "secret "+c.ref) || !strings.Contains(st.Error, tr.addr()) {
				t.Fatalf("status %+v: want invalid naming secret %s and %s", st, c.ref, tr.addr())
			}
			logMu.Lock()
			defer logMu.Unlock()
			for what, text := range map[string]string{"status": st.Error, "logs": logs.String()} {
				for _, v := range []string{value, plain, field} {
					if strings.Contains(text, v) {
						t.Fatalf("the %s hold a secret value: %s", what, text)
					}
				}
			}
			if len(snk.all()) != 0 {
				t.Fatalf("the sink got %d messages", len(snk.all()))
			}
		})
	}
}

// A wildcard allowance admits a host under the domain: the stream dials it (through
// a dialer that sends that name to a real upstream on 127.0.0.1) and streams, with
// the secret in the handshake.
func TestSecretGoesToAWildcardHost(t *testing.T) {
	const value = "wild-token-6120"
	up := upstream(t, demoupstream.Config{Rate: 200, Rules: demoupstream.Rules{Header: "Authorization", HeaderValue: "Bearer " + value}})
	snk := &memSink{}
	cfg := testConfig(t, snk, "seq")
	cfg.Secrets = secretsFile(t, `{"feed/token": {"value": "`+value+`", "allowed_hosts": ["*.feeds.example.com"]}}`)
	var dialed atomic.Value
	cfg.Dialer = &websocket.Dialer{HandshakeTimeout: time.Second, NetDialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		dialed.Store(addr)
		var d net.Dialer
		return d.DialContext(ctx, network, up.Addr()) // the name resolves to the upstream
	}}
	s := specStream(t, cfg, "ws://eu-1.Feeds.Example.com/streams/w", "w", 0,
		schema.Spec{Headers: map[string]string{"Authorization": "Bearer {{secret:feed/token}}"}})
	stop := run(s)
	waitFor(t, 5*time.Second, "messages", func() bool { return len(snk.seqs()) >= 5 })
	stop(ErrGraceful)
	if got, _ := dialed.Load().(string); got != "eu-1.Feeds.Example.com:80" {
		t.Fatalf("dialed %q", got)
	}
}

// The dialer follows no redirect: an allowed upstream answering 302 with another
// host's URL gets the secret (it is allowed), the other host gets nothing.
func TestRedirectDoesNotCarryASecret(t *testing.T) {
	const value = "redir-token-7781"
	tr := newTrap(t)
	var asked atomic.Int64
	redir := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		http.Redirect(w, r, "ws://"+tr.addr()+"/stolen", http.StatusFound)
	}))
	defer redir.Close()
	allowed := strings.TrimPrefix(redir.URL, "http://") // 127.0.0.1:PORT: that port only
	cfg := testConfig(t, &memSink{}, "seq")
	cfg.Secrets = secretsFile(t, `{"feed/token": {"value": "`+value+`", "allowed_hosts": ["`+allowed+`"]}}`)
	s := specStream(t, cfg, "ws://"+allowed+"/feed", "r", 0,
		schema.Spec{Headers: map[string]string{"Authorization": "Bearer {{secret:feed/token}}"}})
	stop := run(s)
	waitFor(t, 5*time.Second, "a backoff after the 302", func() bool {
		st := s.Status()
		return st.State == "backoff" && strings.Contains(st.Error, "302")
	})
	stop(ErrGraceful)
	if conns, got := tr.close(); asked.Load() == 0 || conns != 0 || got != "" {
		t.Fatalf("the redirect target was dialed %d times and sent %q", conns, got)
	}
	if st := s.Status(); strings.Contains(st.Error, value) {
		t.Fatalf("status %+v", st)
	}
}

func TestDialAddr(t *testing.T) {
	for raw, want := range map[string]string{
		"ws://h.example/x":          "h.example:80",
		"wss://h.example/x":         "h.example:443",
		"wss://H.example:8443/x?a":  "H.example:8443",
		"ws://[::1]:9000/x":         "[::1]:9000",
		"wss://[::1]/x":             "[::1]:443",
		"ws://127.0.0.1:4000/x#top": "127.0.0.1:4000",
	} {
		if got, err := dialAddr(raw); err != nil || got != want {
			t.Errorf("dialAddr(%q) = %q, %v; want %q", raw, got, err, want)
		}
	}
	for _, raw := range []string{"ws:///x", "ws://[::1/x", "http2://h/x"} {
		if _, err := dialAddr(raw); err == nil {
			t.Errorf("dialAddr(%q) accepted", raw)
		}
	}
}

// TestURLErrorsRedacted checks that a URL refused at dial or resume time is not
// quoted with its query (where tokens travel) in the error the status shows.
func TestURLErrorsRedacted(t *testing.T) {
	raw := "wss://h.example:abc/x?token=s3cret"
	if _, err := dialAddr(raw); err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("dialAddr(%q) error = %v; want one without the token", raw, err)
	}
	r := Resume{Kind: "query", Name: "from", Template: "{seq}"}
	if _, _, err := r.Apply(raw, 1); err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("Resume.Apply(%q) error = %v; want one without the token", raw, err)
	}
}
