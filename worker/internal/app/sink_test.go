package app

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/sinkrecord"
	"github.com/sockfleet/sockfleet/shared/wakeup"
	"github.com/sockfleet/sockfleet/worker/internal/sink"
)

// renewing waits until the lease of id was renewed past its value now, twice over,
// so the test knows renewals carry on while the sink is stuck.
func (e *env) renewing(id, owner string) {
	e.t.Helper()
	// Stream mode: the lease lasts as long as the owner's membership, so what must
	// carry on is the membership renew, with the connection still held at its version.
	before := e.get(id)
	first := e.workerItem(owner).HeartbeatExpiresAtMs
	waitFor(e.t, 3*leaseDur, "renewals", func() bool {
		c := e.get(id)
		return c.LeaseOwner == owner && c.LeaseVersion == before.LeaseVersion && c.Owned() &&
			e.workerItem(owner).HeartbeatExpiresAtMs > first+2*interval.Milliseconds()
	})
}

// sinkLines reads JSON lines and returns each connection's sequences; every line
// must be a whole record.
func sinkLines(t *testing.T, r io.Reader) map[string][]int64 {
	t.Helper()
	out := map[string][]int64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		rec, err := sinkrecord.Parse(sc.Bytes())
		if err != nil {
			t.Fatalf("sink line %q: %v", sc.Bytes(), err)
		}
		out[rec.Conn] = append(out[rec.Conn], rec.Seq)
	}
	return out
}

// atLeastOnce checks seqs cover from..to without a gap (repeats allowed).
func atLeastOnce(t *testing.T, what string, seqs []int64, from int64) {
	t.Helper()
	next := from
	for _, s := range seqs {
		if s > next {
			t.Fatalf("%s: gap: %d after %d", what, s, next-1)
		}
		if s == next {
			next++
		}
	}
}

// A stdout nobody reads (a log driver in blocking mode) blocks the sink: each write
// is abandoned at the sink timeout, the connection backs off and says so, renewals
// carry on, the stream recovers when the pipe is read again, and a drain with the
// pipe blocked ends on time.
func TestBlockedStdoutDoesNotStallTheWorker(t *testing.T) {
	e := newEnv(t, rate)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	// The smallest pipe buffer (one page), filled now: the first record blocks.
	if _, _, errno := syscall.Syscall(syscall.SYS_FCNTL, w.Fd(), syscall.F_SETPIPE_SZ, 4096); errno != 0 {
		t.Fatalf("F_SETPIPE_SZ: %v", errno)
	}
	if _, err := w.Write(bytes.Repeat([]byte("#"), 4095)); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte("\n")); err != nil {
		t.Fatal(err)
	}
	e.putConn("c1", schema.Started)
	wk := e.worker("w1", opts{stdout: w})
	if res := e.wake(wk, wakeup.NeedsOwner, 0, "c1"); res[0].Result != wakeup.Acquired {
		t.Fatalf("wake: %+v", res)
	}
	// The item says the sink holds the connection back: sink_slow while a write hangs,
	// backoff (at most BackoffMax here) after it is abandoned. Which of the two a
	// checkpoint catches depends on the machine's speed; both name the sink.
	waitFor(t, 5*time.Second, "status backoff or sink_slow with the sink error", func() bool {
		c := e.get("c1")
		return (c.Status == "backoff" || c.Status == "sink_slow") && strings.Contains(c.StatusError, "sink")
	})
	e.renewing("c1", "w1")
	waitFor(t, 5*time.Second, "a sink error counted (a write abandoned at the timeout)", func() bool {
		return wk.Metrics.SinkErrors.Load() > 0
	})
	if n := wk.Metrics.LeasesLost.Load() + wk.Metrics.SelfFences.Load() + wk.Metrics.RenewFailures.Load(); n != 0 {
		t.Fatalf("%d lost leases, self-fences or renew failures while only the sink was stuck", n)
	}
	if c := e.get("c1"); c.LastSeq != 0 {
		t.Fatalf("checkpoint %d with nothing written", c.LastSeq)
	}

	// Recovery: read the pipe.
	var mu sync.Mutex
	var got bytes.Buffer
	readDone := make(chan struct{})
	var reading atomic.Bool
	reading.Store(true)
	go func() {
		defer close(readDone)
		br := bufio.NewReader(r)
		for {
			line, err := br.ReadBytes('\n')
			if err != nil {
				return
			}
			if !reading.Load() || bytes.HasPrefix(line, []byte("#")) {
				continue
			}
			mu.Lock()
			got.Write(line)
			mu.Unlock()
		}
	}()
	waitFor(t, 10*time.Second, "streaming again with a checkpoint", func() bool {
		c := e.get("c1")
		return c.Status == "streaming" && c.LastSeq > 20
	})

	// Block the pipe again (stop reading, refill), then drain: on time, lease released.
	reading.Store(false)
	r.SetReadDeadline(time.Now()) // the reader goroutine stops; the pipe fills
	<-readDone
	waitFor(t, 10*time.Second, "the sink blocked again", func() bool { return e.get("c1").Status == "backoff" })
	start := time.Now()
	if err := wk.stop(); err != nil {
		t.Fatalf("drain: %v", err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("drain with a blocked stdout took %s", took)
	}
	c := e.get("c1")
	if c.LeaseOwner != "" || c.LeaseExpiresAtMs != 0 {
		t.Fatalf("lease not released after the drain: %+v", c)
	}
	mu.Lock()
	seqs := sinkLines(t, bytes.NewReader(got.Bytes()))["c1"]
	mu.Unlock()
	atLeastOnce(t, "stdout", seqs, 1)
	if len(seqs) == 0 || c.LastSeq < 20 {
		t.Fatalf("%d lines read, checkpoint %d", len(seqs), c.LastSeq)
	}
}

// fullDisk is an output that fails with ENOSPC while full is set.
type fullDisk struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	full atomic.Bool
}

func (d *fullDisk) Write(b []byte) (int, error) {
	if d.full.Load() {
		return 0, &os.PathError{Op: "write", Path: "/data/sink.jsonl", Err: syscall.ENOSPC}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.buf.Write(b)
}

func (d *fullDisk) lines(t *testing.T) map[string][]int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return sinkLines(t, bytes.NewReader(d.buf.Bytes()))
}

// A full disk fails writes, not the sink: the connection backs off with the error
// in its status, the checkpoint stays at what was written, renewals carry on, and
// the stream continues without a gap once space is back.
func TestFullDiskRecovers(t *testing.T) {
	e := newEnv(t, rate)
	d := &fullDisk{}
	e.putConn("c1", schema.Started)
	wk := e.worker("w1", opts{stdout: d})
	e.wake(wk, wakeup.NeedsOwner, 0, "c1")
	waitFor(t, 5*time.Second, "lines", func() bool { return len(d.lines(t)["c1"]) > 20 })
	d.full.Store(true)
	waitFor(t, 5*time.Second, "status backoff naming the disk", func() bool {
		c := e.get("c1")
		return c.Status == "backoff" && strings.Contains(c.StatusError, "no space left")
	})
	written := d.lines(t)["c1"]
	e.renewing("c1", "w1")
	if c := e.get("c1"); c.LastSeq > written[len(written)-1] {
		t.Fatalf("checkpoint %d ahead of the last line written %d", c.LastSeq, written[len(written)-1])
	}
	if n := wk.Metrics.LeasesLost.Load() + wk.Metrics.SelfFences.Load(); n != 0 {
		t.Fatalf("%d lost leases or self-fences while the disk was full", n)
	}
	d.full.Store(false)
	waitFor(t, 10*time.Second, "streaming again", func() bool {
		c := e.get("c1")
		return c.Status == "streaming" && c.LastSeq > written[len(written)-1]+20
	})
	if err := wk.stop(); err != nil {
		t.Fatal(err)
	}
	seqs := d.lines(t)["c1"]
	atLeastOnce(t, "file", seqs, 1)
	if c := e.get("c1"); c.LastSeq != seqs[len(seqs)-1] {
		t.Fatalf("checkpoint %d, last line %d", c.LastSeq, seqs[len(seqs)-1])
	}
}

// gateSink holds each write until its gate opens; it records the size of each write.
type gateSink struct {
	memSink
	gate    chan struct{} // closed: writes pass
	waiting chan int      // the size of a write now held at the gate
}

func (s *gateSink) Write(ctx context.Context, b []sink.Message) error {
	select {
	case <-s.gate:
	default:
		s.waiting <- len(b)
		select {
		case <-s.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return s.memSink.Write(ctx, b)
}

// With resume "none" the upstream never replays, so a message read but dropped at
// a stop is gone for good. A drain arrives while a sink write is held and the
// stream's queue is full behind it: the graceful flush delivers the queue too, and
// the released checkpoint is the last message delivered.
func TestGracefulFlushThroughTheWorker(t *testing.T) {
	e := newEnv(t, 1000)
	snk := &gateSink{gate: make(chan struct{}), waiting: make(chan int, 1)}
	e.putConn("c1", schema.Started)
	wk := e.worker("w1", opts{sink: snk, resume: "none"})
	e.wake(wk, wakeup.NeedsOwner, 0, "c1")
	inflight := <-snk.waiting
	time.Sleep(150 * time.Millisecond) // 1000 messages/s: the 32-message queue fills
	stopped := make(chan error, 1)
	go func() { stopped <- wk.stop() }()
	time.Sleep(100 * time.Millisecond) // the drain cancels the stream, its write still held
	close(snk.gate)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	seqs := snk.get("c1")
	if want := inflight + 32; len(seqs) < want {
		t.Fatalf("%d delivered; the held write had %d and 32 more were queued: lost at the stop", len(seqs), inflight)
	}
	contiguous(t, "sink", seqs)
	c := e.get("c1")
	if c.LastSeq != seqs[len(seqs)-1] || c.LeaseOwner != "" {
		t.Fatalf("released item %+v; sink last %d", c, seqs[len(seqs)-1])
	}
	if q := wk.Metrics.SinkQueued.Load(); q != 0 {
		t.Fatalf("queue depth gauge %d after the drain", q)
	}
}
