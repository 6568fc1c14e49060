package peer

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/sockfleet/sockfleet/worker/internal/sink"
)

type recSink struct {
	mu   sync.Mutex
	seqs []int64
	vers []int64 // the lease version each delivered message carried
	fail bool
}

func (s *recSink) Write(_ context.Context, b []sink.Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail {
		return errors.New("sink down")
	}
	for _, m := range b {
		s.seqs = append(s.seqs, m.Seq)
		s.vers = append(s.vers, m.Version)
	}
	return nil
}

func (s *recSink) Close() error { return nil }

func msgs(from, to int64) []sink.Message {
	var out []sink.Message
	for i := from; i <= to; i++ {
		out = append(out, sink.Message{Conn: "c", Seq: i, Data: []byte("x")})
	}
	return out
}

func equal(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func seqs(from, to int64) []int64 {
	var out []int64
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}

// Held messages reach the sink only after Open, without those at or below the cut,
// in order, followed by what passes after.
func TestGateHoldsThenDeliversAfterTheCut(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		held      []sink.Message
		cut       int64
		next      []sink.Message
		delivered []int64
	}{
		{"standby ahead of the cut", msgs(11, 20), 15, msgs(21, 22), seqs(16, 22)},
		{"standby behind the cut", msgs(11, 13), 15, msgs(14, 18), seqs(16, 18)},
		{"cut after everything held", msgs(11, 15), 15, msgs(16, 16), seqs(16, 16)},
		{"nothing held", nil, 15, msgs(16, 17), seqs(16, 17)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &recSink{}
			g := &Gate{Sink: s, MaxMessages: 100, MaxBytes: 1000}
			if len(tc.held) > 0 {
				if err := g.Write(ctx, tc.held); err != nil {
					t.Fatal(err)
				}
			}
			if len(s.seqs) != 0 {
				t.Fatalf("delivered %v before Open", s.seqs)
			}
			if err := g.Open(Position{Seq: tc.cut}, 77); err != nil {
				t.Fatal(err)
			}
			if p, ok := g.Held(); !ok || p.Seq != tc.cut {
				t.Fatalf("Held %v %v before the flush, want the cut", p, ok)
			}
			if err := g.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			if err := g.Write(ctx, tc.next); err != nil {
				t.Fatal(err)
			}
			if !equal(s.seqs, tc.delivered) {
				t.Fatalf("delivered %v, want %v", s.seqs, tc.delivered)
			}
			for i, v := range s.vers {
				if v != 77 {
					t.Fatalf("seq %d delivered under version %d, want the commit's 77", s.seqs[i], v)
				}
			}
			if _, ok := g.Held(); ok {
				t.Fatal("still Held after delivering past the cut")
			}
		})
	}
}

// Over its limits a holding gate gives up, says so once, and delivers nothing ever.
func TestGateOverflow(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name            string
		maxMsgs, maxLen int
	}{{"messages", 5, 1 << 20}, {"bytes", 100, 5}} {
		t.Run(tc.name, func(t *testing.T) {
			s := &recSink{}
			var said []error
			g := &Gate{Sink: s, MaxMessages: tc.maxMsgs, MaxBytes: tc.maxLen, OnOverflow: func(err error) { said = append(said, err) }}
			if err := g.Write(ctx, msgs(1, 4)); err != nil {
				t.Fatal(err)
			}
			if err := g.Write(ctx, msgs(5, 6)); !errors.Is(err, ErrOverflow) {
				t.Fatalf("write over the limit: %v", err)
			}
			if err := g.Write(ctx, msgs(7, 7)); !errors.Is(err, ErrOverflow) {
				t.Fatalf("write after overflow: %v", err)
			}
			if err := g.Open(Position{Seq: 2}, 77); !errors.Is(err, ErrOverflow) {
				t.Fatalf("open after overflow: %v", err)
			}
			if len(said) != 1 || len(s.seqs) != 0 || g.Len() != 0 {
				t.Fatalf("overflow said %d times, delivered %v, holding %d", len(said), s.seqs, g.Len())
			}
		})
	}
}

// A failed delivery of held messages keeps them (Held stays at the cut) and the next
// write delivers them first; the fence guard stops the flush.
func TestGateFailedFlushIsRetried(t *testing.T) {
	ctx := context.Background()
	s := &recSink{fail: true}
	valid := true
	g := &Gate{Sink: s, MaxMessages: 100, MaxBytes: 1000, Valid: func() bool { return valid }}
	_ = g.Write(ctx, msgs(1, 10))
	_ = g.Open(Position{Seq: 5}, 77)
	if err := g.Flush(ctx); err == nil {
		t.Fatal("flush into a failing sink succeeded")
	}
	if p, ok := g.Held(); !ok || p.Seq != 5 {
		t.Fatalf("Held %v %v after a failed flush, want 5", p, ok)
	}
	valid = false
	s.fail = false
	if err := g.Flush(ctx); err == nil || len(s.seqs) != 0 {
		t.Fatalf("flush past the fence: %v, delivered %v", err, s.seqs)
	}
	if err := g.Write(ctx, msgs(11, 12)); err != nil {
		t.Fatal(err)
	}
	if !equal(s.seqs, seqs(6, 12)) {
		t.Fatalf("delivered %v", s.seqs)
	}
}

func TestDecodeRequest(t *testing.T) {
	good := `{"v":1,"op":"prepare","conn":"c1","from":"w1","to":"w2","version":7,"seq":42,"epoch":0}`
	if r, err := DecodeRequest([]byte(good)); err != nil || r.Op != Prepare || r.Seq != 42 {
		t.Fatalf("%+v %v", r, err)
	}
	for name, body := range map[string]string{
		"empty":         ``,
		"not json":      `{`,
		"unknown field": strings.Replace(good, `"epoch":0`, `"epoch":0,"x":1`, 1),
		"trailing":      good + `{}`,
		"version":       strings.Replace(good, `"v":1`, `"v":2`, 1),
		"op":            strings.Replace(good, `prepare`, `steal`, 1),
		"zero version":  strings.Replace(good, `"version":7`, `"version":0`, 1),
		"negative seq":  strings.Replace(good, `"seq":42`, `"seq":-1`, 1),
		"bad conn":      strings.Replace(good, `"c1"`, `"c 1"`, 1),
		"no from":       strings.Replace(good, `"from":"w1"`, `"from":""`, 1),
		"to itself":     strings.Replace(good, `"to":"w2"`, `"to":"w1"`, 1),
		"too big":       good + strings.Repeat(" ", MaxBody),
	} {
		if _, err := DecodeRequest([]byte(body)); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
}

func FuzzDecodeRequest(f *testing.F) {
	f.Add([]byte(`{"v":1,"op":"commit","conn":"c1","from":"w1","to":"w2","version":7,"seq":42,"epoch":1}`))
	f.Add([]byte(`{"v":1,"op":"abort"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeRequest(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error not ErrMalformed: %v", err)
			}
			return
		}
		if r.Version <= 0 || r.Seq < 0 || r.From == r.To || (r.Op != Prepare && r.Op != Commit && r.Op != Abort) {
			t.Fatalf("accepted %+v", r)
		}
	})
}
