package stream

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/sockfleet/sockfleet/shared/local/demoupstream"
	"github.com/sockfleet/sockfleet/worker/internal/metrics"
	"github.com/sockfleet/sockfleet/worker/internal/sink"
)

// BenchmarkStreamToFileSink measures one stream delivering from an in-process demo
// upstream (sending as fast as it is read, 64-byte payloads) to a file sink. Both
// ends share the machine's cores, so this is a floor for the worker alone.
func BenchmarkStreamToFileSink(b *testing.B) {
	up, err := demoupstream.Listen("127.0.0.1:0", demoupstream.Config{Rate: -1, Size: 64})
	if err != nil {
		b.Fatal(err)
	}
	defer up.Close()
	snk, err := sink.OpenFile(filepath.Join(b.TempDir(), "out.jsonl"))
	if err != nil {
		b.Fatal(err)
	}
	defer snk.Close()
	seq, _ := ParseSeqPath("seq")
	cfg := &Config{SeqPath: seq, Sink: snk, Metrics: new(metrics.Counters)}
	if err := cfg.Fill(); err != nil {
		b.Fatal(err)
	}
	s := New(cfg, "bench", up.URL("bench"), 0)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	for s.LastSeq() == 0 {
		time.Sleep(time.Millisecond)
	}
	b.ResetTimer()
	start := s.LastSeq()
	for s.LastSeq() < start+int64(b.N) {
		time.Sleep(100 * time.Microsecond)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}
