package stream

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Quota limits new connections per upstream host: at most N dials in any window W,
// shared by every stream of one worker (a LocalGate; a worker with a table shares
// the quota with the fleet instead: TableGate, which takes its N and W from here). It is a sliding-window log (the last N dials
// per host) rather than a token bucket: a bucket sized to never exceed N in a window
// may only burst N/2, so a mass failover would take twice as long as the upstream's
// limit allows; the log admits exactly what the limit allows, no more.
//
// A dial counts from when it is admitted until W after it ends: the upstream counts
// a connection when it arrives, somewhere between the two, and a slow handshake must
// not let the next window's dials land inside this one. Memory is N entries per host.
type Quota struct {
	N int
	W time.Duration

	mu      sync.Mutex
	hosts   map[string]*window
	changed chan struct{} // closed (and replaced) whenever a dial ends
}

type window struct {
	ends []time.Time // one per admitted dial: when it ended, or inFlight
}

// inFlight marks a dial that has not ended yet: it holds its slot indefinitely.
var inFlight = time.Unix(1<<62, 0)

// ParseQuota parses "N/DURATION", e.g. "300/5m"; "" means no quota (nil).
func ParseQuota(s string) (*Quota, error) {
	if s == "" {
		return nil, nil
	}
	ns, ws, ok := strings.Cut(s, "/")
	n, err := strconv.Atoi(ns)
	if !ok || err != nil || n <= 0 || n > 100_000 {
		return nil, fmt.Errorf("connect quota %q: want N/DURATION with 1 <= N <= 100000, e.g. 300/5m", s)
	}
	w, err := time.ParseDuration(ws)
	if err != nil || w <= 0 {
		return nil, fmt.Errorf("connect quota %q: want N/DURATION with a positive duration, e.g. 300/5m", s)
	}
	return &Quota{N: n, W: w}, nil
}

// reserve admits a dial to host at now, returning its slot, or says how long to wait
// before asking again (inFlight's distance: until some dial ends).
func (q *Quota) reserve(host string, now time.Time) (slot int, wait time.Duration) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.hosts == nil {
		q.hosts = map[string]*window{}
	}
	w := q.hosts[host]
	if w == nil {
		w = &window{}
		q.hosts[host] = w
	}
	if len(w.ends) < q.N {
		w.ends = append(w.ends, inFlight)
		return len(w.ends) - 1, 0
	}
	oldest := 0
	for i, t := range w.ends {
		if t.Before(w.ends[oldest]) {
			oldest = i
		}
	}
	if wait := w.ends[oldest].Add(q.W).Sub(now); wait > 0 {
		return -1, wait
	}
	w.ends[oldest] = inFlight
	return oldest, 0
}

// release records that the dial in slot ended at now.
func (q *Quota) release(host string, slot int, now time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if w := q.hosts[host]; w != nil && slot >= 0 && slot < len(w.ends) {
		w.ends[slot] = now
	}
	if q.changed != nil {
		close(q.changed)
		q.changed = nil
	}
}

func (q *Quota) changedCh() <-chan struct{} {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.changed == nil {
		q.changed = make(chan struct{})
	}
	return q.changed
}

// Wait blocks until a dial to host is admitted or ctx ends, and returns the function
// to call when the dial ends. It reports whether it had to wait at all.
func (q *Quota) Wait(ctx context.Context, host string) (done func(), waited bool, err error) {
	if q == nil {
		return func() {}, false, nil
	}
	for {
		changed := q.changedCh()
		slot, d := q.reserve(host, time.Now())
		if d == 0 {
			return func() { q.release(host, slot, time.Now()) }, waited, nil
		}
		waited = true
		t := time.NewTimer(min(d, q.W))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, waited, ctx.Err()
		case <-changed:
		case <-t.C:
		}
		t.Stop()
	}
}
