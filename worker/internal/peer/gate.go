package peer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sockfleet/sockfleet/shared/tracing"
	"github.com/sockfleet/sockfleet/worker/internal/sink"
)

// ErrOverflow: a standby held more than its limits before the commit; it gives up.
var ErrOverflow = errors.New("standby buffer full")

// Position is a sequence and the epoch of the upstream's numbering it belongs to.
type Position struct{ Seq, Epoch int64 }

// Gate stands between a standby connection's stream and the worker's sink. Until
// Open it acknowledges every batch without delivering it, holding at most
// MaxMessages messages and MaxBytes bytes of data (more: it closes with ErrOverflow
// and calls OnOverflow). Open(cut) drops everything at or below cut, Flush delivers
// the rest, and from then on it passes batches through, still dropping any message at or
// below cut until the first one above it. A delivery that fails keeps what the gate
// held for the next write, and Held says the position really delivered until then,
// so the owner never checkpoints a held message as delivered.
//
// Fencing: the standby's stream does not know the lease version it will deliver
// under (the old owner's transfer makes it), so its messages come without one. Open
// is given the committed version, and every message the gate delivers carries it:
// the held ones and all that pass after. Nothing leaves the gate before Open, so no
// message reaches the sink without the version it is delivered under.
//
// The stream writes from one goroutine; Open, Close and Held may be called from
// others.
type Gate struct {
	Sink        sink.Sink
	MaxMessages int
	MaxBytes    int
	Timeout     time.Duration // bounds the delivery Open makes; default 10 s
	Valid       func() bool   // nil, or the fence guard: false, and Open delivers nothing
	OnOverflow  func(error)   // called once, from the stream's write, on overflow

	mu    sync.Mutex
	state int // holding, open, closed
	err   error
	buf   []sink.Message
	bytes int
	cut   Position
	ver   int64 // the committed lease version, stamped on every message delivered
	skip  bool
	held  atomic.Pointer[Position] // set while the delivered position is below the stream's
	first bool                     // the first delivery was marked (tracing.FirstDelivery)
}

const (
	holding = iota
	open
	closed
)

// Write implements sink.Sink for the stream.
func (g *Gate) Write(ctx context.Context, batch []sink.Message) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch g.state {
	case closed:
		return g.err
	case holding:
		n := g.bytes
		for _, m := range batch {
			n += len(m.Data)
		}
		if len(g.buf)+len(batch) > g.MaxMessages || n > g.MaxBytes {
			g.state = closed
			g.err = fmt.Errorf("%w: over %d messages or %d bytes before the commit", ErrOverflow, g.MaxMessages, g.MaxBytes)
			g.buf, g.bytes = nil, 0
			if g.OnOverflow != nil {
				g.OnOverflow(g.err)
			}
			return g.err
		}
		g.buf = append(g.buf, batch...)
		g.bytes = n
		return nil
	}
	out := g.filter(batch)
	g.stamp(out)
	if len(g.buf) > 0 {
		out = append(g.buf[:len(g.buf):len(g.buf)], out...)
	}
	if len(out) == 0 {
		return nil
	}
	start := time.Now()
	if err := g.Sink.Write(ctx, out); err != nil {
		return err
	}
	g.marked(ctx, start, out)
	g.buf = nil
	g.settle()
	return nil
}

// marked marks the gate's first delivery (the new owner's, after the commit) once.
// Call with g.mu held, after a write of batch succeeded.
func (g *Gate) marked(ctx context.Context, start time.Time, batch []sink.Message) {
	if g.first || len(batch) == 0 {
		return
	}
	g.first = true
	tracing.FirstDelivery(ctx, tracer, start, batch[0].Conn, g.ver, len(batch))
}

var tracer = tracing.Tracer("worker/internal/peer")

// Close implements sink.Sink; the worker's sink is closed by its owner.
func (g *Gate) Close() error { return nil }

// Open ends the holding, without I/O: everything held at or below cut is dropped
// (the old owner delivered it), and from now on batches pass, every message carrying
// version (the lease version of the commit) as its fencing token. Held reports cut
// until the rest is delivered (Flush, or the next write). It fails if the gate closed
// before (overflow, Abandon).
func (g *Gate) Open(cut Position, version int64) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch g.state {
	case closed:
		return g.err
	case open:
		return nil
	}
	g.state, g.cut, g.ver, g.skip = open, cut, version, true
	g.buf = g.filter(g.buf)
	g.stamp(g.buf)
	g.held.Store(&cut)
	g.settle()
	return nil
}

// Flush delivers what an open gate still holds. On failure the messages stay held
// for the next write.
func (g *Gate) Flush(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.state != open || len(g.buf) == 0 {
		return nil
	}
	if g.Valid != nil && !g.Valid() {
		return errors.New("past the fence: nothing delivered")
	}
	t := g.Timeout
	if t == 0 {
		t = 10 * time.Second
	}
	wctx, cancel := context.WithTimeout(ctx, t)
	defer cancel()
	start := time.Now()
	if err := g.Sink.Write(wctx, g.buf); err != nil {
		return fmt.Errorf("deliver %d held messages: %w", len(g.buf), err)
	}
	g.marked(ctx, start, g.buf)
	g.buf = nil
	g.settle()
	return nil
}

// Abandon closes the gate: nothing more is held or delivered.
func (g *Gate) Abandon(err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.state != closed {
		g.state, g.err, g.buf, g.bytes = closed, err, nil, 0
	}
}

// Held reports the position delivered, when it is below what the stream counts as
// acknowledged: after Open, while held messages wait for a delivery or messages at
// or below the cut are still being skipped. ok false: the stream's count is right.
func (g *Gate) Held() (Position, bool) {
	if p := g.held.Load(); p != nil {
		return *p, true
	}
	return Position{}, false
}

// Len is how many messages the gate holds.
func (g *Gate) Len() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.buf)
}

// filter drops, while skipping, every message at or below the cut; the first good
// message above it ends the skipping. Call with g.mu held, after Open.
func (g *Gate) filter(batch []sink.Message) []sink.Message {
	if !g.skip {
		return batch
	}
	out := batch[:0:0]
	for i, m := range batch {
		if m.Bad {
			continue // between delivered sequences: the old owner's, or a repeat of one
		}
		if m.Epoch > g.cut.Epoch || (m.Epoch == g.cut.Epoch && m.Seq > g.cut.Seq) {
			g.skip = false
			return append(out, batch[i:]...)
		}
	}
	return out
}

// stamp gives every message of batch the committed version. Call with g.mu held.
func (g *Gate) stamp(batch []sink.Message) {
	for i := range batch {
		batch[i].Version = g.ver
	}
}

// settle clears Held once nothing is held and nothing skipped. Call with g.mu held.
func (g *Gate) settle() {
	if g.state == open && !g.skip && len(g.buf) == 0 {
		g.held.Store(nil)
	}
}
