package app

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/sockfleet/sockfleet/shared/local/demoupstream"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/shared/wakeup"
	"github.com/sockfleet/sockfleet/worker/internal/sink"
)

// bookLog records every acknowledged record of every worker in one order, with
// its snapshot marker.
type bookLog struct {
	mu   sync.Mutex
	rows []bookRow
}

type bookRow struct {
	worker   string
	seq      int64
	snapshot bool
}

type bookSink struct {
	l      *bookLog
	worker string
}

func (s bookSink) Write(_ context.Context, b []sink.Message) error {
	s.l.mu.Lock()
	defer s.l.mu.Unlock()
	for _, m := range b {
		s.l.rows = append(s.l.rows, bookRow{worker: s.worker, seq: m.Seq, snapshot: m.Snapshot})
	}
	return nil
}

func (bookSink) Close() error { return nil }

func (l *bookLog) get() []bookRow {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]bookRow(nil), l.rows...)
}

func (l *bookLog) count(worker string) int {
	n := 0
	for _, r := range l.get() {
		if r.worker == worker && !r.snapshot {
			n++
		}
	}
	return n
}

// rebuild replays the log as a consumer rebuilding an order book does: a snapshot
// sets the state at its sequence, each delta must follow the state by exactly one.
// It fails on a missing or repeated delta, and returns the snapshots and owners.
func (l *bookLog) rebuild(t *testing.T) (snaps int, owners []string) {
	t.Helper()
	rows := l.get()
	for i, r := range rows {
		if i == 0 || r.worker != rows[i-1].worker {
			owners = append(owners, r.worker)
		}
		if r.snapshot {
			if i > 0 && r.seq < rows[i-1].seq {
				t.Fatalf("record %d: %s's snapshot at %d after state at %d", i, r.worker, r.seq, rows[i-1].seq)
			}
			snaps++
			continue
		}
		if i > 0 && r.seq != rows[i-1].seq+1 {
			t.Fatalf("record %d: %s delivered delta %d after state at %d (%s): missing or repeated", i, r.worker, r.seq, rows[i-1].seq, rows[i-1].worker)
		}
	}
	return snaps, owners
}

// An order book behind a KuCoin-style token: the upstream refuses a handshake
// without a live token and closes a socket whose token lapses (2 s); the spec mints
// one before each dial, rotates before it lapses, and takes a snapshot after each
// connect and after a forward gap. Across rotations, a planned handoff and a gap,
// a consumer rebuilding the book from the sink misses and repeats nothing.
func TestTokenAndSnapshotAcrossRotationAndHandoff(t *testing.T) {
	e := newEnv(t, rate)
	up, err := demoupstream.Listen("127.0.0.1:0", demoupstream.Config{Rate: rate, Size: 16, RequireToken: true, TokenTTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close() })
	rest := "http://" + up.Addr()
	up.Touch("book")
	c := codec.Connection{ID: "book", DesiredState: schema.Started,
		WSURL: "{{token:data.instanceServers.0.endpoint}}/book?token={{token:data.token}}",
		Spec: schema.Spec{
			TokenRequest: &schema.TokenRequest{Request: schema.Request{Method: "POST", URL: rest + "/bullet"}, Expires: "data.expires_in"},
			Snapshot:     &schema.Snapshot{Request: schema.Request{URL: rest + "/snapshot/book"}, SeqPath: "seq", OnGap: schema.OnGapResync},
		}}
	it := codec.EncodeConnection(c)
	if back, err := codec.DecodeConnection(it); err != nil || back.Unrunnable() != nil {
		t.Fatalf("the item does not decode: %v %v", err, back.Unrunnable())
	}
	if _, err := e.db.DB.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: &e.db.Table, Item: it}); err != nil {
		t.Fatal(err)
	}
	var l bookLog
	// A backstop read every 300 ms compares the item's spec with the one streaming:
	// token_request and snapshot must read back equal, or the owner restarts it.
	w1 := e.worker("w1", opts{sink: bookSink{l: &l, worker: "w1"}, backstop: 300 * time.Millisecond})
	w2 := e.worker("w2", opts{sink: bookSink{l: &l, worker: "w2"}, backstop: 300 * time.Millisecond})
	e.wake(w1, wakeup.NeedsOwner, 0, "book")
	waitFor(t, 10*time.Second, "w1 rotating to a new token", func() bool { return w1.Metrics.Rotations.Load() >= 1 && l.count("w1") >= 100 })
	if r := e.wakeHandoff(w1, "book", "w2"); r.Result != wakeup.HandingOff {
		t.Fatalf("handoff wakeup: %+v", r)
	}
	waitFor(t, 10*time.Second, "w2 streaming", func() bool { return l.count("w2") >= 50 })
	up.Skip("book", 40)
	waitFor(t, 10*time.Second, "w2 resynced after the gap", func() bool { return w2.Metrics.SeqGaps.Load() == 1 && w2.Metrics.Snapshots.Load() >= 2 })
	rot := w2.Metrics.Rotations.Load()
	waitFor(t, 10*time.Second, "w2 rotating too", func() bool { return w2.Metrics.Rotations.Load() > rot })
	n := l.count("w2")
	waitFor(t, 5*time.Second, "more deltas", func() bool { return l.count("w2") >= n+50 })

	snaps, owners := l.rebuild(t)
	if len(owners) != 2 || owners[0] != "w1" || owners[1] != "w2" {
		t.Fatalf("deliverers %v, want w1 then w2", owners)
	}
	if first := l.get()[0]; !first.snapshot {
		t.Fatalf("first record %+v: want the snapshot", first)
	}
	ts := up.TokenStats()
	if ts.ExpiredCloses != 0 || up.Stats("book").Refused != 0 {
		t.Fatalf("token stats %+v, refused %d: want every socket rotated before its token lapsed", ts, up.Stats("book").Refused)
	}
	if w1.Metrics.Reconnects.Load()+w2.Metrics.Reconnects.Load() != 0 {
		t.Fatal("a socket broke: want only rotations and the handoff")
	}
	if a, c := w1.Metrics.Acquisitions.Load(), e.get("book"); a != 1 || c.LeaseOwner != "w2" || c.Status == "restarting" {
		t.Fatalf("w1 acquired %d times; item %+v: want one acquisition and no restart", a, c)
	}
	t.Logf("%d snapshots, %d tokens minted, rotations w1 %d w2 %d", snaps, ts.Minted, w1.Metrics.Rotations.Load(), w2.Metrics.Rotations.Load())
}
