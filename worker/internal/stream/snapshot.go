package stream

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/worker/internal/sink"
)

// Snapshots (docs/CONNECTIONS.md, "snapshot"): the spec's snapshot request is made
// by a socket's reader before it reads its first frame, and, with on_gap resync,
// when a forward gap arrives. The answer is queued as a record marked snapshot with
// the sequence it covers; the reader then drops every delta at or below it, through
// the tracker's ordinary rule for replays (seq.go), so the sink sees a snapshot and
// exactly the deltas after it. The socket is not read while a snapshot is fetched.
const (
	snapshotTries     = 3                      // a failed or too old snapshot is fetched again, twice
	snapshotRetryWait = 250 * time.Millisecond // doubling between tries
	minResyncGap      = time.Second            // gaps closer together than this share a resync
)

// errStale: the snapshot covers less than what was already delivered.
var errStale = errors.New("older than the stream")

// fetchSnapshot makes the snapshot request until its answer covers at least need
// (why says what need is), or fails after snapshotTries. need < 0 takes any answer.
func (s *Stream) fetchSnapshot(sock *socket, need int64, why string) (int64, []byte, error) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { // the socket closing (a stop, a rotation) abandons the request
		select {
		case <-sock.done:
			cancel()
		case <-ctx.Done():
		}
	})
	sn := s.set.spec.Snapshot
	path, _ := ParseSeqPath(sn.SeqPath) // validated
	var err error
	for try := 0; try < snapshotTries; try++ {
		if try > 0 {
			if _, serr := sleep(ctx, snapshotRetryWait<<(try-1), nil); serr != nil {
				return 0, nil, serr
			}
		}
		var data []byte
		data, err = s.call(ctx, schema.AttrSnapshot, sn.Request, sock.tok, sock.from, s.cfg.ReadLimit)
		if ctx.Err() != nil {
			return 0, nil, ctx.Err()
		}
		if err != nil {
			continue
		}
		seq, ok := path.Extract(data)
		if !ok {
			err = fmt.Errorf("%s: the answer has no sequence at %s", schema.AttrSnapshot, sn.SeqPath)
			continue
		}
		if seq < need {
			err = fmt.Errorf("%s at seq %d is %w: %s", schema.AttrSnapshot, seq, errStale, why)
			continue
		}
		return seq, data, nil
	}
	if errors.Is(err, errStale) {
		s.cfg.Metrics.SnapshotsStale.Add(1)
	} else {
		s.cfg.Metrics.SnapshotErrors.Add(1)
	}
	return 0, nil, fmt.Errorf("%w (%d tries)", err, snapshotTries)
}

// snapshotAtConnect delivers a snapshot before the socket's first frame. A failure
// is said in status and counted; the socket streams on without one. It returns
// false if the socket closed meanwhile.
func (s *Stream) snapshotAtConnect(sock *socket, t *tracker, msgs chan<- sink.Message) bool {
	need := int64(-1)
	if t.st.ref {
		need = t.st.last
	}
	seq, data, err := s.fetchSnapshot(sock, need, fmt.Sprintf("seq %d is already delivered", need))
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return false
		}
		s.setStatus("streaming", fmt.Errorf("%w; streaming without it", err))
		s.cfg.Log.Warn("no snapshot after connect", "conn", s.id, "err", err)
		return true
	}
	return s.queueSnapshot(sock, t, seq, data, msgs)
}

// resync answers a forward gap that arrives with m (on_gap resync): a snapshot
// covering at least m.Seq-1 goes out before m, and m too is dropped if the
// snapshot covers it. Without such a snapshot m is delivered after the gap, as
// without resync, and the status says why.
func (s *Stream) resync(sock *socket, t *tracker, m sink.Message, msgs chan<- sink.Message) (sink.Message, bool) {
	now := time.Now()
	if now.Sub(t.resynced) < minResyncGap {
		return m, true
	}
	t.resynced = now
	seq, data, err := s.fetchSnapshot(sock, m.Seq-1, fmt.Sprintf("the gap ends at seq %d", m.Seq-1))
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			s.setStatus("streaming", fmt.Errorf("gap before seq %d not resynced: %w", m.Seq, err))
		}
		return m, true
	}
	if !s.queueSnapshot(sock, t, seq, data, msgs) {
		return m, false
	}
	s.setStatus("streaming", fmt.Errorf("gap before seq %d resynced by a snapshot at seq %d", m.Seq, seq))
	return m, seq < m.Seq
}

// queueSnapshot queues the snapshot record and moves the reader's position to its
// sequence, so deltas at or below it are dropped as delivered. It returns false
// if the socket closed first.
func (s *Stream) queueSnapshot(sock *socket, t *tracker, seq int64, data []byte, msgs chan<- sink.Message) bool {
	if seq > t.st.last || !t.st.ref {
		if !t.covering {
			t.floor, t.covering = t.st.last, true // resets are judged against the deltas' own place
		}
		t.st.last = seq
	}
	t.st.ref = true
	sock.queued.Store(t.st.last)
	s.cfg.Metrics.Snapshots.Add(1)
	m := sink.Message{Conn: s.id, Seq: seq, Epoch: t.st.epoch, Version: s.version, Data: data, Snapshot: true}
	select {
	case msgs <- m:
		return true
	case <-sock.done:
		return false
	}
}
