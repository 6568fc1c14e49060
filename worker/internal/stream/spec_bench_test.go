package stream

import (
	"context"
	"flag"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sockfleet/sockfleet/shared/local/demoupstream"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/worker/internal/metrics"
	"github.com/sockfleet/sockfleet/worker/internal/sink"
)

// Scale of the rotation and quota benchmarks. The defaults are the figures
// (minutes of wall time each); pass smaller ones after -args for a quick run, e.g.
// go test -run '^$' -bench Rotation ./worker/internal/stream/ -args -rotation.conns=100 -rotation.run=30s.
var (
	rotConns    = flag.Int("rotation.conns", 1000, "connections in BenchmarkRotation")
	rotLifetime = flag.Duration("rotation.lifetime", 30*time.Second, "max_lifetime in BenchmarkRotation")
	rotRun      = flag.Duration("rotation.run", 5*time.Minute, "how long BenchmarkRotation streams")
	rotRate     = flag.Float64("rotation.rate", 5, "messages per second per connection in BenchmarkRotation")
	quotaConns  = flag.Int("quota.conns", 500, "connections failing over at once in BenchmarkQuotaFailover")
	quotaN      = flag.Int("quota.n", 300, "connect quota: dials per window")
	quotaW      = flag.Duration("quota.window", 5*time.Minute, "connect quota: the window")
)

// checkSink checks each connection's sequences as they are acknowledged: a
// sequence below the next expected is a duplicate, one above it leaves a gap.
type checkSink struct {
	mu      sync.Mutex
	next    map[string]int64
	dups    int64
	missing int64
	total   atomic.Int64
}

func (c *checkSink) Write(_ context.Context, b []sink.Message) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range b {
		n, ok := c.next[m.Conn]
		switch {
		case !ok:
		case m.Seq < n:
			c.dups++
			continue
		case m.Seq > n:
			c.missing += m.Seq - n
		}
		c.next[m.Conn] = m.Seq + 1
	}
	c.total.Add(int64(len(b)))
	return nil
}

func (c *checkSink) Close() error { return nil }

func benchConfig(b *testing.B, snk sink.Sink) *Config {
	seq, _ := ParseSeqPath("seq")
	cfg := &Config{SeqPath: seq, Sink: snk, Metrics: new(metrics.Counters), StableAfter: time.Second}
	if err := cfg.Fill(); err != nil {
		b.Fatal(err)
	}
	return cfg
}

// BenchmarkRotation streams rotation.conns connections with max_lifetime
// rotation.lifetime for rotation.run, and reports the rotations done, the sequences
// missing at the sink and those delivered twice (goal: 0 and 0), and the most extra
// sockets held at once during overlaps.
func BenchmarkRotation(b *testing.B) {
	for range b.N {
		up, err := demoupstream.Listen("127.0.0.1:0", demoupstream.Config{Rate: *rotRate, Size: 32})
		if err != nil {
			b.Fatal(err)
		}
		snk := &checkSink{next: map[string]int64{}}
		cfg := benchConfig(b, snk)
		ctx, cancel := context.WithCancelCause(context.Background())
		var wg sync.WaitGroup
		for i := range *rotConns {
			id := fmt.Sprintf("r%05d", i)
			s := New(cfg, id, up.URL(id), 0)
			if err := s.UseSpec(schema.Spec{MaxLifetime: *rotLifetime}, 0); err != nil {
				b.Fatal(err)
			}
			wg.Go(func() { s.Run(ctx) })
		}
		time.Sleep(*rotRun)
		cancel(ErrGraceful)
		wg.Wait()
		up.Close()
		m := cfg.Metrics
		b.ReportMetric(float64(m.Rotations.Load()), "rotations")
		b.ReportMetric(float64(snk.missing), "missing")
		b.ReportMetric(float64(snk.dups), "duplicates")
		b.ReportMetric(float64(m.OverlapPeak.Load()), "peak-extra-sockets")
		b.ReportMetric(float64(m.Reconnects.Load()), "reconnects")
		b.ReportMetric(float64(snk.total.Load()), "delivered")
	}
}

// countingListener records when each connection to the upstream was accepted.
type countingListener struct {
	net.Listener
	mu    sync.Mutex
	times []time.Time
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.times = append(l.times, time.Now())
		l.mu.Unlock()
	}
	return c, err
}

// BenchmarkQuotaFailover starts quota.conns connections at once on one worker (a
// mass failover) against one upstream host under a quota.n per quota.window connect
// quota. It reports the most dials the upstream saw in any window (goal: at most
// quota.n) and the time until all stream, against what the quota allows
// (ceil(conns/n)-1 windows).
func BenchmarkQuotaFailover(b *testing.B) {
	for range b.N {
		up, err := demoupstream.Listen("127.0.0.1:0", demoupstream.Config{Rate: 1, Size: 16})
		if err != nil {
			b.Fatal(err)
		}
		// Count TCP accepts in front of the upstream: a proxy listener that forwards.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		cl := &countingListener{Listener: ln}
		go proxy(cl, up.Addr())
		snk := &checkSink{next: map[string]int64{}}
		cfg := benchConfig(b, snk)
		cfg.Quota = &Quota{N: *quotaN, W: *quotaW}
		ctx, cancel := context.WithCancelCause(context.Background())
		var wg sync.WaitGroup
		streams := make([]*Stream, *quotaConns)
		start := time.Now()
		for i := range streams {
			id := fmt.Sprintf("q%05d", i)
			streams[i] = New(cfg, id, "ws://"+ln.Addr().String()+"/streams/"+id, 0)
			wg.Go(func() { streams[i].Run(ctx) })
		}
		for {
			all := true
			for _, s := range streams {
				all = all && s.Status().State == "streaming"
			}
			if all {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		took := time.Since(start)
		cancel(ErrGraceful)
		wg.Wait()
		ln.Close()
		up.Close()
		cl.mu.Lock()
		most := 0
		for i, t := range cl.times {
			n := 0
			for _, u := range cl.times[i:] {
				if u.Sub(t) < *quotaW {
					n++
				}
			}
			most = max(most, n)
		}
		cl.mu.Unlock()
		allowed := time.Duration((*quotaConns+*quotaN-1) / *quotaN - 1) * *quotaW
		b.ReportMetric(float64(most), "max-dials-per-window")
		b.ReportMetric(took.Seconds(), "s-until-all-stream")
		b.ReportMetric(allowed.Seconds(), "s-quota-allows")
		b.ReportMetric(float64(cfg.Metrics.QuotaWaits.Load()), "dials-that-waited")
	}
}

// proxy forwards every connection accepted on l to addr.
func proxy(l net.Listener, addr string) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			u, err := net.Dial("tcp", addr)
			if err != nil {
				return
			}
			defer u.Close()
			done := make(chan struct{}, 2)
			go func() { copyConn(u, c); done <- struct{}{} }()
			go func() { copyConn(c, u); done <- struct{}{} }()
			<-done
		}()
	}
}

func copyConn(dst, src net.Conn) {
	buf := make([]byte, 4096)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
