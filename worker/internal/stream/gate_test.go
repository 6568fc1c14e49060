package stream

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sockfleet/sockfleet/shared/local/ddbtest"
	"github.com/sockfleet/sockfleet/shared/local/demoupstream"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/worker/internal/connquota"
)

func TestMain(m *testing.M) { ddbtest.Main(m) }

// fleetConfig is one worker's stream config: its own client of the shared table,
// its own gate, n dials per w fleet-wide (n = 0: holds only).
func fleetConfig(t *testing.T, env *ddbtest.Env, n int, w time.Duration) *Config {
	t.Helper()
	cfg := testConfig(t, &memSink{}, "seq")
	cfg.Gate = &TableGate{Store: &connquota.Store{DB: env.Client(nil), Table: env.Table}, N: n, W: w,
		Local: &LocalGate{}, Metrics: cfg.Metrics}
	return cfg
}

// A 429 with Retry-After: 7 on one worker holds back the next dial of that host on
// every worker (one with a quota, one without) for at least 7 s, and says so in the
// status; then both stream.
func TestRetryAfterHoldsEveryWorker(t *testing.T) {
	env := ddbtest.New(t)
	up := upstream(t, demoupstream.Config{Rate: 50})
	up.Refuse("", http.StatusTooManyRequests)
	up.RetryAfter("7")
	cfgA, cfgB := fleetConfig(t, env, 100, time.Minute), fleetConfig(t, env, 0, 0)
	a := New(cfgA, "a", up.URL("a"), 0)
	defer run(a)(ErrGraceful)
	waitFor(t, 5*time.Second, "a rate limited", func() bool { return a.Status().State == schema.StatusRateLimited })
	if st := a.Status(); !strings.Contains(st.Error, "status 429") || !strings.Contains(st.Error, "retry after 7s") {
		t.Fatalf("a's status %+v", st)
	}
	up.Refuse("", 0)
	b := New(cfgB, "b", up.URL("b"), 0)
	defer run(b)(ErrGraceful)
	waitFor(t, 5*time.Second, "b held", func() bool { return b.Status().State == schema.StatusRateLimited })
	if st := b.Status(); !strings.Contains(st.Error, "asked (429/418 Retry-After) for no dial before") {
		t.Fatalf("b's status %+v", st)
	}
	waitFor(t, 15*time.Second, "both streaming", func() bool {
		return a.Status().State == "streaming" && b.Status().State == "streaming"
	})
	var refused time.Time
	for _, e := range up.Events() {
		switch {
		case e.Kind == demoupstream.Refused && refused.IsZero():
			refused = e.Time
		case e.Kind == demoupstream.Refused || e.Kind == demoupstream.Connect:
			if d := e.Time.Sub(refused); refused.IsZero() || d < 7*time.Second {
				t.Errorf("%s %s %s after the 429, want >= 7s", e.Stream, e.Kind, d)
			}
		}
	}
	if cfgA.Metrics.RateLimited.Load() != 1 || cfgA.Metrics.QuotaTableErrors.Load()+cfgB.Metrics.QuotaTableErrors.Load() != 0 {
		t.Fatalf("rate limited %d, tableErrors %d+%d", cfgA.Metrics.RateLimited.Load(),
			cfgA.Metrics.QuotaTableErrors.Load(), cfgB.Metrics.QuotaTableErrors.Load())
	}
}

// Three workers, 30 streams to one host, 6 dials per second fleet-wide: the upstream
// never sees more than 6 handshakes in one of the quota's windows, and all stream.
func TestConnectQuotaHoldsAcrossWorkers(t *testing.T) {
	env := ddbtest.New(t)
	up := upstream(t, demoupstream.Config{Rate: 10})
	const n, w, workers, conns = 6, time.Second, 3, 30
	cfgs := make([]*Config, workers)
	for i := range cfgs {
		cfgs[i] = fleetConfig(t, env, n, w)
	}
	streams := make([]*Stream, conns)
	for i := range streams {
		id := fmt.Sprintf("q%02d", i)
		streams[i] = New(cfgs[i%workers], id, up.URL(id), 0)
		defer run(streams[i])(ErrGraceful)
	}
	waitFor(t, 20*time.Second, "all streaming", func() bool {
		for _, s := range streams {
			if s.Status().State != "streaming" {
				return false
			}
		}
		return true
	})
	per := map[int64]int{}
	for _, e := range up.Events() {
		if e.Kind == demoupstream.Connect {
			per[e.Time.UnixMilli()/w.Milliseconds()]++
		}
	}
	total := 0
	for win, c := range per {
		total += c
		if c > n {
			t.Errorf("window %d: %d handshakes, quota %d", win, c, n)
		}
	}
	if total != conns || len(per) < conns/n {
		t.Fatalf("%d handshakes in %d windows, want %d in at least %d", total, len(per), conns, conns/n)
	}
	waits := int64(0)
	for _, c := range cfgs {
		waits += c.Metrics.QuotaWaits.Load()
	}
	if waits < conns-n {
		t.Fatalf("%d dials waited, want at least %d", waits, conns-n)
	}
}

// Retry-After values: whole seconds, HTTP-dates, and what is not usable.
func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		in     string
		want   time.Duration
		capped bool
		bad    string
	}{
		{in: "7", want: 7 * time.Second},
		{in: " 0 ", want: 0},
		{in: "3600", want: time.Hour},
		{in: "3601", want: MaxRetryAfter, capped: true},
		{in: "259200", want: MaxRetryAfter, capped: true}, // Binance's 3-day ban
		{in: "99999999999999999999999", want: MaxRetryAfter, capped: true},
		{in: "Fri, 04 Dec 2026 12:00:30 GMT", want: 30 * time.Second},
		{in: "Friday, 04-Dec-26 12:00:30 GMT", want: 30 * time.Second}, // RFC 850, still valid
		{in: "Fri, 04 Dec 2026 11:00:00 GMT", want: 0},                 // past
		{in: "Sat, 05 Dec 2026 12:00:00 GMT", want: MaxRetryAfter, capped: true},
		{in: "", bad: "no Retry-After"},
		{in: "-5", bad: `Retry-After "-5"`},
		{in: "1.5", bad: `Retry-After "1.5"`},
		{in: "7s", bad: `Retry-After "7s"`},
		{in: "soon", bad: `Retry-After "soon"`},
		{in: "2026-12-04T12:00:30Z", bad: "want whole seconds or an HTTP-date"},
		{in: strings.Repeat("x", 500), bad: "…"},
	} {
		d, capped, err := parseRetryAfter(tc.in, now)
		if tc.bad != "" {
			if err == nil || !strings.Contains(err.Error(), tc.bad) || len(err.Error()) > 120 {
				t.Errorf("%q: %v, want an error with %q", tc.in, err, tc.bad)
			}
			continue
		}
		if err != nil || d != tc.want || capped != tc.capped {
			t.Errorf("%q: %s capped %v err %v; want %s capped %v", tc.in, d, capped, err, tc.want, tc.capped)
		}
	}
}

// A 429 or 418 with an unusable Retry-After is said in the status and backs off as
// any failure does, without holding the host; a usable one in the past does not
// hold it either.
func TestBadRetryAfterBacksOff(t *testing.T) {
	for _, tc := range []struct {
		code       int
		retryAfter string
		says       string
	}{
		{http.StatusTooManyRequests, "soon", `Retry-After "soon": want whole seconds or an HTTP-date; backing off`},
		{http.StatusTeapot, "", "status 418: websocket: bad handshake; no Retry-After; backing off"},
		{http.StatusTooManyRequests, "Thu, 01 Jan 2026 00:00:00 GMT", "retry after 0s"},
	} {
		t.Run(fmt.Sprint(tc.code, tc.retryAfter), func(t *testing.T) {
			env := ddbtest.New(t)
			up := upstream(t, demoupstream.Config{Rate: 50})
			up.Refuse("", tc.code)
			up.RetryAfter(tc.retryAfter)
			cfg := fleetConfig(t, env, 100, time.Minute)
			s := New(cfg, "c", up.URL("c"), 0)
			defer run(s)(ErrGraceful)
			waitFor(t, 5*time.Second, "rate limited", func() bool { return s.Status().State == schema.StatusRateLimited })
			if st := s.Status(); !strings.Contains(st.Error, tc.says) {
				t.Fatalf("status %+v, want %q", st, tc.says)
			}
			up.Refuse("", 0)
			// Backs off (testConfig: 20 ms to 200 ms), far less than any hold.
			waitFor(t, 3*time.Second, "streaming", func() bool { return s.Status().State == "streaming" })
		})
	}
}

// A table that cannot be reached: under a quota the dial waits and says why (the
// quota would otherwise be a per-worker guess); without one it dials.
func TestUnreachableTable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close() // nothing listens there now: every call is refused
	env := &ddbtest.Env{Endpoint: dead, Table: "unreachable"}
	for _, n := range []int{5, 0} {
		t.Run(fmt.Sprint("n=", n), func(t *testing.T) {
			up := upstream(t, demoupstream.Config{Rate: 50})
			cfg := fleetConfig(t, env, n, time.Minute)
			cfg.Gate.(*TableGate).Timeout = 200 * time.Millisecond
			s := New(cfg, "c", up.URL("c"), 0)
			defer run(s)(ErrGraceful)
			if n == 0 {
				waitFor(t, 5*time.Second, "streaming", func() bool { return s.Status().State == "streaming" })
				return
			}
			waitFor(t, 5*time.Second, "waiting", func() bool { return s.Status().State == schema.StatusQuotaWait })
			if st := s.Status(); !strings.Contains(st.Error, "waiting for the connect quota of 127.0.0.1 (5 per 1m0s): admit 127.0.0.1:") {
				t.Fatalf("status %+v", st)
			}
			// It asks again (a second later: a tenth of the window, at most 1 s), and
			// still does not dial.
			waitFor(t, 5*time.Second, "asked again", func() bool { return cfg.Metrics.QuotaTableErrors.Load() >= 2 })
			if st := up.Stats("c"); st.Connects != 0 || st.Refused != 0 || s.Status().State != schema.StatusQuotaWait {
				t.Fatalf("connects %d, refused %d, status %+v", st.Connects, st.Refused, s.Status())
			}
		})
	}
}

// Without a quota, a mass failover reads a host's hold once (per second), not once
// per dial, and writes nothing.
func TestNoQuotaReadsOncePerHost(t *testing.T) {
	env := ddbtest.New(t)
	up := upstream(t, demoupstream.Config{Rate: 10})
	db := &countingDB{DB: env.Client(nil)}
	cfg := testConfig(t, &memSink{}, "seq")
	cfg.Gate = &TableGate{Store: &connquota.Store{DB: db, Table: env.Table}, Local: &LocalGate{}, Metrics: cfg.Metrics}
	start := time.Now()
	streams := make([]*Stream, 20)
	for i := range streams {
		id := fmt.Sprintf("c%02d", i)
		streams[i] = New(cfg, id, up.URL(id), 0)
		defer run(streams[i])(ErrGraceful)
	}
	waitFor(t, 10*time.Second, "all streaming", func() bool {
		for _, s := range streams {
			if s.Status().State != "streaming" {
				return false
			}
		}
		return true
	})
	if most := int64(time.Since(start)/clearFor) + 1; db.reads.Load() > most || db.writes.Load() != 0 {
		t.Fatalf("%d reads (want at most %d) and %d writes for 20 dials", db.reads.Load(), most, db.writes.Load())
	}
}
