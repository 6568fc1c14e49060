package stream

import (
	"bytes"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// Forward gaps are all counted, but logged once per socket: an upstream that skips
// numbers on every message must not flood the log.
func TestGapsCountedAndLoggedOnce(t *testing.T) {
	var logs bytes.Buffer
	var mu sync.Mutex
	cfg := testConfig(t, &memSink{}, "seq")
	cfg.Log = slog.New(slog.NewJSONHandler(syncWriter{&logs, &mu}, nil))
	s := New(cfg, "g", "ws://h/x", 0)
	tr := &tracker{s: s, sock: &socket{from: 10, resumed: true}, st: readState{last: 10, ref: true}, first: true}
	for _, seq := range []int{12, 15, 16, 20} { // gaps of 1, 2 and 3
		if _, ok, err := tr.next(frame{data: []byte(`{"seq":` + strconv.Itoa(seq) + `}`)}); !ok || err != nil {
			t.Fatalf("seq %d: queued %v, err %v", seq, ok, err)
		}
	}
	if g, m := cfg.Metrics.SeqGaps.Load(), cfg.Metrics.SeqGapMissing.Load(); g != 3 || m != 6 {
		t.Fatalf("gaps %d, missing %d; want 3 and 6", g, m)
	}
	mu.Lock()
	defer mu.Unlock()
	if n := strings.Count(logs.String(), "gap in the upstream's numbering"); n != 1 {
		t.Fatalf("%d gap log lines, want 1:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), `"missing":1`) {
		t.Fatalf("the gap log line does not say what is missing:\n%s", logs.String())
	}
}
