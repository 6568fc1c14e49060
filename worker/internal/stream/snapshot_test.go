package stream

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sockfleet/sockfleet/shared/local/demoupstream"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/worker/internal/sink"
)

// rebuild replays msgs as a consumer rebuilding state does: a snapshot sets the
// state at its sequence, a delta must follow the state by exactly one. It fails on
// a delta that repeats or skips (after the first record), and returns the number
// of snapshots.
func rebuild(t *testing.T, msgs []sink.Message) int {
	t.Helper()
	snaps, have, at := 0, false, int64(0)
	for i, m := range msgs {
		switch {
		case m.Bad:
			continue
		case m.Snapshot:
			if have && m.Seq < at {
				t.Fatalf("record %d: snapshot at %d after deltas up to %d", i, m.Seq, at)
			}
			snaps++
		case have && m.Seq != at+1:
			t.Fatalf("record %d: delta %d after state at %d (missing or repeated)", i, m.Seq, at)
		}
		have, at = true, m.Seq
	}
	return snaps
}

func snapshotSpec(restBase, id string) schema.Spec {
	return schema.Spec{Snapshot: &schema.Snapshot{Request: schema.Request{URL: restBase + "/snapshot/" + id}, SeqPath: "seq"}}
}

// After connect a snapshot is the first record, and the deltas it covers are not
// delivered; the next delta follows it.
func TestSnapshotAfterConnectDropsCoveredDeltas(t *testing.T) {
	up := upstream(t, demoupstream.Config{Rate: 200, Size: 8})
	up.Touch("c1")
	time.Sleep(300 * time.Millisecond) // some history for the snapshot to cover
	snk := &memSink{}
	cfg := testConfig(t, snk, "seq")
	sp := snapshotSpec("http://"+up.Addr(), "c1")
	sp.Start = schema.StartEarliest // the upstream replays from 1: the snapshot covers the replay
	s := specStream(t, cfg, up.URL("c1"), "c1", 0, sp)
	stop := run(s)
	waitFor(t, 5*time.Second, "deltas after the snapshot", func() bool { return len(snk.all()) >= 20 })
	stop(ErrGraceful)
	msgs := snk.all()
	if !msgs[0].Snapshot || msgs[0].Seq < 40 || !strings.Contains(string(msgs[0].Data), `"book"`) {
		t.Fatalf("first record %+v: want the snapshot, covering the history", msgs[0])
	}
	if n := rebuild(t, msgs); n != 1 {
		t.Fatalf("%d snapshots", n)
	}
	if s.LastSeq() != msgs[len(msgs)-1].Seq {
		t.Fatalf("LastSeq %d", s.LastSeq())
	}
}

// A snapshot older than what was already delivered is fetched again and then
// not delivered; the status says so and the deltas go on without a gap.
func TestSnapshotOlderThanTheStream(t *testing.T) {
	up := upstream(t, demoupstream.Config{Rate: 200, Size: 8})
	up.Touch("c1")
	up.SnapshotLag("c1", 1_000_000) // the REST side lags far behind: seq 0
	time.Sleep(600 * time.Millisecond)
	snk := &memSink{}
	cfg := testConfig(t, snk, "seq")
	s := specStream(t, cfg, up.URL("c1"), "c1", 100, snapshotSpec("http://"+up.Addr(), "c1"))
	stop := run(s)
	waitFor(t, 5*time.Second, "the stale snapshot counted", func() bool { return cfg.Metrics.SnapshotsStale.Load() == 1 })
	waitFor(t, 5*time.Second, "deltas", func() bool { return len(snk.all()) >= 20 })
	st := s.Status()
	stop(ErrGraceful)
	for _, m := range snk.all() {
		if m.Snapshot {
			t.Fatalf("stale snapshot delivered: %+v", m)
		}
	}
	contiguous(t, snk.seqs(), 101)
	if !strings.Contains(st.Error, "older than the stream") || !strings.Contains(st.Error, "seq 100 is already delivered") {
		t.Fatalf("status %+v", st)
	}
	if n := up.TokenStats().Snapshots; n != snapshotTries {
		t.Fatalf("%d snapshot requests, want %d", n, snapshotTries)
	}
}

// With on_gap resync a forward gap brings a snapshot that covers it, before the
// deltas after it: a consumer rebuilding state misses nothing.
func TestGapResyncDeliversASnapshot(t *testing.T) {
	up := upstream(t, demoupstream.Config{Rate: 200, Size: 8})
	snk := &memSink{}
	cfg := testConfig(t, snk, "seq")
	sp := snapshotSpec("http://"+up.Addr(), "c1")
	sp.Snapshot.OnGap = schema.OnGapResync
	s := specStream(t, cfg, up.URL("c1"), "c1", 0, sp)
	stop := run(s)
	waitFor(t, 5*time.Second, "streaming", func() bool { return len(snk.all()) >= 30 })
	up.Skip("c1", 40)
	waitFor(t, 5*time.Second, "a second snapshot", func() bool { return cfg.Metrics.Snapshots.Load() >= 2 })
	n := len(snk.all())
	waitFor(t, 5*time.Second, "deltas after it", func() bool { return len(snk.all()) >= n+20 })
	st := s.Status()
	stop(ErrGraceful)
	if g := cfg.Metrics.SeqGaps.Load(); g != 1 {
		t.Fatalf("%d gaps counted, want 1", g)
	}
	if k := rebuild(t, snk.all()); k != 2 {
		t.Fatalf("%d snapshots, want 2", k)
	}
	if !strings.Contains(st.Error, "resynced by a snapshot") {
		t.Fatalf("status %+v", st)
	}
}

// Without resync the same gap is counted and the deltas go on; no snapshot.
func TestGapWithoutResyncIsCounted(t *testing.T) {
	up := upstream(t, demoupstream.Config{Rate: 200, Size: 8})
	snk := &memSink{}
	cfg := testConfig(t, snk, "seq")
	s := specStream(t, cfg, up.URL("c1"), "c1", 0, snapshotSpec("http://"+up.Addr(), "c1"))
	stop := run(s)
	waitFor(t, 5*time.Second, "streaming", func() bool { return len(snk.all()) >= 30 })
	up.Skip("c1", 40)
	waitFor(t, 5*time.Second, "the gap", func() bool { return cfg.Metrics.SeqGaps.Load() == 1 })
	stop(ErrGraceful)
	if n := cfg.Metrics.Snapshots.Load(); n != 1 {
		t.Fatalf("%d snapshots, want the connect's only", n)
	}
}

// A snapshot endpoint that fails leaves the stream streaming without a snapshot,
// the status naming the failure: a 500, an answer without the sequence, a huge
// answer (over the read limit), a timeout.
func TestSnapshotFailures(t *testing.T) {
	cases := []struct {
		name   string
		answer func(w http.ResponseWriter, r *http.Request)
		want   string
	}{
		{"500", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "x", 500) }, "status 500"},
		{"no sequence", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte(`{"lastUpdateId":5}`)) }, "no sequence at seq"},
		{"huge", func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write([]byte(`{"seq":5,"b":"` + strings.Repeat("x", 2<<20) + `"}`))
		}, "answer over 1048576 bytes"},
		{"timeout", func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
			case <-time.After(3 * time.Second):
			}
		}, "no answer within 100ms"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rest := httptest.NewServer(http.HandlerFunc(c.answer))
			defer rest.Close()
			up := upstream(t, demoupstream.Config{Rate: 200, Size: 8})
			snk := &memSink{}
			cfg := testConfig(t, snk, "seq")
			sp := snapshotSpec(rest.URL, "c1")
			sp.Snapshot.Timeout = 5 * time.Second // reading the huge answer takes time under load
			if c.name == "timeout" {
				sp.Snapshot.Timeout = 100 * time.Millisecond
			}
			s := specStream(t, cfg, up.URL("c1"), "c1", 0, sp)
			stop := run(s)
			waitFor(t, 5*time.Second, "the failure counted", func() bool { return cfg.Metrics.SnapshotErrors.Load() == 1 })
			// The status is set after the count: wait for it rather than read it once.
			var st Status
			waitFor(t, 5*time.Second, "the failure in the status", func() bool {
				st = s.Status()
				return strings.Contains(st.Error, c.want)
			})
			waitFor(t, 5*time.Second, "deltas", func() bool { return len(snk.all()) >= 10 })
			stop(ErrGraceful)
			if !strings.Contains(st.Error, c.want) || !strings.Contains(st.Error, "streaming without it") {
				t.Fatalf("status %+v: want %q", st, c.want)
			}
			contiguous(t, snk.seqs(), 1)
		})
	}
}

// A snapshot needs a sequence path: without one the connection is invalid.
func TestSnapshotNeedsASequence(t *testing.T) {
	cfg := testConfig(t, &memSink{}, "")
	s := specStream(t, cfg, "ws://127.0.0.1:1/x", "c1", 0, snapshotSpec("http://127.0.0.1:1", "c1"))
	stop := run(s)
	waitFor(t, 5*time.Second, "status invalid", func() bool { return s.Status().State == schema.StatusInvalid })
	stop(ErrGraceful)
	if !strings.Contains(s.Status().Error, "snapshot: needs a seq_path") {
		t.Fatalf("status %+v", s.Status())
	}
}

// Many connections of one host fetch their snapshots at most RESTPerHost at once.
func TestSnapshotRequestsPerHostAreBounded(t *testing.T) {
	up := upstream(t, demoupstream.Config{Rate: 100, Size: 8})
	var inFlight, peak, served atomic.Int64
	rest := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		time.Sleep(50 * time.Millisecond)
		inFlight.Add(-1)
		served.Add(1)
		_, _ = w.Write([]byte(`{"seq":0}`))
	}))
	defer rest.Close()
	snk := &memSink{}
	cfg := testConfig(t, snk, "seq")
	cfg.RESTPerHost, cfg.rest = 2, newHostSlots(2)
	var stops []func(error)
	for i := range 12 {
		id := fmt.Sprintf("c%d", i)
		stops = append(stops, run(specStream(t, cfg, up.URL(id), id, 0, snapshotSpec(rest.URL, id))))
	}
	waitFor(t, 10*time.Second, "every snapshot", func() bool { return served.Load() == 12 })
	for _, stop := range stops {
		stop(ErrGraceful)
	}
	if p := peak.Load(); p != 2 {
		t.Fatalf("peak of %d snapshot requests in flight, want 2", p)
	}
}

func TestHostSlots(t *testing.T) {
	h := newHostSlots(1)
	rel, err := h.acquire(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := h.acquire(ctx, "a"); err == nil {
		t.Fatal("a second slot of a full host")
	}
	relB, err := h.acquire(context.Background(), "b")
	if err != nil {
		t.Fatal("another host waits on a full one")
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		r, err := h.acquire(context.Background(), "a")
		if err == nil {
			r()
		}
	})
	rel()
	wg.Wait()
	relB()
	if len(h.m) != 0 || len(h.users) != 0 {
		t.Fatalf("unused hosts kept: %v %v", h.m, h.users)
	}
}

// A resync whose snapshot does not reach the gap (the REST side lags) delivers the
// delta after the gap, as without resync, and says so.
func TestGapResyncWithALaggingSnapshot(t *testing.T) {
	up := upstream(t, demoupstream.Config{Rate: 200, Size: 8})
	snk := &memSink{}
	cfg := testConfig(t, snk, "seq")
	sp := snapshotSpec("http://"+up.Addr(), "c1")
	sp.Snapshot.OnGap = schema.OnGapResync
	s := specStream(t, cfg, up.URL("c1"), "c1", 0, sp)
	stop := run(s)
	waitFor(t, 5*time.Second, "streaming", func() bool { return len(snk.all()) >= 30 })
	up.SnapshotLag("c1", 1_000_000)
	up.Skip("c1", 40)
	waitFor(t, 5*time.Second, "the stale resync counted", func() bool { return cfg.Metrics.SnapshotsStale.Load() == 1 })
	n := len(snk.all())
	waitFor(t, 5*time.Second, "deltas after the gap", func() bool { return len(snk.all()) >= n+10 })
	st := s.Status()
	stop(ErrGraceful)
	if k := cfg.Metrics.Snapshots.Load(); k != 1 {
		t.Fatalf("%d snapshots, want the connect's only", k)
	}
	if !strings.Contains(st.Error, "not resynced: snapshot at seq 0 is older than the stream: the gap ends at seq") {
		t.Fatalf("status %+v", st)
	}
	seqs := snk.seqs()
	for i := 2; i < len(seqs); i++ { // after the snapshot: one jump of 40, else one by one
		if d := seqs[i] - seqs[i-1]; d != 1 && d != 41 {
			t.Fatalf("seq %d after %d", seqs[i], seqs[i-1])
		}
	}
}
