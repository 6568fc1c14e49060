package fleet

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sockfleet/sockfleet/shared/local/demoupstream"
	"github.com/sockfleet/sockfleet/shared/sinkrecord"
)

// Collector is an HTTP sink for a fleet's workers (SOCKFLEET_SINK=c.URL(id)). It
// records, in one order across all workers, which worker delivered each message and
// when it arrived, so a check can tell "two sockets, one delivering" (allowed during
// a handoff or rotation; counted from the upstream's log, see Overlaps) from "two
// delivering" (never allowed).
type Collector struct {
	ln  net.Listener
	srv *http.Server

	mu         sync.Mutex
	rows       map[string][]Arrival
	badHeaders []string // batches whose lease headers disagree with their records
}

// Arrival is one delivered message.
type Arrival struct {
	Worker string
	Seq    int64
	At     time.Time
	TS     int64 // the demo upstream's production time of the message (data.ts, unix ms); 0 if none
	// Version is the record's fencing token (lease_version).
	Version int64
}

// NewCollector listens on a free local port.
func NewCollector() (*Collector, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	c := &Collector{ln: ln, rows: map[string][]Arrival{}}
	c.srv = &http.Server{Handler: http.HandlerFunc(c.serve), ReadHeaderTimeout: 5 * time.Second}
	go c.srv.Serve(ln)
	return c, nil
}

// URL is the sink URL of worker id.
func (c *Collector) URL(id string) string { return "http://" + c.ln.Addr().String() + "/w/" + id }

// Close stops the listener.
func (c *Collector) Close() error { return c.srv.Close() }

func (c *Collector) serve(w http.ResponseWriter, r *http.Request) {
	worker, ok := strings.CutPrefix(r.URL.Path, "/w/")
	body, err := io.ReadAll(r.Body)
	if !ok || worker == "" || err != nil {
		http.Error(w, "want POST /w/<worker>", http.StatusBadRequest)
		return
	}
	batch, err := sinkrecord.ParseBatch(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	if why := headerMismatch(r.Header, batch); why != "" {
		c.badHeaders = append(c.badHeaders, worker+": "+why)
	}
	now := time.Now()
	for _, m := range batch {
		if !m.Bad {
			var ts int64
			if !m.Binary {
				ts, _ = demoupstream.ProducedAt(m.Data)
			}
			c.rows[m.Conn] = append(c.rows[m.Conn], Arrival{Worker: worker, Seq: m.Seq, At: now, TS: ts, Version: m.Version})
		}
	}
	c.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// headerMismatch says how the HTTP sink's headers (a batch's connection and lease
// version) disagree with the records of the batch, or "".
func headerMismatch(h http.Header, batch []sinkrecord.Record) string {
	conn, ver := h.Get("Sockfleet-Conn"), h.Get("Sockfleet-Lease-Version")
	if len(batch) == 0 {
		return ""
	}
	for _, m := range batch {
		if m.Conn != conn || strconv.FormatInt(m.Version, 10) != ver || m.Version == 0 {
			return fmt.Sprintf("headers %q at %q, a record of %q at %d", conn, ver, m.Conn, m.Version)
		}
	}
	return ""
}

// BadHeaders lists the batches whose headers disagreed with their records.
func (c *Collector) BadHeaders() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.badHeaders)
}

// Fenced applies the consumer rule's fencing step (docs/SINKS.md, "Fencing") to
// arrivals: an arrival whose lease_version is below one that arrived before it is
// stale, a displaced owner's late write. It returns the other arrivals and the stale
// ones.
func Fenced(arr []Arrival) (kept, stale []Arrival) {
	var highest int64
	for _, a := range arr {
		if a.Version < highest {
			stale = append(stale, a)
			continue
		}
		highest = a.Version
		kept = append(kept, a)
	}
	return kept, stale
}

// Arrivals returns what arrived for connection id, in arrival order.
func (c *Collector) Arrivals(id string) []Arrival {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Arrival(nil), c.rows[id]...)
}

// Stint is a run of deliveries by one worker, in arrival order.
type Stint struct {
	Worker      string
	First, Last int64 // sequences
	From, To    time.Time
}

// Stints splits arrivals into runs by worker.
func Stints(arr []Arrival) []Stint {
	var out []Stint
	for _, a := range arr {
		if n := len(out); n > 0 && out[n-1].Worker == a.Worker {
			out[n-1].Last, out[n-1].To = a.Seq, a.At
			continue
		}
		out = append(out, Stint{Worker: a.Worker, First: a.Seq, Last: a.Seq, From: a.At, To: a.At})
	}
	return out
}

// CheckSerial checks the invariant of planned moves (handoffs, and releases that
// carry the final checkpoint): in arrival order, across all workers, every sequence
// is the one after the previous: no gap, no duplicate, and so never two workers
// delivering at once (two deliverers would repeat each other's sequences). It also
// returns the gaps between stints: the time from the old owner's last delivery to
// the new owner's first.
func CheckSerial(arr []Arrival) ([]time.Duration, error) {
	gaps, _, err := CheckSerialReplays(arr, nil)
	return gaps, err
}

// CheckSerialReplays is CheckSerial that also accepts a replay: the worker that
// delivered the previous message going back to an earlier sequence (at least 1)
// and on, one by one, from there, where replayed(worker) says that worker gave up
// on a sink write of this connection (it resumes from its last checkpoint: at least
// once, not a handoff's doing). A second worker interleaving, or the replaying
// worker running two sessions, still breaks the one-by-one order. It returns the
// gaps between stints and the number of replays.
func CheckSerialReplays(arr []Arrival, replayed func(worker string) bool) ([]time.Duration, int, error) {
	var gaps []time.Duration
	replays := 0
	for i := 1; i < len(arr); i++ {
		p, a := arr[i-1], arr[i]
		if a.Seq != p.Seq+1 {
			if a.Worker == p.Worker && a.Seq >= 1 && a.Seq <= p.Seq && replayed != nil && replayed(a.Worker) {
				replays++
				continue
			}
			return gaps, replays, fmt.Errorf("%s delivered %d right after %s delivered %d: a gap, a duplicate or two deliverers", a.Worker, a.Seq, p.Worker, p.Seq)
		}
		if a.Worker != p.Worker {
			gaps = append(gaps, a.At.Sub(p.At))
		}
	}
	return gaps, replays, nil
}

// LandedAfterPause splits off the arrivals from worker that were read before it was
// paused at (their production time is earlier) but arrived after. For a pause past
// the worker's fence deadline, that is only a sink write in flight at the pause,
// completed when the worker resumed (docs/MEMBERSHIP.md, "Non-guarantees"); after a
// shorter pause the worker legitimately goes on delivering, so do not use it there.
// It returns the other arrivals and the sequences split off.
func LandedAfterPause(arr []Arrival, worker string, at time.Time) ([]Arrival, []int64) {
	var late []int64
	kept := slices.DeleteFunc(slices.Clone(arr), func(a Arrival) bool {
		l := a.Worker == worker && a.At.After(at) && a.TS != 0 && a.TS < at.UnixMilli()
		if l {
			late = append(late, a.Seq)
		}
		return l
	})
	return kept, late
}

// Planned is what CheckPlanned found over a set of connections.
type Planned struct {
	Gaps     []time.Duration // between stints, sorted
	Moved    int             // connections delivered by more than one worker
	Replays  int             // replays CheckSerialReplays accepted
	Problems []error         // one per connection that broke CheckSerial or delivered nothing
}

// CheckPlanned runs CheckSerialReplays over every connection of ids, as a run with
// only planned moves must pass it. replayed(worker, id) says whether worker gave up
// on a sink write of connection id (nil: no replay is accepted).
func (c *Collector) CheckPlanned(ids []string, replayed func(worker, id string) bool) Planned {
	var r Planned
	for _, id := range ids {
		arr := c.Arrivals(id)
		if len(arr) == 0 {
			r.Problems = append(r.Problems, fmt.Errorf("%s: nothing delivered", id))
			continue
		}
		var ok func(string) bool
		if replayed != nil {
			ok = func(w string) bool { return replayed(w, id) }
		}
		g, n, err := CheckSerialReplays(arr, ok)
		if err != nil {
			r.Problems = append(r.Problems, fmt.Errorf("%s: %w (stints %+v)", id, err, Stints(arr)))
		}
		r.Gaps = append(r.Gaps, g...)
		r.Replays += n
		if len(Stints(arr)) > 1 {
			r.Moved++
		}
	}
	slices.Sort(r.Gaps)
	return r
}

// String summarises the gaps between owners.
func (r Planned) String() string {
	g := r.Gaps
	if len(g) == 0 {
		return fmt.Sprintf("no change of deliverer over %d connections; %d replays after a sink write given up", r.Moved, r.Replays)
	}
	return fmt.Sprintf("%d changes of deliverer over %d connections; gap between owners: median %s, p99 %s, max %s; %d replays after a sink write given up",
		len(g), r.Moved, g[len(g)/2], g[len(g)*99/100], g[len(g)-1], r.Replays)
}

// CheckOneDeliverer is the invariant of every run, crashes included (where a new
// owner may repeat what the old one delivered after its last checkpoint): no gap, and
// never two workers delivering at once. A new owner resumes from a checkpoint: at or
// below the furthest sequence delivered, plus one. Two workers delivering at once
// show as stints that alternate, each going on from its own last sequence across the
// other's stint; that is reported, in either order of the two.
func CheckOneDeliverer(arr []Arrival) error {
	var furthest int64
	across := map[[2]string]bool{} // {w, x}: w went on from its own numbering after x delivered
	stints := Stints(arr)
	for i, s := range stints {
		if i > 0 && s.First > furthest+1 {
			return fmt.Errorf("%s began at %d, past the furthest delivered %d: a gap", s.Worker, s.First, furthest)
		}
		if i > 0 && resumesOwn(arr, s) {
			x := stints[i-1].Worker
			across[[2]string{s.Worker, x}] = true
			if across[[2]string{x, s.Worker}] {
				return fmt.Errorf("%s and %s each went on from their own sequences across the other's deliveries (at %d): two deliverers", s.Worker, x, s.First)
			}
		}
		furthest = max(furthest, s.Last)
	}
	return nil
}

// resumesOwn reports whether stint s continues its worker's own earlier numbering
// exactly (its first sequence is one past the last it delivered before), which a
// new acquisition, resuming from a checkpoint, does not do when another worker
// delivered in between.
func resumesOwn(arr []Arrival, s Stint) bool {
	last := int64(-1)
	for _, a := range arr {
		if !a.At.Before(s.From) {
			break
		}
		if a.Worker == s.Worker {
			last = a.Seq
		}
	}
	return last >= 0 && s.First == last+1
}

// TwoDeliverers measures how long two workers delivered a connection at once. Each
// worker's deliveries are spans: runs of its arrivals no more than idle apart (a
// worker streaming at the test's rate writes a batch every few tens of ms). It
// returns the total time covered by the spans of two or more workers. A move of
// any kind (a handoff, a release and acquire, a crash and takeover) leaves the old
// owner's last arrival before the new owner's first, which is 0.
func TwoDeliverers(arr []Arrival, idle time.Duration) time.Duration {
	type span struct{ from, to time.Time }
	open := map[string]*span{}
	var spans []span
	for _, a := range arr {
		s := open[a.Worker]
		if s != nil && a.At.Sub(s.to) <= idle {
			s.to = a.At
			continue
		}
		if s != nil {
			spans = append(spans, *s)
		}
		open[a.Worker] = &span{a.At, a.At}
	}
	for _, s := range open {
		spans = append(spans, *s)
	}
	type edge struct {
		at time.Time
		d  int
	}
	var edges []edge
	for _, s := range spans {
		edges = append(edges, edge{s.from, 1}, edge{s.to, -1})
	}
	slices.SortFunc(edges, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.d - b.d // a span that ends where another begins does not overlap it
	})
	var total time.Duration
	n := 0
	var since time.Time
	for _, e := range edges {
		if n >= 2 {
			total += e.at.Sub(since)
		}
		n += e.d
		since = e.at
	}
	return total
}
