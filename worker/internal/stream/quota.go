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
// shared by every stream of the worker. It is a sliding-window log (the last N dial
// times per host) rather than a token bucket: a bucket sized to never exceed N in a
// window may only burst N/2, so a mass failover would take twice as long as the
// upstream's limit allows; the log admits exactly what the limit allows, no more.
// Memory is N timestamps per host dialed.
type Quota struct {
	N int
	W time.Duration

	mu    sync.Mutex
	hosts map[string]*window
}

type window struct {
	times []time.Time // ring of the last N admitted dials
	next  int
}

// ParseQuota parses "N/DURATION", e.g. "300/5m"; "" means no quota (nil).
func ParseQuota(s string) (*Quota, error) {
	if s == "" {
		return nil, nil
	}
	ns, ws, ok := strings.Cut(s, "/")
	n, err := strconv.Atoi(ns)
	if !ok || err != nil || n <= 0 || n > 1_000_000 {
		return nil, fmt.Errorf("connect quota %q: want N/DURATION with 1 <= N <= 1000000, e.g. 300/5m", s)
	}
	w, err := time.ParseDuration(ws)
	if err != nil || w <= 0 {
		return nil, fmt.Errorf("connect quota %q: want N/DURATION with a positive duration, e.g. 300/5m", s)
	}
	return &Quota{N: n, W: w}, nil
}

// reserve admits a dial to host at now, or says how long to wait before asking again.
func (q *Quota) reserve(host string, now time.Time) time.Duration {
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
	if len(w.times) < q.N {
		w.times = append(w.times, now)
		return 0
	}
	// times[next] is the oldest of the last N: the window admits one more once it is W old.
	if wait := w.times[w.next].Add(q.W).Sub(now); wait > 0 {
		return wait
	}
	w.times[w.next] = now
	w.next = (w.next + 1) % q.N
	return 0
}

// Wait blocks until a dial to host is admitted or ctx ends. It reports whether it
// had to wait at all.
func (q *Quota) Wait(ctx context.Context, host string) (waited bool, err error) {
	if q == nil {
		return false, nil
	}
	for {
		d := q.reserve(host, time.Now())
		if d == 0 {
			return waited, nil
		}
		waited = true
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return waited, ctx.Err()
		case <-t.C:
		}
	}
}
