// Package dispatch sends the wakeups that records' decisions ask for, choosing the
// worker for each connection that needs an owner.
//
// Deliver sends the wakeups. Guarantees: one round never offers an id to two
// workers; an owner-must-act wakeup goes to the current owner only; ids a worker
// refused or could not take (full, draining, failed, unreachable) are offered to the
// next worker. Non-guarantees: a wakeup is a hint; whether a worker acquires is decided
// by the conditional write it makes, so a delivered wakeup may still end in LostRace.
package dispatch

import (
	"cmp"
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/sockfleet/sockfleet/functions/reconciler/records"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/shared/wakeup"
	"go.opentelemetry.io/otel/trace"
)

// Sender sends one wakeup to the worker at addr. *wakeup.Client implements it.
type Sender interface {
	Send(ctx context.Context, addr string, req wakeup.Request) (wakeup.Response, error)
}

// Delivery wakes workers for a set of decisions.
type Delivery struct {
	Sender Sender
	// Timeout bounds each wakeup request. Default DefaultWakeupTimeout.
	Timeout time.Duration
	// Recent, if set, carries what wakeup replies reported from one Deliver call to
	// the next, so a burst spread over many stream batches is spread like one batch.
	Recent *Recent
	Log    *slog.Logger
}

// DefaultWakeupTimeout bounds one wakeup: a worker answers after its conditional
// writes, which take milliseconds; a worker that takes longer is treated as
// unreachable and its ids go to the next worker.
const DefaultWakeupTimeout = 2 * time.Second

// Outcome is what became of one id.
type Outcome struct {
	// Done: no further action is needed from this batch, either because a worker
	// answered conclusively or because there is nobody to tell (an owner that is no
	// longer live: the crash handler or the sweep releases its lease).
	Done   bool
	Worker string        // the worker that answered last, if any
	Result wakeup.Result // its answer, if any
	Why    string        // for an id not Done: why it could not be delivered
}

// Deliver sends the wakeups ds ask for, choosing among workers (the registry as read
// now), and returns the outcome per id. Ignore decisions are skipped; give at most one
// decision per id.
func (d *Delivery) Deliver(ctx context.Context, workers []codec.Worker, now time.Time, ds []records.Decision) map[string]Outcome {
	out := make(map[string]Outcome, len(ds))
	spans := make(map[string]trace.SpanContext, len(ds))
	for _, dc := range ds {
		if dc.Span != nil {
			spans[dc.ID] = *dc.Span
		}
	}
	var needs []wakeup.Conn
	checks := map[string][]wakeup.Conn{}
	for _, dc := range ds {
		switch dc.Action {
		case records.NeedsOwner:
			needs = append(needs, wakeup.Conn{ID: dc.ID, LeaseVersion: dc.LeaseVersion, Reason: wakeup.NeedsOwner})
		case records.OwnerMustAct:
			checks[dc.Owner] = append(checks[dc.Owner], wakeup.Conn{ID: dc.ID, LeaseVersion: dc.LeaseVersion, Reason: wakeup.Check})
		}
	}
	byID := map[string]codec.Worker{}
	for _, w := range workers {
		byID[w.ID] = w
	}
	pool := newPool(workers, now, d.Recent)
	var calls []call
	for owner, conns := range checks {
		w, ok := byID[owner]
		if !ok || !w.Live(now.UnixMilli()) || w.Addr == "" {
			for _, c := range conns {
				out[c.ID] = Outcome{Done: true, Worker: owner, Why: "owner is not live"}
			}
			continue
		}
		calls = append(calls, chunk(w, conns)...)
	}
	pending := needs
	for round := 0; ; round++ {
		var assigned []call
		var unplaced []wakeup.Conn
		if len(pending) > 0 {
			assigned, unplaced = pool.assign(pending)
		}
		for _, c := range unplaced {
			out[c.ID] = Outcome{Why: "no live worker with spare capacity left to try"}
		}
		calls = append(calls, assigned...)
		if len(calls) == 0 {
			return out
		}
		pending = nil
		for _, r := range d.send(ctx, calls, spans) {
			pending = append(pending, d.settle(r, pool, now, out)...)
		}
		calls = nil
		if round > len(workers) { // every worker has been tried; cannot loop, but bound it anyway
			for _, c := range pending {
				out[c.ID] = Outcome{Why: "every worker refused"}
			}
			return out
		}
	}
}

// call is one request to one worker.
type call struct {
	worker codec.Worker
	req    wakeup.Request
	resp   wakeup.Response
	err    error
}

func chunk(w codec.Worker, conns []wakeup.Conn) []call {
	var cs []call
	for len(conns) > 0 {
		n := min(len(conns), wakeup.MaxConns)
		cs = append(cs, call{worker: w, req: wakeup.Request{V: wakeup.Version, Conns: conns[:n]}})
		conns = conns[n:]
	}
	return cs
}

// send runs the calls in parallel, each with its own timeout, and returns them with
// their answers in the order given. Each call's span is a child of the span of the
// first of its ids' decisions that has one, linked to the others' (spans).
func (d *Delivery) send(ctx context.Context, calls []call, spans map[string]trace.SpanContext) []call {
	timeout := d.Timeout
	if timeout <= 0 {
		timeout = DefaultWakeupTimeout
	}
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(callContext(ctx, calls[i].req.Conns, spans), timeout)
			defer cancel()
			calls[i].resp, calls[i].err = d.Sender.Send(cctx, calls[i].worker.Addr, calls[i].req)
		})
	}
	wg.Wait()
	return calls
}

// callContext is ctx under the span of the first of conns' decisions, with links to
// the spans of the rest.
func callContext(ctx context.Context, conns []wakeup.Conn, spans map[string]trace.SpanContext) context.Context {
	var parent trace.SpanContext
	var ls []trace.Link
	for _, c := range conns {
		switch sc := spans[c.ID]; {
		case !sc.IsValid():
		case !parent.IsValid():
			parent = sc
		case !sc.Equal(parent):
			ls = append(ls, trace.Link{SpanContext: sc})
		}
	}
	if parent.IsValid() {
		ctx = trace.ContextWithSpanContext(ctx, parent)
	}
	if len(ls) > 0 {
		ctx = wakeup.WithLinks(ctx, ls)
	}
	return ctx
}

// settle records the answers of one call and returns the needs-owner ids to offer to
// another worker.
func (d *Delivery) settle(c call, pool *pool, now time.Time, out map[string]Outcome) []wakeup.Conn {
	w := c.worker
	if c.err != nil {
		d.logger().Warn("wakeup not delivered", "worker", w.ID, "addr", w.Addr, "ids", len(c.req.Conns), "err", c.err)
		pool.drop(w.ID)
	}
	results := map[string]wakeup.ConnResult{}
	for _, r := range c.resp.Results {
		results[r.ID] = r
	}
	var again []wakeup.Conn
	for _, cn := range c.req.Conns {
		r, answered := results[cn.ID]
		o := Outcome{Worker: w.ID, Result: r.Result}
		switch {
		case c.err != nil:
			o.Why = fmt.Sprintf("worker %s unreachable: %v", w.ID, c.err)
		case !answered:
			o.Why = fmt.Sprintf("worker %s did not answer for it", w.ID)
		case cn.Reason == wakeup.Check:
			// Anything but a failure means the owner has seen the change (or no longer
			// holds the lease at this version, which is just as final).
			o.Done = r.Result != wakeup.Failed
			if !o.Done {
				o.Why = fmt.Sprintf("owner %s failed: %s", w.ID, r.Detail)
			}
		default:
			switch r.Result {
			case wakeup.Acquired:
				o.Done = true
				pool.took(w.ID)
			case wakeup.AlreadyOwned, wakeup.LostRace, wakeup.Stale, wakeup.NotStartable:
				o.Done = true
			case wakeup.NoCapacity:
				pool.full(w.ID)
				o.Why = fmt.Sprintf("worker %s has no capacity", w.ID)
			case wakeup.Draining:
				pool.drop(w.ID)
				o.Why = fmt.Sprintf("worker %s is draining", w.ID)
			default: // Failed, or an answer this version does not know
				o.Why = fmt.Sprintf("worker %s answered %q: %s", w.ID, r.Result, r.Detail)
			}
		}
		out[cn.ID] = o
		if !o.Done && cn.Reason == wakeup.NeedsOwner {
			pool.tried(cn.ID, w.ID)
			again = append(again, cn)
		}
	}
	if c.err == nil {
		d.Recent.put(w.ID, pool.answered(w.ID, c.resp.Load), now)
	}
	return again
}

func (d *Delivery) logger() *slog.Logger {
	if d.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return d.Log
}

// pool is the needs-owner candidates: live, not draining, with spare capacity.
type pool struct {
	workers []*slot
	byID    map[string]*slot
	triedBy map[string]map[string]bool // id -> workers already offered it
}

type slot struct {
	w codec.Worker
	// load orders the candidates: the higher of the registered load and the load
	// remembered from a recent reply, then as answered this call.
	load int
	// spare bounds the offers: from the lower of the two, since a worker that is
	// full after all only answers NoCapacity, while one wrongly thought full would
	// be left out until the memory of it expires.
	spare int
	gone  bool
}

func newPool(ws []codec.Worker, now time.Time, r *Recent) *pool {
	p := &pool{byID: map[string]*slot{}, triedBy: map[string]map[string]bool{}}
	for _, w := range ws {
		if !w.Live(now.UnixMilli()) || w.Draining || w.Spare() == 0 || w.Addr == "" {
			continue
		}
		s := &slot{w: w, load: w.Load, spare: w.Spare()}
		if seen, ok := r.get(w.ID, now); ok {
			s.load = max(w.Load, seen)
			s.spare = max(0, w.Capacity-min(w.Load, seen))
		}
		p.workers = append(p.workers, s)
		p.byID[w.ID] = s
	}
	return p
}

// assign gives each id to the least loaded worker (by utilisation, then most spare,
// then id) that has room and has not been offered it yet, one id at a time, so a
// burst is spread in proportion to spare capacity and no id goes to two workers.
func (p *pool) assign(ids []wakeup.Conn) (calls []call, unplaced []wakeup.Conn) {
	byWorker := map[string][]wakeup.Conn{}
	offered := map[string]int{}
	var order []string
	for _, c := range ids {
		var best *slot
		for _, s := range p.workers {
			if s.gone || s.spare-offered[s.w.ID] <= 0 || p.triedBy[c.ID][s.w.ID] {
				continue
			}
			if best == nil || less(s, best, offered, c.ID) {
				best = s
			}
		}
		if best == nil {
			unplaced = append(unplaced, c)
			continue
		}
		if len(byWorker[best.w.ID]) == 0 {
			order = append(order, best.w.ID)
		}
		offered[best.w.ID]++
		byWorker[best.w.ID] = append(byWorker[best.w.ID], c)
	}
	for _, id := range order {
		calls = append(calls, chunk(p.byID[id].w, byWorker[id])...)
	}
	return calls, unplaced
}

// less orders candidates for id conn: by utilisation, then most spare, then by a
// hash of (conn, worker), so that equally loaded workers are chosen evenly by
// reconcilers that know nothing of each other's offers (a cold start, or several
// running at once), instead of every one of them picking the lowest id. With conn
// empty (Workers), the last tie-break is the worker id.
func less(a, b *slot, offered map[string]int, conn string) bool {
	// Compare (load_a+o_a)/cap_a with (load_b+o_b)/cap_b without division.
	ua := (a.load + offered[a.w.ID]) * b.w.Capacity
	ub := (b.load + offered[b.w.ID]) * a.w.Capacity
	if ua != ub {
		return ua < ub
	}
	if c := cmp.Compare(a.spare-offered[a.w.ID], b.spare-offered[b.w.ID]); c != 0 {
		return c > 0
	}
	if conn != "" {
		if ha, hb := tie(conn, a.w.ID), tie(conn, b.w.ID); ha != hb {
			return ha > hb
		}
	}
	return a.w.ID < b.w.ID
}

// tie is the rendezvous hash of a connection and a worker.
func tie(conn, worker string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(conn))
	h.Write([]byte{0})
	h.Write([]byte(worker))
	return h.Sum64()
}

func (p *pool) took(worker string) {
	if s := p.byID[worker]; s != nil {
		s.load++
		s.spare = max(0, s.spare-1)
	}
}

// answered takes the load a worker reported in its reply, which counts everything
// it acquired (for this call or any other) and is exact as of the reply, over the
// count kept here. It returns the worker's load as now known, or -1 for a worker
// that reported none and is not a candidate.
func (p *pool) answered(worker string, reported *int) int {
	s := p.byID[worker]
	switch {
	case reported != nil && s != nil:
		s.load = *reported
		s.spare = max(0, s.w.Capacity-*reported)
		return s.load
	case reported != nil:
		return *reported
	case s != nil:
		return s.load
	}
	return -1
}

func (p *pool) full(worker string) {
	if s := p.byID[worker]; s != nil {
		s.spare = 0
	}
}

func (p *pool) drop(worker string) {
	if s := p.byID[worker]; s != nil {
		s.gone = true
	}
}

func (p *pool) tried(id, worker string) {
	if p.triedBy[id] == nil {
		p.triedBy[id] = map[string]bool{}
	}
	p.triedBy[id][worker] = true
}

// Workers returns the registry's needs-owner candidates in the order Deliver prefers
// them, for logs and tests.
func Workers(ws []codec.Worker, now time.Time) []codec.Worker {
	p := newPool(ws, now, nil)
	slices.SortFunc(p.workers, func(a, b *slot) int {
		if less(a, b, nil, "") {
			return -1
		}
		if less(b, a, nil, "") {
			return 1
		}
		return 0
	})
	out := make([]codec.Worker, len(p.workers))
	for i, s := range p.workers {
		out[i] = s.w
	}
	return out
}

// Recent remembers, per worker, the load it last reported in a wakeup reply (or,
// from a worker that reports none, its load as counted after what it acquired),
// for TTL. The registry's load is refreshed only once per renew interval (3 s by
// default), so without this every stream batch of a burst sees the same idle
// workers and sends everything to the same one.
//
// A Deliver call orders candidates by the higher of the registered and the
// remembered load: the remembered one is newer unless the worker shed connections
// since, and then the error only steers new connections away from it until the
// entry expires. Offers are bounded by the lower of the two (see slot).
//
// What holds when this memory cannot help:
//   - A cold reconciler (empty memory) spreads the ids of one batch as before, and
//     breaks ties among equally loaded workers by a hash of the id, so a burst
//     reaching it one record per batch is spread at random rather than piled on
//     one worker; from each worker's first reply on, it is exact again.
//   - Several reconcilers at once (one per stream shard; each warm process has its
//     own memory) learn each other's acquisitions from the replies: a worker's reply
//     counts what anyone gave it. A choice can be off only by the acquisitions other
//     reconcilers made on it since this one last heard from it, and the worker it
//     underestimates is the next it picks, which corrects the view.
//
// Safe for concurrent use. A nil *Recent remembers nothing.
type Recent struct {
	TTL time.Duration // default DefaultRecentTTL
	Max int           // workers remembered at most; default DefaultRecentMax

	mu sync.Mutex
	by map[string]seenLoad
}

type seenLoad struct {
	load int
	at   time.Time
}

// Recent's defaults. The TTL outlasts the registry refresh that makes an entry
// redundant: a worker rewrites its item every renew interval (3 s by default in
// stream mode, 5 s in polling mode; operators may set up to tens of seconds), each
// write bounded by that interval, so well within a minute the registry is as new as
// any reply.
const (
	DefaultRecentTTL = time.Minute
	DefaultRecentMax = 4096
)

func (r *Recent) get(worker string, now time.Time) (int, bool) {
	if r == nil {
		return 0, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.by[worker]
	if !ok || !r.fresh(e, now) {
		return 0, false
	}
	return e.load, true
}

func (r *Recent) put(worker string, load int, now time.Time) {
	if r == nil || load < 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.by == nil {
		r.by = map[string]seenLoad{}
	}
	r.by[worker] = seenLoad{load: load, at: now}
	limit := r.Max
	if limit <= 0 {
		limit = DefaultRecentMax
	}
	if len(r.by) <= limit {
		return
	}
	// Over the bound: forget what has expired, then the oldest.
	for id, e := range r.by {
		if !r.fresh(e, now) {
			delete(r.by, id)
		}
	}
	for len(r.by) > limit {
		oldest := ""
		for id, e := range r.by {
			if oldest == "" || e.at.Before(r.by[oldest].at) {
				oldest = id
			}
		}
		delete(r.by, oldest)
	}
}

// Len is how many workers are remembered, expired entries included.
func (r *Recent) Len() int {
	if r == nil {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.by)
}

func (r *Recent) fresh(e seenLoad, now time.Time) bool {
	ttl := r.TTL
	if ttl <= 0 {
		ttl = DefaultRecentTTL
	}
	return now.Sub(e.at) < ttl
}
