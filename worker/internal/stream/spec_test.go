package stream

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"weak"

	"github.com/gorilla/websocket"
	"github.com/sockfleet/sockfleet/shared/local/demoupstream"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/worker/internal/metrics"
	"github.com/sockfleet/sockfleet/worker/internal/secrets"
	"github.com/sockfleet/sockfleet/worker/internal/sink"
)

// specStream is a stream of id on up with spec applied.
func specStream(t *testing.T, cfg *Config, url, id string, lastSeq int64, sp schema.Spec) *Stream {
	t.Helper()
	s := New(cfg, id, url, lastSeq)
	if err := s.UseSpec(sp, 0); err != nil {
		t.Fatal(err)
	}
	return s
}

// noDuplicates checks that no (epoch, seq) reached the sink twice.
func noDuplicates(t *testing.T, msgs []sink.Message) {
	t.Helper()
	seen := map[[2]int64]bool{}
	for _, m := range msgs {
		k := [2]int64{m.Epoch, m.Seq}
		if !m.Bad && seen[k] {
			t.Fatalf("seq %d (epoch %d) delivered twice", m.Seq, m.Epoch)
		}
		seen[k] = true
	}
}

func (s *memSink) all() []sink.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]sink.Message(nil), s.msgs...)
}

// closeRecorder is an upstream that records the close code each client sent.
type closeRecorder struct {
	mu     sync.Mutex
	codes  []int
	query  []string
	header []http.Header
}

func (c *closeRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	c.query = append(c.query, r.URL.RawQuery)
	c.header = append(c.header, r.Header.Clone())
	c.mu.Unlock()
	conn, err := (&websocket.Upgrader{}).Upgrade(w, r, nil)
	if err != nil {
		return
	}
	defer conn.Close()
	for {
		if _, _, err := conn.ReadMessage(); err != nil {
			code := -1
			if ce, ok := err.(*websocket.CloseError); ok {
				code = ce.Code
			}
			c.mu.Lock()
			c.codes = append(c.codes, code)
			c.mu.Unlock()
			return
		}
	}
}

func (c *closeRecorder) snapshot() ([]int, []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]int(nil), c.codes...), append([]string(nil), c.query...)
}

func wsURL(srv *httptest.Server, path string) string {
	return "ws" + strings.TrimPrefix(srv.URL, "http") + path
}

// A stop sends a close frame, so the upstream sees 1000, not an abnormal 1006.
func TestStopSendsCloseFrame(t *testing.T) {
	rec := &closeRecorder{}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	s := New(testConfig(t, &memSink{}, "seq"), "c", wsURL(srv, "/x"), 5)
	stop := run(s)
	waitFor(t, 5*time.Second, "connected", func() bool { _, q := rec.snapshot(); return len(q) == 1 })
	time.Sleep(50 * time.Millisecond) // let the session start its reader and writer
	stop(ErrGraceful)
	waitFor(t, 5*time.Second, "the upstream saw the close", func() bool { c, _ := rec.snapshot(); return len(c) == 1 })
	if codes, _ := rec.snapshot(); codes[0] != websocket.CloseNormalClosure {
		t.Fatalf("upstream saw close code %d, want %d", codes[0], websocket.CloseNormalClosure)
	}
}

// weakSink keeps weak pointers to the data of every message written.
type weakSink struct {
	mu   sync.Mutex
	ptrs []weak.Pointer[byte]
}

func (w *weakSink) Write(_ context.Context, b []sink.Message) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, m := range b {
		if len(m.Data) > 0 {
			w.ptrs = append(w.ptrs, weak.Make(&m.Data[0]))
		}
	}
	return nil
}
func (w *weakSink) Close() error { return nil }

func (w *weakSink) live() (n, total int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, p := range w.ptrs {
		if p.Value() != nil {
			n++
		}
	}
	return n, len(w.ptrs)
}

// Once a batch is written, the stream holds no reference to its frames: an idle
// socket after a burst keeps none of the burst's data alive.
func TestWrittenBatchesKeepNoReferences(t *testing.T) {
	up := upstream(t, demoupstream.Config{Rate: -1, Size: 2000})
	snk := &weakSink{}
	cfg := testConfig(t, snk, "seq")
	cfg.BatchSize = 256
	s := New(cfg, "b", up.URL("b"), 0)
	stop := run(s)
	defer stop(ErrGraceful)
	waitFor(t, 5*time.Second, "500 messages", func() bool { _, n := snk.live(); return n >= 500 })
	up.Stall("b", true) // the socket goes quiet, the session stays up
	// Wait until what was in flight has been delivered: nothing waits for the sink,
	// and nothing more arrived at it for one look.
	for prev := -1; ; time.Sleep(200 * time.Millisecond) {
		_, n := snk.live()
		if n == prev && cfg.Metrics.SinkQueued.Load() == 0 {
			break
		}
		prev = n
	}
	var live, total int
	for range 5 {
		runtime.GC()
		if live, total = snk.live(); live <= 1 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	// At most the frame the reader is handling may still be referenced.
	if live > 1 {
		t.Fatalf("%d of %d delivered frames still referenced by an idle session", live, total)
	}
}

// The secret's value reaches the handshake and appears in no log line, status or
// metric; after a 401 the secret is read again at once, not after its TTL.
func TestSecretHeaderReachesHandshakeOnly(t *testing.T) {
	const value = "s3cr3t-value-91"
	up := upstream(t, demoupstream.Config{Rate: 200, Rules: demoupstream.Rules{
		Header: "Authorization", HeaderValue: "Bearer " + value, Subprotocol: "v2.feed"}})
	file := filepath.Join(t.TempDir(), "secrets.json")
	if err := os.WriteFile(file, []byte(`{"feed/token":{"value":"wrong-value-1","allowed_hosts":["127.0.0.1"]}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	var logMu sync.Mutex
	snk := &memSink{}
	cfg := testConfig(t, snk, "seq")
	cfg.Log = slog.New(slog.NewJSONHandler(syncWriter{&logs, &logMu}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg.Secrets = &secrets.Cache{Source: secrets.File{Path: file}, TTL: time.Hour}
	s := specStream(t, cfg, up.URL("h"), "h", 0, schema.Spec{
		Headers:      map[string]string{"Authorization": "Bearer {{secret:feed/token}}"},
		Subprotocols: []string{"v2.feed"},
	})
	stop := run(s)
	waitFor(t, 5*time.Second, "a refused handshake", func() bool { return up.Stats("h").Refused >= 1 })
	// The upstream counts the refusal before the stream has read the 401 and set its
	// status: wait for the status rather than read it at once.
	waitFor(t, 5*time.Second, "status after a wrong secret naming the 401", func() bool {
		return strings.Contains(s.Status().Error, "401")
	})
	// Rotate the secret: the refused handshake made the stream forget the old value.
	if err := os.WriteFile(file, []byte(`{"feed/token":{"value":"`+value+`","allowed_hosts":["127.0.0.1"]}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "messages", func() bool { return len(snk.seqs()) >= 20 })
	stop(ErrGraceful)
	contiguous(t, snk.seqs(), 1)
	text := httptest.NewRecorder()
	metrics.Handler(cfg.Metrics).ServeHTTP(text, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	logMu.Lock()
	defer logMu.Unlock()
	for what, got := range map[string]string{"logs": logs.String(), "status": s.Status().Error, "metrics": text.Body.String()} {
		if strings.Contains(got, value) || strings.Contains(got, "wrong-value-1") {
			t.Fatalf("a secret value appears in the %s: %s", what, got)
		}
	}
	if !strings.Contains(logs.String(), "401") {
		t.Fatalf("the refusal was not logged at all: %s", logs.String())
	}
}

type syncWriter struct {
	b  *bytes.Buffer
	mu *sync.Mutex
}

func (w syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// Without the right header or subprotocol the upstream refuses, and the stream
// backs off with the status saying so.
func TestHandshakeRulesRefuse(t *testing.T) {
	up := upstream(t, demoupstream.Config{Rate: 100, Rules: demoupstream.Rules{Header: "X-Key", HeaderValue: "k", Subprotocol: "v2"}})
	for name, sp := range map[string]schema.Spec{
		"no header":      {Subprotocols: []string{"v2"}},
		"no subprotocol": {Headers: map[string]string{"X-Key": "k"}},
	} {
		s := specStream(t, testConfig(t, &memSink{}, "seq"), up.URL(name), name, 0, sp)
		stop := run(s)
		waitFor(t, 5*time.Second, name+" refused", func() bool { return s.Status().State == "backoff" })
		stop(ErrGraceful)
		if st := s.Status(); !strings.Contains(st.Error, "handshake status 40") {
			t.Fatalf("%s: status %+v", name, st)
		}
	}
	s := specStream(t, testConfig(t, &memSink{}, "seq"), up.URL("ok"), "ok", 0,
		schema.Spec{Headers: map[string]string{"X-Key": "k"}, Subprotocols: []string{"v2"}})
	stop := run(s)
	waitFor(t, 5*time.Second, "streaming", func() bool { return s.LastSeq() > 5 })
	stop(ErrGraceful)
}

var subscribeRules = demoupstream.Rules{Subscribe: `"type":"subscribe"`, Subscribed: `{"type":"subscribed"}`, SubscribeWithin: 300 * time.Millisecond}

// An upstream that drops clients that have not subscribed in time streams with an
// open message; the reply is awaited; without it the stream never gets data.
func TestOpenMessageSubscribes(t *testing.T) {
	up := upstream(t, demoupstream.Config{Rate: 200, Rules: subscribeRules})
	snk := &memSink{}
	s := specStream(t, testConfig(t, snk, "seq"), up.URL("o"), "o", 10, schema.Spec{OpenMessages: []schema.OpenMessage{
		{Text: `{"type":"subscribe","channel":"{conn}","after":{seq}}`, ExpectField: "type=subscribed", Timeout: time.Second},
	}})
	stop := run(s)
	waitFor(t, 5*time.Second, "messages", func() bool { return len(snk.seqs()) >= 50 })
	stop(ErrGraceful)
	contiguous(t, snk.seqs(), 11)
	if n := up.Stats("o").Connects; n != 1 {
		t.Fatalf("%d connects, want 1", n)
	}

	// Without the open message the upstream closes the socket, again and again, and
	// nothing is ever delivered.
	bareSink := &memSink{}
	bare := New(testConfig(t, bareSink, "seq"), "bare", up.URL("bare"), 0)
	stop = run(bare)
	waitFor(t, 5*time.Second, "two drops", func() bool { return up.Stats("bare").Connects >= 2 })
	stop(ErrGraceful)
	if n := len(bareSink.seqs()); n != 0 {
		t.Fatalf("%d messages without subscribing", n)
	}
}

// A reply that never comes fails the session; the status names the frame.
func TestOpenMessageReplyTimeout(t *testing.T) {
	up := upstream(t, demoupstream.Config{Rate: 0})
	cfg := testConfig(t, &memSink{}, "seq")
	s := specStream(t, cfg, up.URL("t"), "t", 0, schema.Spec{OpenMessages: []schema.OpenMessage{
		{Text: "hello"},
		{Text: "subscribe", Expect: "never-sent", Timeout: 100 * time.Millisecond},
	}})
	stop := run(s)
	waitFor(t, 5*time.Second, "backoff", func() bool { return s.Status().State == "backoff" })
	stop(ErrGraceful)
	if st := s.Status(); !strings.Contains(st.Error, `open_messages[1]: no reply containing "never-sent" within 100ms`) {
		t.Fatalf("status %+v", st)
	}
	if cfg.Metrics.OpenFailures.Load() == 0 {
		t.Fatal("open failure not counted")
	}
}

var keepaliveRules = demoupstream.Rules{Keepalive: "KeepAlive", KeepaliveWithin: 400 * time.Millisecond, Pong: `{"type":"pong"}`}

// An upstream that closes quiet clients keeps a client with a keepalive; a pong
// match that never matches fails the session.
func TestKeepalive(t *testing.T) {
	up := upstream(t, demoupstream.Config{Rate: 200, Rules: keepaliveRules})
	snk := &memSink{}
	s := specStream(t, testConfig(t, snk, "seq"), up.URL("k"), "k", 0, schema.Spec{Keepalive: &schema.Keepalive{
		Message: `{"type":"KeepAlive"}`, Interval: 100 * time.Millisecond, Pong: `"pong"`, PongTimeout: 300 * time.Millisecond}})
	stop := run(s)
	time.Sleep(1500 * time.Millisecond)
	stop(ErrGraceful)
	if n := up.Stats("k").Connects; n != 1 {
		t.Fatalf("%d connects with a keepalive, want 1 (status %+v)", n, s.Status())
	}
	contiguous(t, snk.seqs(), 1)

	bare := New(testConfig(t, &memSink{}, "seq"), "bare", up.URL("bare"), 0)
	stop = run(bare)
	waitFor(t, 5*time.Second, "two drops", func() bool { return up.Stats("bare").Connects >= 2 })
	stop(ErrGraceful)

	cfg := testConfig(t, &memSink{}, "seq")
	nopong := specStream(t, cfg, up.URL("np"), "np", 0, schema.Spec{Keepalive: &schema.Keepalive{
		Message: `{"type":"KeepAlive"}`, Interval: 100 * time.Millisecond, Pong: "never", PongTimeout: 200 * time.Millisecond}})
	stop = run(nopong)
	waitFor(t, 5*time.Second, "pong failure", func() bool { return strings.Contains(nopong.Status().Error, "keepalive: no reply") })
	stop(ErrGraceful)
}

// start: latest asks for no resume point on a first connect, earliest for 0, N for
// N; a checkpoint always wins.
func TestStart(t *testing.T) {
	rec := &closeRecorder{}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	cases := []struct {
		start   string
		lastSeq int64
		want    string
	}{
		{"", 0, ""},
		{schema.StartLatest, 0, ""},
		{schema.StartEarliest, 0, "from=0"},
		{"4200", 0, "from=4200"},
		{schema.StartLatest, 7, "from=7"},
	}
	for i, tc := range cases {
		s := specStream(t, testConfig(t, &memSink{}, "seq"), wsURL(srv, "/x"), "s", tc.lastSeq, schema.Spec{Start: tc.start})
		stop := run(s)
		waitFor(t, 5*time.Second, "dialed", func() bool { _, q := rec.snapshot(); return len(q) == i+1 })
		stop(ErrGraceful)
		if _, q := rec.snapshot(); q[i] != tc.want {
			t.Errorf("start %q, last_seq %d: query %q, want %q", tc.start, tc.lastSeq, q[i], tc.want)
		}
	}
}

// No data for idle_timeout sets status idle (and the gauge); data clears it. With
// idle_reconnect the stream dials again.
func TestIdleTimeout(t *testing.T) {
	up := upstream(t, demoupstream.Config{Rate: 0})
	cfg := testConfig(t, &memSink{}, "seq")
	s := specStream(t, cfg, up.URL("i")+"?from=45461", "i", 45461, schema.Spec{IdleTimeout: time.Second})
	stop := run(s)
	waitFor(t, 5*time.Second, "idle", func() bool { return s.Status().State == schema.StatusIdle })
	if st := s.Status(); !strings.Contains(st.Error, "asked to resume after 45461") || cfg.Metrics.IdleNow.Load() != 1 {
		t.Fatalf("status %+v, idle gauge %d", st, cfg.Metrics.IdleNow.Load())
	}
	stop(ErrGraceful)
	if cfg.Metrics.IdleNow.Load() != 0 {
		t.Fatal("idle gauge not cleared when the stream stopped")
	}

	r := specStream(t, testConfig(t, &memSink{}, "seq"), up.URL("r"), "r", 0, schema.Spec{IdleTimeout: time.Second, IdleReconnect: true})
	stop = run(r)
	waitFor(t, 8*time.Second, "a reconnect", func() bool { return up.Stats("r").Connects >= 2 })
	// After the reconnect the status says idle again, not the dial's "connecting".
	waitFor(t, 5*time.Second, "idle after the reconnect", func() bool {
		st := r.Status()
		return up.Stats("r").Connects >= 2 && st.State == schema.StatusIdle && strings.Contains(st.Error, "reconnected while idle")
	})
	stop(ErrGraceful)
}

// A restarted numbering mid-session (and on a reconnect: the first message below
// the resume point) starts a new epoch: delivery goes on, nothing is lost, the sink
// can tell the epochs apart, and Epoch is checkpointed.
func TestSeqResetAccept(t *testing.T) {
	up := upstream(t, demoupstream.Config{Rate: 300})
	snk := &memSink{}
	cfg := testConfig(t, snk, "seq")
	cfg.ResetBelow = 5
	s := specStream(t, cfg, up.URL("r"), "r", 0, schema.Spec{})
	stop := run(s)
	waitFor(t, 5*time.Second, "messages", func() bool { return len(snk.seqs()) >= 30 })
	up.ResetNumbering("r") // the same socket goes on at seq 1
	waitFor(t, 5*time.Second, "epoch 1", func() bool { return s.Epoch() == 1 && s.LastSeq() >= 30 })
	up.ResetNumbering("r")
	up.Drop("r") // the reconnect asks to resume beyond the new head: it gets seq 1
	waitFor(t, 5*time.Second, "epoch 2", func() bool { return s.Epoch() == 2 && s.LastSeq() >= 30 })
	stop(ErrGraceful)
	msgs := snk.all()
	noDuplicates(t, msgs)
	byEpoch := map[int64][]int64{}
	for _, m := range msgs {
		byEpoch[m.Epoch] = append(byEpoch[m.Epoch], m.Seq)
	}
	for e := int64(0); e <= 2; e++ {
		if len(byEpoch[e]) == 0 {
			t.Fatalf("no messages in epoch %d", e)
		}
		contiguous(t, byEpoch[e], 1)
	}
	if n := cfg.Metrics.SeqResets.Load(); n != 2 {
		t.Fatalf("%d resets counted, want 2", n)
	}
}

// Under seq_reset=halt the stream stops by itself with status seq_reset, having
// delivered everything before the reset and nothing after it.
func TestSeqResetHalt(t *testing.T) {
	up := upstream(t, demoupstream.Config{Rate: 300})
	snk := &memSink{}
	cfg := testConfig(t, snk, "seq")
	s := specStream(t, cfg, up.URL("h"), "h", 0, schema.Spec{SeqReset: schema.SeqResetHalt})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	waitFor(t, 5*time.Second, "messages", func() bool { return len(snk.seqs()) >= 30 })
	up.ResetNumbering("h")
	up.Drop("h")
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the stream did not halt")
	}
	if err := s.Halted(); err == nil || s.Status().State != schema.StatusSeqReset || !strings.Contains(s.Status().Error, "sequence reset") {
		t.Fatalf("halted %v, status %+v", err, s.Status())
	}
	seqs := snk.seqs()
	contiguous(t, seqs, 1)
	if s.LastSeq() != seqs[len(seqs)-1] || s.Epoch() != 0 {
		t.Fatalf("checkpoint %d epoch %d, last delivered %d", s.LastSeq(), s.Epoch(), seqs[len(seqs)-1])
	}
}

// A frame over the read limit is a bad message: the socket stays up (no reconnect
// that would replay the same frame for ever), the frame's sequence shows as a gap.
func TestOverLimitFrameIsBad(t *testing.T) {
	up := upstream(t, demoupstream.Config{Rate: 300, Size: 10})
	for _, policy := range []BadPolicy{BadCount, BadPass} {
		snk := &memSink{}
		cfg := testConfig(t, snk, "seq")
		cfg.ReadLimit = 1024
		id := "o-" + string(policy)
		s := specStream(t, cfg, up.URL(id), id, 0, schema.Spec{BadMessages: string(policy)})
		stop := run(s)
		waitFor(t, 5*time.Second, "messages", func() bool { return len(snk.seqs()) >= 10 })
		up.Oversize(id, 64<<10)
		waitFor(t, 5*time.Second, "the oversized frame", func() bool { return cfg.Metrics.OverLimit.Load() == 1 })
		n := len(snk.seqs())
		waitFor(t, 5*time.Second, "messages after it", func() bool { return len(snk.seqs()) >= n+20 })
		stop(ErrGraceful)
		if c := up.Stats(id).Connects; c != 1 {
			t.Fatalf("%s: %d connects, want 1", policy, c)
		}
		if cfg.Metrics.BadMessages.Load() != 1 || cfg.Metrics.SeqGaps.Load() != 1 || cfg.Metrics.SeqGapMissing.Load() != 1 {
			t.Fatalf("%s: bad %d, gaps %d (missing %d); want 1, 1, 1", policy, cfg.Metrics.BadMessages.Load(),
				cfg.Metrics.SeqGaps.Load(), cfg.Metrics.SeqGapMissing.Load())
		}
		passed := 0
		for _, m := range snk.all() {
			if m.Bad {
				passed++
				if len(m.Data) != 1024 {
					t.Fatalf("passed-on frame of %d bytes, want the first 1024", len(m.Data))
				}
			}
		}
		if want := map[BadPolicy]int{BadCount: 0, BadPass: 1}[policy]; passed != want {
			t.Fatalf("%s: %d passed on, want %d", policy, passed, want)
		}
	}
}

// The sequence judgement, frame by frame (pure logic).
func TestTracker(t *testing.T) {
	cfg := testConfig(t, &memSink{}, "seq")
	cfg.ResetBelow = 100
	s := New(cfg, "t", "ws://h/x", 0)
	if err := s.UseSpec(schema.Spec{MaxSeqJump: 1000}, 0); err != nil {
		t.Fatal(err)
	}
	msg := func(seq int) frame { return frame{data: []byte(`{"seq":` + strconv.Itoa(seq) + `}`)} }
	tr := &tracker{s: s, sock: &socket{from: 500, resumed: true}, st: readState{last: 500, ref: true}, counter: 500, first: true}
	type step struct {
		seq       int
		queued    bool
		wantSeq   int64
		wantEpoch int64
	}
	run := func(steps []step) {
		t.Helper()
		for i, st := range steps {
			m, ok, err := tr.next(msg(st.seq))
			if err != nil {
				t.Fatalf("step %d (seq %d): %v", i, st.seq, err)
			}
			if ok != st.queued || (ok && (m.Seq != st.wantSeq || m.Epoch != st.wantEpoch)) {
				t.Fatalf("step %d (seq %d): queued %v seq %d epoch %d; want %v %d %d", i, st.seq, ok, m.Seq, m.Epoch,
					st.queued, st.wantSeq, st.wantEpoch)
			}
		}
	}
	// The first frame of a socket below the resume point it asked for is a reset.
	run([]step{{499, true, 499, 1}})
	tr.first = false
	run([]step{
		{500, true, 500, 1},
		{500, false, 0, 0},    // duplicate
		{504, true, 504, 1},   // a gap of 3
		{999999, false, 0, 0}, // a bogus jump: bad, not checkpointed
		{505, true, 505, 1},
		{450, false, 0, 0}, // 55 below: a replay, not a reset
		{3, true, 3, 2},    // far below: a reset
		{4, true, 4, 2},
	})
	m := cfg.Metrics
	if m.SeqGaps.Load() != 1 || m.SeqGapMissing.Load() != 3 || m.BogusJumps.Load() != 1 || m.BadMessages.Load() != 1 ||
		m.SeqResets.Load() != 2 || m.Duplicates.Load() != 2 {
		t.Fatalf("gaps %d missing %d jumps %d bad %d resets %d dups %d", m.SeqGaps.Load(), m.SeqGapMissing.Load(),
			m.BogusJumps.Load(), m.BadMessages.Load(), m.SeqResets.Load(), m.Duplicates.Load())
	}
}

// Rotation at max_lifetime and on an announced shutdown is make-before-break: the
// new socket is open before the old one closes, and the sink sees no gap and no
// duplicate across rotations; the upstream never had to cut a socket itself.
func TestRotation(t *testing.T) {
	for name, tc := range map[string]struct {
		rules demoupstream.Rules
		spec  schema.Spec
		seq   string
	}{
		"max_lifetime": {demoupstream.Rules{MaxLifetime: 2 * time.Second}, schema.Spec{MaxLifetime: 1500 * time.Millisecond}, "seq"},
		"announced": {demoupstream.Rules{MaxLifetime: 800 * time.Millisecond, Announce: `{"type":"goAway"}`, AnnounceBefore: 400 * time.Millisecond},
			schema.Spec{ShutdownMatch: `"goAway"`}, "seq"},
	} {
		t.Run(name, func(t *testing.T) {
			up := upstream(t, demoupstream.Config{Rate: 400, Rules: tc.rules})
			snk := &memSink{}
			cfg := testConfig(t, snk, tc.seq)
			s := specStream(t, cfg, up.URL("rot"), "rot", 0, tc.spec)
			stop := run(s)
			waitFor(t, 10*time.Second, "3 rotations", func() bool { return cfg.Metrics.Rotations.Load() >= 3 })
			stop(ErrGraceful)
			msgs := snk.all()
			noDuplicates(t, msgs)
			contiguous(t, snk.seqs(), 1)
			if n := len(msgs); n < 400 {
				t.Fatalf("only %d messages", n)
			}
			st := up.Stats("rot")
			if st.MaxClients > 2 {
				t.Fatalf("%d sockets at once", st.MaxClients)
			}
			if cfg.Metrics.OverlapPeak.Load() != 1 {
				t.Fatalf("overlap peak %d: want the new socket open before the old one closes, one at a time", cfg.Metrics.OverlapPeak.Load())
			}
			if cfg.Metrics.Reconnects.Load() != 0 {
				t.Fatalf("%d reconnects: the upstream closed a socket before its rotation", cfg.Metrics.Reconnects.Load())
			}
			if cfg.Metrics.Overlap.Load() != 0 {
				t.Fatalf("overlap gauge %d after stop", cfg.Metrics.Overlap.Load())
			}
		})
	}
}

// Streams to one host share its connect quota; one that waits shows quota_wait in
// its status and in the metrics, then streams.
func TestConnectQuotaShowsInStatus(t *testing.T) {
	up := upstream(t, demoupstream.Config{Rate: 100})
	cfg := testConfig(t, &memSink{}, "seq")
	cfg.Quota = &Quota{N: 1, W: 700 * time.Millisecond}
	a := New(cfg, "a", up.URL("a"), 0)
	stopA := run(a)
	defer stopA(ErrGraceful)
	waitFor(t, 5*time.Second, "a connected", func() bool { return up.Stats("a").Clients == 1 })
	b := New(cfg, "b", up.URL("b"), 0)
	stopB := run(b)
	defer stopB(ErrGraceful)
	waitFor(t, 5*time.Second, "b waiting", func() bool { return b.Status().State == schema.StatusQuotaWait })
	if st := b.Status(); !strings.Contains(st.Error, "1 per 700ms") || cfg.Metrics.QuotaWaiting.Load() != 1 {
		t.Fatalf("status %+v, waiting %d", st, cfg.Metrics.QuotaWaiting.Load())
	}
	waitFor(t, 5*time.Second, "b connected", func() bool { return up.Stats("b").Clients == 1 })
	waitFor(t, 5*time.Second, "b streaming", func() bool { return b.Status().State == "streaming" })
	if cfg.Metrics.QuotaWaits.Load() != 1 || cfg.Metrics.QuotaWaiting.Load() != 0 {
		t.Fatalf("waits %d, waiting %d", cfg.Metrics.QuotaWaits.Load(), cfg.Metrics.QuotaWaiting.Load())
	}
}

// testCut is a Cutter cause that records what held when the stream cut.
type testCut struct {
	s                 *Stream
	snk               *memSink
	up                *demoupstream.Server
	cuts              atomic.Int32
	lastSeq, sinkLast int64
	clientsAtCut      int
}

func (c *testCut) Error() string { return "test cut" }
func (c *testCut) Unwrap() error { return ErrGraceful }
func (c *testCut) Cut() {
	c.cuts.Add(1)
	c.lastSeq = c.s.LastSeq()
	if seqs := c.snk.seqs(); len(seqs) > 0 {
		c.sinkLast = seqs[len(seqs)-1]
	}
	c.clientsAtCut = c.up.Stats("k").Clients
}

// A Cutter cause runs once, after the last delivery and before the close handshake:
// the sink has everything the stream counts as delivered, and the upstream still
// holds the socket; the stream closes it after.
func TestCutBeforeClose(t *testing.T) {
	up := upstream(t, demoupstream.Config{Rate: 200})
	snk := &memSink{}
	s := New(testConfig(t, snk, "seq"), "k", up.URL("k"), 0)
	stop := run(s)
	waitFor(t, 5*time.Second, "messages", func() bool { return len(snk.seqs()) >= 20 })
	c := &testCut{s: s, snk: snk, up: up}
	stop(c)
	if n := c.cuts.Load(); n != 1 {
		t.Fatalf("Cut ran %d times, want once", n)
	}
	if c.lastSeq == 0 || c.sinkLast != c.lastSeq {
		t.Fatalf("at the cut: LastSeq %d, last at the sink %d: want equal, nonzero", c.lastSeq, c.sinkLast)
	}
	if c.clientsAtCut != 1 {
		t.Fatalf("the upstream held %d sockets at the cut, want 1 (closed only after)", c.clientsAtCut)
	}
	if got := s.LastSeq(); got != c.lastSeq {
		t.Fatalf("delivered %d after the cut (LastSeq %d at the cut)", got, c.lastSeq)
	}
	contiguous(t, snk.seqs(), 1)
	waitFor(t, 5*time.Second, "the socket closed", func() bool { return up.Stats("k").Clients == 0 })
}
