package stream

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sockfleet/sockfleet/shared/local/demoupstream"
	"github.com/sockfleet/sockfleet/worker/internal/metrics"
	"github.com/sockfleet/sockfleet/worker/internal/sink"
)

// memSink records acknowledged messages; it fails while fail is set.
type memSink struct {
	mu   sync.Mutex
	msgs []sink.Message
	fail atomic.Bool
}

func (s *memSink) Write(_ context.Context, b []sink.Message) error {
	if s.fail.Load() {
		return errors.New("sink down")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.msgs = append(s.msgs, b...)
	return nil
}

func (s *memSink) Close() error { return nil }

func (s *memSink) seqs() []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]int64, 0, len(s.msgs))
	for _, m := range s.msgs {
		if !m.Bad {
			out = append(out, m.Seq)
		}
	}
	return out
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func upstream(t *testing.T, cfg demoupstream.Config) *demoupstream.Server {
	t.Helper()
	s, err := demoupstream.Listen("127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func testConfig(t *testing.T, snk sink.Sink, seqPath string) *Config {
	t.Helper()
	p, err := ParseSeqPath(seqPath)
	if err != nil {
		t.Fatal(err)
	}
	c := &Config{
		SeqPath: p, Sink: snk, Metrics: new(metrics.Counters),
		PongWait: time.Second, PingPeriod: 200 * time.Millisecond,
		BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond, PermanentBackoffMax: 800 * time.Millisecond,
		StableAfter: time.Hour, Jitter: func() float64 { return 0.5 },
	}
	if err := c.Fill(); err != nil {
		t.Fatal(err)
	}
	return c
}

// run starts s and returns a stop function that cancels with cause and waits.
func run(s *Stream) func(cause error) {
	ctx, cancel := context.WithCancelCause(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	return func(cause error) { cancel(cause); <-done }
}

// contiguous checks seqs run first, first+1, ... without gap or repeat.
func contiguous(t *testing.T, seqs []int64, first int64) {
	t.Helper()
	for i, s := range seqs {
		if s != first+int64(i) {
			t.Fatalf("seq[%d] = %d, want %d (seqs %v...)", i, s, first+int64(i), seqs[:min(len(seqs), i+3)])
		}
	}
}

func TestStreamsAndResumes(t *testing.T) {
	up := upstream(t, demoupstream.Config{Rate: 500, Size: 8})
	snk := &memSink{}
	cfg := testConfig(t, snk, "seq")
	s := New(cfg, "c1", up.URL("c1"), 100)
	stop := run(s)
	waitFor(t, 5*time.Second, "50 messages", func() bool { return len(snk.seqs()) >= 50 })
	// A dropped socket is redialed resuming after the acknowledged sequence.
	up.Drop("c1")
	n := len(snk.seqs())
	waitFor(t, 5*time.Second, "messages after the drop", func() bool { return len(snk.seqs()) >= n+50 })
	stop(ErrGraceful)
	seqs := snk.seqs()
	contiguous(t, seqs, 101)
	if got := s.LastSeq(); got != seqs[len(seqs)-1] {
		t.Fatalf("LastSeq %d, last delivered %d", got, seqs[len(seqs)-1])
	}
	if cfg.Metrics.Reconnects.Load() < 1 {
		t.Fatal("reconnect not counted")
	}
	if up.Stats("c1").MaxClients != 1 {
		t.Fatal("two sockets at once")
	}
}

func TestCounterSequence(t *testing.T) {
	up := upstream(t, demoupstream.Config{Rate: -1})
	snk := &memSink{}
	s := New(testConfig(t, snk, ""), "c", up.URL("c"), 0)
	stop := run(s)
	waitFor(t, 5*time.Second, "messages", func() bool { return len(snk.seqs()) >= 100 })
	stop(ErrGraceful)
	contiguous(t, snk.seqs(), 1)
}

func TestGarbageIsCountedNotFatal(t *testing.T) {
	for _, policy := range []BadPolicy{BadCount, BadSkip, BadPass} {
		t.Run(string(policy), func(t *testing.T) {
			up := upstream(t, demoupstream.Config{Rate: 300})
			snk := &memSink{}
			cfg := testConfig(t, snk, "seq")
			cfg.BadMessages = policy
			s := New(cfg, "g", up.URL("g"), 0)
			stop := run(s)
			waitFor(t, 5*time.Second, "messages", func() bool { return len(snk.seqs()) >= 5 })
			up.Garbage("g", 3)
			waitFor(t, 5*time.Second, "3 bad messages", func() bool { return cfg.Metrics.BadMessages.Load() == 3 })
			n := len(snk.seqs())
			waitFor(t, 5*time.Second, "messages after the garbage", func() bool { return len(snk.seqs()) >= n+5 })
			stop(ErrGraceful)
			contiguous(t, snk.seqs(), 1)
			if cfg.Metrics.Reconnects.Load() != 0 {
				t.Fatal("garbage caused a reconnect")
			}
			snk.mu.Lock()
			bad := 0
			for _, m := range snk.msgs {
				if m.Bad {
					bad++
				}
			}
			snk.mu.Unlock()
			if want := map[BadPolicy]int{BadPass: 3}[policy]; bad != want {
				t.Fatalf("%d bad messages passed on, want %d", bad, want)
			}
		})
	}
}

func TestRefusalsBackOff(t *testing.T) {
	// Backoff from 20ms doubling, jitter fixed at 0.5 (3/4 of each step), capped at
	// 200ms (transient: tries at 0, 15, 45, 105, 225, then every 150ms: 13 in 1.5s)
	// or 800ms (permanent: 0, 15, 45, 105, 225, 465, 945: 7 in 1.5s).
	cases := []struct {
		status    int
		permanent bool
		most      int
	}{{http.StatusForbidden, true, 8}, {http.StatusServiceUnavailable, false, 14}}
	for _, tc := range cases {
		t.Run(http.StatusText(tc.status), func(t *testing.T) {
			up := upstream(t, demoupstream.Config{Rate: 100})
			up.Refuse("r", tc.status)
			snk := &memSink{}
			cfg := testConfig(t, snk, "seq")
			s := New(cfg, "r", up.URL("r"), 0)
			stop := run(s)
			time.Sleep(1500 * time.Millisecond)
			refused := up.Stats("r").Refused
			st := s.Status()
			if refused < 5 || refused > tc.most {
				t.Fatalf("%d handshakes in 1.5s: backoff not applied", refused)
			}
			if st.State != "backoff" || strings.Contains(st.Error, "permanent") != tc.permanent ||
				!strings.Contains(st.Error, http.StatusText(tc.status)[:3]) && !strings.Contains(st.Error, "status") {
				t.Fatalf("status %+v", st)
			}
			up.Refuse("r", 0)
			waitFor(t, 5*time.Second, "streaming after the refusals end", func() bool { return len(snk.seqs()) > 0 })
			stop(ErrGraceful)
		})
	}
}

func TestPolicyCloseIsPermanent(t *testing.T) {
	up := upstream(t, demoupstream.Config{Rate: 100})
	snk := &memSink{}
	cfg := testConfig(t, snk, "seq")
	s := New(cfg, "p", up.URL("p"), 0)
	stop := run(s)
	defer stop(ErrGraceful)
	waitFor(t, 5*time.Second, "messages", func() bool { return len(snk.seqs()) > 0 })
	up.CloseWith("p", 1008, "not allowed")
	waitFor(t, 5*time.Second, "permanent backoff", func() bool {
		st := s.Status()
		return st.State == "backoff" && strings.Contains(st.Error, "permanent")
	})
}

func TestStalledUpstreamIsRedialed(t *testing.T) {
	up := upstream(t, demoupstream.Config{Rate: 200})
	snk := &memSink{}
	cfg := testConfig(t, snk, "seq")
	s := New(cfg, "s", up.URL("s"), 0)
	stop := run(s)
	defer stop(ErrGraceful)
	waitFor(t, 5*time.Second, "messages", func() bool { return len(snk.seqs()) > 0 })
	up.Stall("s", true)
	// No data and no pongs: the read deadline (PongWait 1s) ends the socket.
	waitFor(t, 5*time.Second, "a redial", func() bool { return cfg.Metrics.Reconnects.Load() >= 1 })
	up.Stall("s", false)
	n := len(snk.seqs())
	waitFor(t, 5*time.Second, "messages after the stall", func() bool { return len(snk.seqs()) > n })
}

func TestSinkFailureHoldsLastSeq(t *testing.T) {
	up := upstream(t, demoupstream.Config{Rate: 300})
	snk := &memSink{}
	cfg := testConfig(t, snk, "seq")
	s := New(cfg, "k", up.URL("k"), 0)
	stop := run(s)
	waitFor(t, 5*time.Second, "messages", func() bool { return len(snk.seqs()) >= 10 })
	snk.fail.Store(true)
	time.Sleep(50 * time.Millisecond)
	held := s.LastSeq()
	time.Sleep(200 * time.Millisecond)
	if s.LastSeq() != held {
		t.Fatal("LastSeq moved while the sink failed")
	}
	if cfg.Metrics.SinkErrors.Load() == 0 {
		t.Fatal("sink errors not counted")
	}
	snk.fail.Store(false)
	waitFor(t, 5*time.Second, "recovery", func() bool { return s.LastSeq() > held+10 })
	stop(ErrGraceful)
	contiguous(t, snk.seqs(), 1)
}

func TestSetURLRedials(t *testing.T) {
	a := upstream(t, demoupstream.Config{Rate: 200})
	b := upstream(t, demoupstream.Config{Rate: 200})
	snk := &memSink{}
	s := New(testConfig(t, snk, "seq"), "u", a.URL("u"), 0)
	stop := run(s)
	defer stop(ErrGraceful)
	waitFor(t, 5*time.Second, "messages from a", func() bool { return len(snk.seqs()) > 0 })
	s.SetURL(b.URL("u"))
	waitFor(t, 5*time.Second, "a client on b", func() bool { return b.Stats("u").Clients == 1 })
	waitFor(t, 5*time.Second, "a's client gone", func() bool { return a.Stats("u").Clients == 0 })
}

// gatedSink blocks its first write until open is closed, telling entered when it
// is in; it records what it acknowledged.
type gatedSink struct {
	memSink
	once    sync.Once
	entered chan struct{}
	open    chan struct{}
	first   int // the first batch's size, set before entered is closed
}

func (g *gatedSink) Write(ctx context.Context, b []sink.Message) error {
	first := false
	g.once.Do(func() { first = true })
	if first {
		g.first = len(b)
		close(g.entered)
		<-g.open
	}
	return g.memSink.Write(ctx, b)
}

// A hard stop (a lost lease) completes the sink write in flight, and drops what the
// reader queued behind it: nothing reaches the sink after the stop.
func TestHardStopDropsQueued(t *testing.T) {
	up := upstream(t, demoupstream.Config{Rate: 2000})
	snk := &gatedSink{entered: make(chan struct{}), open: make(chan struct{})}
	s := New(testConfig(t, snk, "seq"), "h", up.URL("h"), 0)
	ctx, cancel := context.WithCancelCause(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	<-snk.entered // the first batch is in the sink; the reader queues what follows
	queue := s.queue
	waitFor(t, 5*time.Second, "a full queue behind the write", func() bool { return len(queue) == cap(queue) })
	cancel(errors.New("lease lost"))
	close(snk.open)
	<-done
	got := snk.seqs()
	if len(got) != snk.first {
		t.Fatalf("%d messages delivered; want only the %d of the batch in flight at the stop (%d were queued behind it)",
			len(got), snk.first, cap(queue))
	}
	contiguous(t, got, 1)
	if last := s.LastSeq(); last != got[len(got)-1] {
		t.Fatalf("LastSeq %d, last delivered %d", last, got[len(got)-1])
	}
	waitFor(t, 2*time.Second, "socket closed", func() bool { return up.Stats("h").Clients == 0 })
}

func TestBackoff(t *testing.T) {
	min, cap := 100*time.Millisecond, time.Second
	cases := []struct {
		n      int
		jitter float64
		want   time.Duration
	}{
		{0, 0, 50 * time.Millisecond},
		{0, 0.999999, 100 * time.Millisecond},
		{1, 0, 100 * time.Millisecond},
		{3, 0.5, 600 * time.Millisecond},
		{4, 0, 500 * time.Millisecond}, // capped
		{60, 0.999999, time.Second},    // no overflow
	}
	for _, tc := range cases {
		if got := Backoff(tc.n, min, cap, tc.jitter); (got - tc.want).Abs() > time.Microsecond {
			t.Errorf("Backoff(%d, jitter %v) = %s, want %s", tc.n, tc.jitter, got, tc.want)
		}
	}
}

func TestResume(t *testing.T) {
	cases := []struct {
		spec, url, wantURL, wantHeader string
		err                            bool
	}{
		{"", "ws://h/s?x=1", "ws://h/s?x=1&from=41", "", false},
		{"query:after={next}", "ws://h/s", "ws://h/s?after=42", "", false},
		{"header:Last-Event-ID={seq}", "ws://h/s", "ws://h/s", "41", false},
		{"none", "ws://h/s", "ws://h/s", "", false},
		{"cookie:x={seq}", "", "", "", true},
		{"query:from", "", "", "", true},
	}
	for _, tc := range cases {
		r, err := ParseResume(tc.spec)
		if (err != nil) != tc.err {
			t.Fatalf("ParseResume(%q) err %v", tc.spec, err)
		}
		if err != nil {
			continue
		}
		u, h, err := r.Apply(tc.url, 41)
		if err != nil || u != tc.wantURL || h.Get("Last-Event-ID") != tc.wantHeader {
			t.Errorf("%q: got %q %v %v", tc.spec, u, h, err)
		}
	}
}

func TestSeqPath(t *testing.T) {
	cases := []struct {
		path, data string
		want       int64
		ok         bool
	}{
		{"seq", `{"seq":7}`, 7, true},
		{"seq", `{"seq":"8"}`, 8, true},
		{"m.o", `{"m":{"o":9}}`, 9, true},
		{"seq", `{"seq":-1}`, 0, false},
		{"seq", `{"seq":1.5}`, 0, false},
		{"seq", `not json`, 0, false},
		{"seq", `[1]`, 0, false},
		{"m.o", `{"m":3}`, 0, false},
	}
	for _, tc := range cases {
		p, _ := ParseSeqPath(tc.path)
		got, ok := p.Extract([]byte(tc.data))
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s in %s: %d %v", tc.path, tc.data, got, ok)
		}
	}
	if _, err := ParseSeqPath("a..b"); err == nil {
		t.Error("empty field accepted")
	}
}

func FuzzSeqPath(f *testing.F) {
	f.Add([]byte(`{"seq":1}`))
	f.Add([]byte(`{"m":{"o":"2"}}`))
	f.Add([]byte("\x00garbage"))
	p, _ := ParseSeqPath("m.o")
	f.Fuzz(func(t *testing.T, data []byte) {
		if n, ok := p.Extract(data); ok && n < 0 {
			t.Fatalf("negative sequence %d", n)
		}
	})
}

// Past its fence deadline a stream delivers nothing more, even while its context is
// still live (the owner's fence timer has not fired yet, as after a pause).
func TestNothingReachesTheSinkPastTheFence(t *testing.T) {
	up := upstream(t, demoupstream.Config{Rate: 500, Size: 8})
	snk := &memSink{}
	s := New(testConfig(t, snk, "seq"), "f", up.URL("f"), 0)
	var fenced atomic.Bool
	s.GuardWith(func() bool { return !fenced.Load() })
	stop := run(s)
	defer stop(ErrGraceful)
	waitFor(t, 5*time.Second, "messages before the fence", func() bool { return len(snk.seqs()) >= 20 })
	fenced.Store(true)
	time.Sleep(50 * time.Millisecond) // a write already past the check may finish
	n, last := len(snk.seqs()), s.LastSeq()
	time.Sleep(300 * time.Millisecond) // 150 more messages from the upstream meanwhile
	if got := len(snk.seqs()); got != n {
		t.Fatalf("%d messages delivered past the fence", got-n)
	}
	if s.LastSeq() != last {
		t.Fatalf("last_seq moved from %d to %d past the fence", last, s.LastSeq())
	}
}

// gateSink blocks every write until open is closed (or the write's context ends).
type gateSink struct {
	memSink
	open chan struct{}
}

func (s *gateSink) Write(ctx context.Context, b []sink.Message) error {
	select {
	case <-s.open:
		return s.memSink.Write(ctx, b)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// A sink slower than SinkSlowAfter shows as sink_slow in status and metrics, holds
// at most a batch and the short queue in memory, and the stream goes on once it
// answers: nothing skipped.
func TestSlowSinkShowsAndBoundsTheQueue(t *testing.T) {
	up := upstream(t, demoupstream.Config{Rate: 2000})
	snk := &gateSink{open: make(chan struct{})}
	cfg := testConfig(t, snk, "seq")
	cfg.SinkTimeout, cfg.SinkSlowAfter = 5*time.Second, 50*time.Millisecond
	s := New(cfg, "slow", up.URL("slow"), 0)
	stop := run(s)
	waitFor(t, 5*time.Second, "sink_slow", func() bool { return s.Status().State == "sink_slow" })
	if cfg.Metrics.SinkSlow.Load() != 1 || cfg.Metrics.SinkSlowWrites.Load() != 1 {
		t.Fatalf("slow gauge %d, slow writes %d; want 1, 1", cfg.Metrics.SinkSlow.Load(), cfg.Metrics.SinkSlowWrites.Load())
	}
	time.Sleep(300 * time.Millisecond) // the upstream sends 600 more meanwhile
	if q := cfg.Metrics.SinkQueued.Load(); q < 1 || q > int64(cfg.BatchSize) {
		t.Fatalf("queue depth %d while blocked; want 1..%d (a batch and the short queue at most)", q, cfg.BatchSize)
	}
	if s.Status().Error == "" {
		t.Fatal("sink_slow without a reason")
	}
	close(snk.open)
	waitFor(t, 5*time.Second, "streaming again", func() bool { return s.Status().State == "streaming" && len(snk.seqs()) > 100 })
	stop(ErrGraceful)
	contiguous(t, snk.seqs(), 1)
	if g := cfg.Metrics.SinkSlow.Load(); g != 0 {
		t.Fatalf("slow gauge %d after recovery", g)
	}
	if q := cfg.Metrics.SinkQueued.Load(); q != 0 {
		t.Fatalf("queue depth %d after stop", q)
	}
	if cfg.Metrics.SinkWrites.Load() == 0 || cfg.Metrics.SinkWriteNanos.Load() < int64(200*time.Millisecond) {
		t.Fatalf("sink latency not measured: %d writes, %d ns", cfg.Metrics.SinkWrites.Load(), cfg.Metrics.SinkWriteNanos.Load())
	}
}
