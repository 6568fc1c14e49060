package stream

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/worker/internal/connquota"
	"github.com/sockfleet/sockfleet/worker/internal/metrics"
)

// Gate admits dials per upstream host: the connect quota, and the pause an upstream
// asked for with a 429 or 418 and Retry-After (a hold). LocalGate holds one worker's
// view; TableGate shares both through the table with every worker.
type Gate interface {
	// Admit says whether a dial to host may go at now.
	Admit(ctx context.Context, host string, now time.Time) Admission
	// Hold records that host asked for no dial before until.
	Hold(ctx context.Context, host string, until time.Time)
}

// Admission is a gate's answer. Done is set when the dial may go (call it when the
// dial ends); otherwise ask again at Retry, or when Changed closes (may be nil),
// and Why says why not: a *HeldError when the host asked for the pause.
type Admission struct {
	Done    func()
	Retry   time.Time
	Changed <-chan struct{}
	Why     error
}

// HeldError: the host asked, with a 429 or 418 and Retry-After, for no dial before Until.
type HeldError struct {
	Host  string
	Until time.Time
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("%s asked (429/418 Retry-After) for no dial before %s", e.Host, e.Until.UTC().Format(time.RFC3339))
}

// LocalGate is one worker's gate: its Quota (nil: none) and the holds it knows of.
type LocalGate struct {
	Quota *Quota

	mu    sync.Mutex
	holds map[string]time.Time
}

// Admit implements Gate.
func (g *LocalGate) Admit(_ context.Context, host string, now time.Time) Admission {
	if until, ok := g.held(host, now); ok {
		return Admission{Retry: until, Why: &HeldError{Host: host, Until: until}}
	}
	q := g.Quota
	if q == nil {
		return Admission{Done: func() {}}
	}
	changed := q.changedCh()
	slot, d := q.reserve(host, now)
	if d == 0 {
		return Admission{Done: func() { q.release(host, slot, time.Now()) }}
	}
	return Admission{Retry: now.Add(min(d, q.W)), Changed: changed, Why: quotaWaitError(host, q.N, q.W)}
}

func quotaWaitError(host string, n int, w time.Duration) error {
	return fmt.Errorf("waiting for the connect quota of %s (%d per %s)", host, n, w)
}

// Hold implements Gate.
func (g *LocalGate) Hold(_ context.Context, host string, until time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.holds == nil {
		g.holds = map[string]time.Time{}
	}
	if until.After(g.holds[host]) {
		g.holds[host] = until
	}
}

func (g *LocalGate) held(host string, now time.Time) (time.Time, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	until, ok := g.holds[host]
	if ok && !now.Before(until) {
		delete(g.holds, host)
		return time.Time{}, false
	}
	return until, ok
}

// QuotaStore is what TableGate needs of the table (connquota.Store).
type QuotaStore interface {
	Admit(ctx context.Context, host string, n int, window time.Duration, now time.Time) (connquota.Verdict, error)
	Hold(ctx context.Context, host string, until, now time.Time) error
}

// TableGate shares the connect quota (N dials per window W per host, N = 0: none)
// and the holds with every worker through the table: one conditional write per
// admitted dial (without a quota, one read per host and second: clearFor). What it
// learned (a hold, a full window) it keeps until then, so the worker's other streams
// wait without asking, and it asks the table for one dial of a host at a time: at
// most one refused write per worker, host and window.
//
// When the table cannot be reached (an error or Timeout), a dial under a quota
// waits and asks again, saying so in the status: the quota exists to keep the
// fleet's address from being banned, and admitting on a per-worker guess would let
// W workers dial W-fold exactly when the table is slow, as a mass failover makes it.
// A worker that cannot reach the table cannot renew its leases either, and gives
// them up within its lease. Without a quota the hold check is best effort: the dial
// goes (holds this worker learned still apply).
type TableGate struct {
	Store   QuotaStore
	N       int
	W       time.Duration // required when N > 0
	Local   *LocalGate    // the holds learned (its Quota is not used)
	Timeout time.Duration // one table call; default 2s
	Metrics *metrics.Counters
	Log     *slog.Logger

	mu    sync.Mutex
	full  map[string]time.Time     // host → end of a window known full
	clear map[string]time.Time     // N = 0: host → until when it is known not held
	turns map[string]chan struct{} // host → its one table call at a time
}

// clearFor is how long, without a quota, a read that found no hold stands for the
// worker's other dials to that host: a mass failover reads each host once a second,
// not once per dial, and a hold another worker wrote reaches this one within it.
const clearFor = time.Second

// Admit implements Gate.
func (g *TableGate) Admit(ctx context.Context, host string, now time.Time) Admission {
	if a, ok := g.known(host, now); ok {
		return a
	}
	turn := g.turn(host)
	select {
	case turn <- struct{}{}:
	case <-ctx.Done():
		return Admission{Retry: now, Why: ctx.Err()}
	}
	defer func() { <-turn }()
	now = time.Now() // the turn may have taken a while; what others learned meanwhile counts
	if a, ok := g.known(host, now); ok {
		return a
	}
	guard := g.guard()
	if _, end := connquota.Window(now, g.window()); g.N > 0 && !now.Add(guard).Before(end) {
		return Admission{Retry: end, Why: quotaWaitError(host, g.N, g.W)}
	}
	tctx, cancel := context.WithTimeout(ctx, g.timeout())
	v, err := g.Store.Admit(tctx, host, g.N, g.window(), now)
	cancel()
	if v.Admitted && g.N > 0 && !time.Now().Add(guard).Before(v.WindowEnd) {
		// Counted, but answered too close to its window's end for the dial to land in
		// it: the slot is left unused rather than the next window overrun.
		return Admission{Retry: v.WindowEnd, Why: quotaWaitError(host, g.N, g.W)}
	}
	switch {
	case err != nil && ctx.Err() != nil:
		return Admission{Retry: now, Why: ctx.Err()}
	case err != nil:
		if g.Metrics != nil {
			g.Metrics.QuotaTableErrors.Add(1)
		}
		if g.N == 0 {
			g.log().Warn("connect gate: could not read the host's hold; dialing", "host", host, "err", err)
			return g.Local.Admit(ctx, host, now)
		}
		g.log().Warn("connect quota: table unreachable; the dial waits", "host", host, "err", err)
		return Admission{Retry: now.Add(min(g.W/10, time.Second)),
			Why: fmt.Errorf("waiting for the connect quota of %s (%d per %s): %w", host, g.N, g.W, err)}
	case v.Admitted:
		if g.N == 0 {
			g.mu.Lock()
			if g.clear == nil {
				g.clear = map[string]time.Time{}
			}
			g.clear[host] = now.Add(clearFor)
			g.mu.Unlock()
		}
		return Admission{Done: func() {}}
	case !v.HeldUntil.IsZero():
		g.Local.Hold(ctx, host, v.HeldUntil)
		return Admission{Retry: v.HeldUntil, Why: &HeldError{Host: host, Until: v.HeldUntil}}
	default:
		g.mu.Lock()
		if g.full == nil {
			g.full = map[string]time.Time{}
		}
		g.full[host] = v.Retry
		g.mu.Unlock()
		return Admission{Retry: v.Retry, Why: quotaWaitError(host, g.N, g.W)}
	}
}

// known answers from what this worker learned: a hold, a window known full, or (no
// quota) a host read a moment ago and not held.
func (g *TableGate) known(host string, now time.Time) (Admission, bool) {
	if until, ok := g.Local.held(host, now); ok {
		return Admission{Retry: until, Why: &HeldError{Host: host, Until: until}}, true
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if end, ok := g.full[host]; ok {
		if now.Before(end) {
			return Admission{Retry: end, Why: quotaWaitError(host, g.N, g.W)}, true
		}
		delete(g.full, host)
	}
	if until, ok := g.clear[host]; ok {
		if now.Before(until) {
			return Admission{Done: func() {}}, true
		}
		delete(g.clear, host)
	}
	return Admission{}, false
}

func (g *TableGate) turn(host string) chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.turns == nil {
		g.turns = map[string]chan struct{}{}
	}
	t := g.turns[host]
	if t == nil {
		t = make(chan struct{}, 1)
		g.turns[host] = t
	}
	return t
}

// Hold implements Gate: this worker holds at once; the others learn it at their
// next admission.
func (g *TableGate) Hold(ctx context.Context, host string, until time.Time) {
	g.Local.Hold(ctx, host, until)
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.timeout())
	defer cancel()
	if err := g.Store.Hold(tctx, host, until, time.Now()); err != nil {
		g.log().Warn("connect quota: could not share a hold with the fleet", "host", host, "until", until, "err", err)
	}
}

func (g *TableGate) timeout() time.Duration {
	if g.Timeout > 0 {
		return g.Timeout
	}
	return 2 * time.Second
}

// guard is how long before its window's end a dial is no longer admitted: the upstream
// counts a dial when it arrives, after the admission, and that must be in the same
// window. A tenth of the window, at most 1 s (a connect and the handshake's request).
func (g *TableGate) guard() time.Duration { return min(g.W/10, time.Second) }

func (g *TableGate) window() time.Duration {
	if g.W > 0 {
		return g.W
	}
	return time.Minute // N = 0: the store only reads the hold
}

func (g *TableGate) log() *slog.Logger {
	if g.Log != nil {
		return g.Log
	}
	return slog.New(slog.DiscardHandler)
}

// hostOf returns the lower-cased host of a dial target: the quota's and the hold's key.
func hostOf(target string) string {
	if u, err := url.Parse(target); err == nil && u.Hostname() != "" {
		return strings.ToLower(u.Hostname())
	}
	return target
}

// waitQuota waits until the gate admits a dial to target's host, saying why in the
// status meanwhile, and returns the function to call when the dial ends.
func (s *Stream) waitQuota(ctx context.Context, target string) (func(), error) {
	host := hostOf(target)
	prev, waited := s.Status(), false
	for {
		a := s.cfg.gate().Admit(ctx, host, time.Now())
		if a.Done != nil {
			if waited {
				s.status.Store(&prev)
			}
			return a.Done, nil
		}
		if !waited {
			waited = true
			s.cfg.Metrics.QuotaWaits.Add(1)
			s.cfg.Metrics.QuotaWaiting.Add(1)
			defer s.cfg.Metrics.QuotaWaiting.Add(-1)
		}
		state := schema.StatusQuotaWait
		if _, ok := a.Why.(*HeldError); ok {
			state = schema.StatusRateLimited
		}
		s.setStatus(state, a.Why)
		if _, err := sleep(ctx, max(time.Until(a.Retry), time.Millisecond), a.Changed); err != nil {
			return nil, err
		}
	}
}
