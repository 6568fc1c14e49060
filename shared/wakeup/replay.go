package wakeup

import (
	"sync"
	"time"
)

// Replay remembers accepted signatures for twice the window, so a captured request
// cannot be played again while its timestamp is still acceptable. Memory is bounded
// by Max entries; when full, the oldest are dropped early, which can only let a
// replay through that is also older than every remembered one.
type Replay struct {
	Max int // default 100,000

	mu    sync.Mutex
	seen  map[string]time.Time // signature -> expiry
	order []entry
}

type entry struct {
	sig string
	exp time.Time
}

// Seen records sig at now and reports whether it was already recorded.
func (r *Replay) Seen(sig string, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.seen == nil {
		r.seen = make(map[string]time.Time)
	}
	max := r.Max
	if max == 0 {
		max = 100_000
	}
	for len(r.order) > 0 && (r.order[0].exp.Before(now) || len(r.order) >= max) {
		if r.seen[r.order[0].sig].Equal(r.order[0].exp) {
			delete(r.seen, r.order[0].sig)
		}
		r.order = r.order[1:]
	}
	if exp, ok := r.seen[sig]; ok && exp.After(now) {
		return true
	}
	exp := now.Add(2 * Window)
	r.seen[sig] = exp
	r.order = append(r.order, entry{sig, exp})
	return false
}
