package sink

import (
	"context"
	"errors"
	"testing"
)

// recSink records the batches written to it.
type recSink struct {
	batches [][]Message
	closed  bool
	fail    error
}

func (r *recSink) Write(_ context.Context, b []Message) error {
	if r.fail != nil {
		return r.fail
	}
	r.batches = append(r.batches, append([]Message(nil), b...))
	return nil
}

func (r *recSink) Close() error { r.closed = true; return nil }

func TestRouterSendsEachRunToItsDestination(t *testing.T) {
	def, a, b := &recSink{}, &recSink{}, &recSink{}
	r := &Router{Default: def, Dests: map[string]Sink{"a": a, "file:/b": b}}
	batch := []Message{{Conn: "x", Seq: 1, Dest: "a"}, {Conn: "x", Seq: 2, Dest: "a"}, {Conn: "y", Seq: 1}, {Conn: "z", Seq: 1, Dest: "file:/b"}, {Conn: "x", Seq: 3, Dest: "a"}}
	if err := r.Write(context.Background(), batch); err != nil {
		t.Fatal(err)
	}
	if len(a.batches) != 2 || len(a.batches[0]) != 2 || a.batches[1][0].Seq != 3 {
		t.Fatalf("a got %v", a.batches)
	}
	if len(def.batches) != 1 || def.batches[0][0].Conn != "y" || len(b.batches) != 1 || b.batches[0][0].Conn != "z" {
		t.Fatalf("default got %v, file got %v", def.batches, b.batches)
	}
	if !r.Allows("") || !r.Allows("a") || r.Allows("c") {
		t.Fatal("Allows")
	}
	if err := r.Close(); err != nil || !def.closed || !a.closed || !b.closed {
		t.Fatalf("close: %v", err)
	}
}

// An unknown destination fails the write before anything after it is written; a
// failing sink stops the batch at its run, so nothing later lands out of order.
func TestRouterRefusesUnknownAndStopsAtAFailure(t *testing.T) {
	def, a := &recSink{}, &recSink{fail: errors.New("down")}
	r := &Router{Default: def, Dests: map[string]Sink{"a": a}}
	err := r.Write(context.Background(), []Message{{Conn: "x", Dest: "nope"}, {Conn: "y"}})
	if !errors.Is(err, ErrUnknownDest) || len(def.batches) != 0 {
		t.Fatalf("unknown: %v, default got %v", err, def.batches)
	}
	err = r.Write(context.Background(), []Message{{Conn: "x", Dest: "a"}, {Conn: "y"}})
	if err == nil || len(def.batches) != 0 {
		t.Fatalf("failure: %v, default got %v", err, def.batches)
	}
}
