package stream

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sockfleet/sockfleet/shared/local/demoupstream"
	"github.com/sockfleet/sockfleet/shared/schema"
)

// The fleet default fills only an absent idle_timeout, and never sets idle_reconnect.
func TestWithFleetIdle(t *testing.T) {
	cases := []struct {
		spec  schema.Spec
		fleet time.Duration
		want  time.Duration
	}{
		{schema.Spec{}, 5 * time.Minute, 5 * time.Minute},
		{schema.Spec{}, 0, 0}, // off
		{schema.Spec{IdleTimeout: time.Hour}, 5 * time.Minute, time.Hour},
		{schema.Spec{IdleTimeout: 10 * time.Second}, 0, 10 * time.Second},
	}
	for _, tc := range cases {
		got := withFleetIdle(tc.spec, tc.fleet)
		if got.IdleTimeout != tc.want || got.IdleReconnect {
			t.Errorf("spec %s, fleet %s: %+v, want idle_timeout %s without reconnect", tc.spec.IdleTimeout, tc.fleet, got, tc.want)
		}
	}
}

// A factory's stream carries the connection's position, spec and guard.
func TestFactoryNew(t *testing.T) {
	cfg := testConfig(t, &memSink{}, "seq")
	f := &Factory{Config: cfg, IdleTimeout: time.Minute}
	guard := func() bool { return false }
	s := f.New(Conn{ID: "c1", URL: "ws://h/x", LastSeq: 41, Epoch: 2, Valid: guard,
		Spec: schema.Spec{MaxSeqJump: 7, IdleReconnect: true}})
	if s.LastSeq() != 41 || s.Epoch() != 2 || s.URL() != "ws://h/x" || s.id != "c1" {
		t.Errorf("stream at %d/%d on %s as %s", s.LastSeq(), s.Epoch(), s.URL(), s.id)
	}
	if s.set.maxJump != 7 || s.set.spec.IdleTimeout != time.Minute || !s.set.spec.IdleReconnect {
		t.Errorf("settings %+v: want the spec's max_seq_jump and reconnect, the fleet's idle_timeout", s.set)
	}
	if s.valid == nil || s.valid() {
		t.Error("the lease guard is not the one given")
	}
}

// A spec the stream refuses is logged, and the fleet defaults stream instead.
func TestFactoryRefusedSpec(t *testing.T) {
	var logs bytes.Buffer
	cfg := testConfig(t, &memSink{}, "seq")
	cfg.Log = slog.New(slog.NewTextHandler(&logs, nil))
	f := &Factory{Config: cfg, IdleTimeout: time.Minute}
	s := f.New(Conn{ID: "c1", URL: "ws://h/x", LastSeq: 5, Epoch: 3,
		Spec: schema.Spec{Subprotocols: []string{"not a token"}}})
	if s.Epoch() != 3 || len(s.set.spec.Subprotocols) != 0 || s.set.spec.IdleTimeout != time.Minute {
		t.Errorf("epoch %d, spec %+v: want the item's epoch and the fleet defaults", s.Epoch(), s.set.spec)
	}
	if !strings.Contains(logs.String(), "spec refused") || !strings.Contains(logs.String(), "conn=c1") {
		t.Errorf("log %q: want the refusal, naming the connection", logs.String())
	}
}

// WithSink changes the sink of the streams it makes, and nothing else.
func TestFactoryWithSink(t *testing.T) {
	orig, other := &memSink{}, &memSink{}
	f := &Factory{Config: testConfig(t, orig, "seq"), IdleTimeout: time.Minute}
	g := f.WithSink(other)
	if g.Config.Sink != other || f.Config.Sink != orig {
		t.Fatal("WithSink must give the new factory the sink and leave the old one's")
	}
	if g.IdleTimeout != f.IdleTimeout || g.Config.BatchSize != f.Config.BatchSize || g.Config.Metrics != f.Config.Metrics {
		t.Error("WithSink changed settings other than the sink")
	}
	if s := g.New(Conn{ID: "c1", URL: "ws://h/x"}); s.cfg.Sink != other {
		t.Error("the stream does not write to the new sink")
	}
}

// Every message a factory's stream delivers carries the lease version it was made
// for: the fencing token a consumer discards a displaced owner's late writes by.
func TestMessagesCarryTheLeaseVersion(t *testing.T) {
	up := upstream(t, demoupstream.Config{Rate: 500, Size: 8})
	snk := &memSink{}
	f := &Factory{Config: testConfig(t, snk, "seq")}
	s := f.New(Conn{ID: "c1", URL: up.URL("c1"), LastSeq: 10, Version: 1764794000123})
	stop := run(s)
	waitFor(t, 5*time.Second, "20 messages", func() bool { return len(snk.seqs()) >= 20 })
	stop(ErrGraceful)
	snk.mu.Lock()
	defer snk.mu.Unlock()
	for _, m := range snk.msgs {
		if m.Version != 1764794000123 {
			t.Fatalf("seq %d delivered under version %d, want the lease's 1764794000123", m.Seq, m.Version)
		}
	}
}
