package app

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/local/demoupstream"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/shared/wakeup"
	"github.com/sockfleet/sockfleet/worker/internal/sink"
)

// payloads records, in one order across workers, the numbers in the payloads of a
// LiveHead upstream's messages each worker delivered.
type payloads struct {
	mu   sync.Mutex
	rows map[string][]numbered
	bad  int // delivered frames without a number
}

type numbered struct {
	worker string
	n      int64
}

type payloadSink struct {
	p      *payloads
	worker string
}

func (s payloadSink) Write(_ context.Context, b []sink.Message) error {
	s.p.mu.Lock()
	defer s.p.mu.Unlock()
	if s.p.rows == nil {
		s.p.rows = map[string][]numbered{}
	}
	for _, m := range b {
		n, ok := demoupstream.Number(m.Data)
		if !ok {
			s.p.bad++
			continue
		}
		s.p.rows[m.Conn] = append(s.p.rows[m.Conn], numbered{worker: s.worker, n: n})
	}
	return nil
}

func (payloadSink) Close() error { return nil }

func (p *payloads) count(id, worker string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, r := range p.rows[id] {
		if r.worker == worker {
			n++
		}
	}
	return n
}

func (p *payloads) numbers(id string) []int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]int64, 0, len(p.rows[id]))
	for _, r := range p.rows[id] {
		out = append(out, r.n)
	}
	return out
}

// liveHead replaces e's upstream with one that ignores the resume point and streams
// every socket from its live head, whose handshakes take 250 ms (a far upstream's
// dial: ~50 messages at 200/s).
func (e *env) liveHead() {
	up, err := demoupstream.Listen("127.0.0.1:0", demoupstream.Config{Rate: rate, Size: 16, LiveHead: true,
		HandshakeDelay: 250 * time.Millisecond})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { up.Close() })
	e.up = up
}

// In counter mode (no seq_path) a standby's count could not be aligned with the old
// owner's, so a drain hands over break-before-make: the old owner reads to the
// upstream's close reply, delivers it all and releases with its final count, saying
// why; the next owner acquires and dials afresh. Against an upstream that ignores the
// resume point (~200 msg/s, a 250 ms dial), every message it sent on any socket is
// delivered, by the numbers in the payloads; what it produced while no socket was
// open is its own gap, and the new owner's status says it resumed by count.
func TestCountedDrainIsBreakBeforeMake(t *testing.T) {
	e := newEnv(t, rate)
	e.liveHead()
	e.putConn("c1", schema.Started)
	var p payloads
	w1 := e.worker("w1", opts{counter: true, sink: payloadSink{p: &p, worker: "w1"}})
	w2 := e.worker("w2", opts{counter: true, sink: payloadSink{p: &p, worker: "w2"}})
	e.wake(w1, wakeup.NeedsOwner, 0, "c1")
	waitFor(t, 5*time.Second, "w1 streaming", func() bool { return p.count("c1", "w1") >= 50 })
	if err := w1.stop(); err != nil { // drains: a live target (w2) is there to hand to
		t.Fatal(err)
	}
	released := e.get("c1")
	if !released.Owned() {
		if r := e.wake(w2, wakeup.NeedsOwner, released.LeaseVersion, "c1"); r[0].Result != wakeup.Acquired {
			t.Fatalf("acquire by w2: %+v", r)
		}
	}
	waitFor(t, 5*time.Second, "w2 streaming", func() bool { return p.count("c1", "w2") >= 50 })
	// The new owner's status says its position is a count, resumed break-before-make.
	waitFor(t, 5*time.Second, "the item to say counter mode", func() bool {
		c := e.get("c1")
		return c.LeaseOwner == "w2" && c.Status == "streaming" && strings.Contains(c.StatusError, "counter mode")
	})
	if err := w2.stop(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "every socket closed", func() bool { return e.up.Stats("c1").Sockets == 0 })

	spans := e.up.SentSpans("c1")
	tally := demoupstream.Count(spans, p.numbers("c1"))
	t.Logf("%d sockets: %d numbers sent, %d delivered, %d missing, %d duplicates, %d never sent (between sockets)",
		len(spans), tally.Sent, tally.Delivered, len(tally.Missing), tally.Duplicates, tally.Unsent)
	if len(tally.Missing) > 0 {
		t.Fatalf("%d messages the upstream sent were never delivered (first %d)", len(tally.Missing), tally.Missing[0])
	}
	if p.bad > 0 || tally.Sent < 100 {
		t.Fatalf("%d frames without a number; %d sent", p.bad, tally.Sent)
	}
	if released.Owned() || released.Status != "released" ||
		!strings.Contains(released.StatusError, "counter mode") || !strings.Contains(released.StatusError, "break-before-make") {
		t.Fatalf("after the drain: owner %q, status %q %q: want released, saying counter mode and break-before-make",
			released.LeaseOwner, released.Status, released.StatusError)
	}
	if f, taken := w1.Metrics.HandoffFallbacks.Load(), w2.Metrics.HandoffsTaken.Load(); f != 1 || taken != 0 {
		t.Fatalf("fallbacks %d, taken %d: want the drain's one fallback and no standby", f, taken)
	}
	if st := e.up.Stats("c1"); st.MaxClients != 1 {
		t.Fatalf("%d upstream sockets at once: want one (break-before-make)", st.MaxClients)
	}
}

// The same at the worker, for rotations: a counter-mode connection whose spec sets
// max_lifetime rotates break-before-make against an upstream that ignores the
// resume point (~200 msg/s, a 250 ms dial), and every message the upstream sent on
// any socket reaches the sink, by the numbers in the payloads.
func TestCountedRotationAtTheWorker(t *testing.T) {
	e := newEnv(t, rate)
	e.liveHead()
	e.putConn("c1", schema.Started)
	e.update("c1", "SET #k = :v", map[string]types.AttributeValue{":v": codec.S("1500ms")},
		map[string]string{"#k": schema.AttrMaxLifetime})
	var p payloads
	w := e.worker("w1", opts{counter: true, sink: payloadSink{p: &p, worker: "w1"}})
	if r := e.wake(w, wakeup.NeedsOwner, 0, "c1"); r[0].Result != wakeup.Acquired {
		t.Fatalf("wake: %+v", r)
	}
	waitFor(t, 15*time.Second, "3 rotations", func() bool { return w.Metrics.Rotations.Load() >= 3 })
	n := p.count("c1", "w1")
	waitFor(t, 5*time.Second, "the fourth socket streaming", func() bool { return p.count("c1", "w1") >= n+20 })
	if err := w.stop(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "every socket closed", func() bool { return e.up.Stats("c1").Sockets == 0 })
	spans := e.up.SentSpans("c1")
	tally := demoupstream.Count(spans, p.numbers("c1"))
	t.Logf("%d sockets: %d numbers sent, %d delivered, %d missing, %d duplicates, %d never sent (between sockets)",
		len(spans), tally.Sent, tally.Delivered, len(tally.Missing), tally.Duplicates, tally.Unsent)
	if len(tally.Missing) > 0 {
		t.Fatalf("%d messages the upstream sent were never delivered (first %d)", len(tally.Missing), tally.Missing[0])
	}
	if p.bad > 0 || len(spans) < 4 || tally.Sent < 400 {
		t.Fatalf("%d frames without a number; %d sockets, %d sent", p.bad, len(spans), tally.Sent)
	}
	if st := e.up.Stats("c1"); st.MaxClients != 1 {
		t.Fatalf("%d upstream sockets at once: want one (break-before-make)", st.MaxClients)
	}
}
