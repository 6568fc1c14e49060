package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/sockfleet/sockfleet/functions/reconciler/rebalance"
	"github.com/sockfleet/sockfleet/shared/local/fleet"
	"github.com/sockfleet/sockfleet/shared/schema"
)

// RebalanceResult is the scale-out and scale-in scenario (issue 13): a fleet of 3
// workers grows to 5 and shrinks back to 3, with rebalance rounds in the reconciler.
type RebalanceResult struct {
	Conns    int `json:"conns"`
	Capacity int `json:"capacity"`
	// Scale-out: from the two new workers' start until every worker is within its
	// band (±10 % of the mean utilisation); -1 if not within the limit.
	BalancedSec float64 `json:"balanced_s"`
	Before      []int   `json:"owned_before"`
	After       []int   `json:"owned_after"`
	Minimum     int     `json:"minimum_moves"`  // from the distribution before, over 5 workers
	Accepted    int     `json:"moves_accepted"` // rounds before the first SIGTERM
	// Rounds after the first SIGTERM, against the minimum from the distribution the
	// drains left (over the 3 workers left, read once both had exited).
	ShrinkMinimum  int `json:"shrink_minimum_moves"`
	ShrinkAccepted int `json:"shrink_moves_accepted"`
	shrinkAt       time.Time
	Rounds         int `json:"rounds"`
	Results        map[string]int
	ReadUnits      float64 `json:"round_read_units"`
	// Scale-in: from the first SIGTERM until every connection streams on the 3 left
	// and they are within their bands; -1 if not within the limit.
	ShrunkSec float64 `json:"shrunk_s"`
	Final     []int   `json:"owned_final"`
	// At the sinks, over the whole run.
	Missing    int      `json:"missing_seqs"`
	Duplicates int      `json:"duplicate_seqs"`
	Problems   []string `json:"problems,omitempty"`
}

// runRebalance runs the scenario once at conns connections, capacity per worker.
func runRebalance(ctx context.Context, bins fleet.Binaries, dir string, conns, capacity int, logf func(string, ...any)) (*RebalanceResult, error) {
	res := &RebalanceResult{Conns: conns, Capacity: capacity, Results: map[string]int{}, BalancedSec: -1, ShrunkSec: -1}
	spec := fleetSpec{Mode: schema.ModeStream, Workers: 3, Conns: conns, MaxConnections: capacity, Rate: 1, Size: 16, NoRestart: true}
	logf("rebalance: starting 3 workers, %d connections, capacity %d", conns, capacity)
	f, err := startFleet(ctx, bins, spec, dir, slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, err
	}
	defer f.Stop()
	if err := f.waitSettled(ctx, 3*time.Minute); err != nil {
		return nil, err
	}
	before, err := f.owners(ctx)
	if err != nil {
		return nil, err
	}
	res.Before = f.distribution(ctx)

	logf("rebalance: %v; starting 2 more workers", res.Before)
	grow := time.Now()
	for _, slot := range []int{3, 4} {
		port, err := listenPort()
		if err != nil {
			return nil, err
		}
		if _, err := f.stack.StartWorker(ctx, slot, port); err != nil {
			return nil, err
		}
	}
	f.spec.Workers = 5
	if err := f.waitWorkers(ctx, time.Minute); err != nil {
		return nil, err
	}
	res.Minimum = minimumMoves(f.workerIDs(), before, capacity)
	if d, err := waitFor(grow, 250*time.Millisecond, 3*time.Minute, "every worker in its band", func() bool {
		return f.oneClientEach(f.ids) && f.balanced(ctx, capacity)
	}); err == nil {
		res.BalancedSec = d.Seconds()
	} else {
		res.Problems = append(res.Problems, err.Error())
	}
	res.After = f.distribution(ctx)
	logf("rebalance: %v after %.1f s", res.After, res.BalancedSec)

	logf("rebalance: SIGTERM to two workers (slots 3 and 0)")
	shrink := time.Now()
	res.shrinkAt = shrink
	for _, slot := range []int{3, 0} {
		p := f.stack.Sup.Get(slot)
		if err := f.stack.Sup.Signal(slot, syscall.SIGTERM); err != nil {
			return nil, err
		}
		select {
		case <-p.Done():
		case <-time.After(time.Minute):
			res.Problems = append(res.Problems, "worker "+p.ID+" did not drain within 1 min")
		}
	}
	if drained, err := f.owners(ctx); err == nil {
		res.ShrinkMinimum = minimumMoves(f.workerIDs(), drained, capacity)
	}
	if d, err := waitFor(shrink, 250*time.Millisecond, 90*time.Second, "3 workers, every connection streaming, in band", func() bool {
		return f.oneClientEach(f.ids) && f.balanced(ctx, capacity)
	}); err == nil {
		res.ShrunkSec = d.Seconds()
	} else {
		res.Problems = append(res.Problems, err.Error())
	}
	res.Final = f.distribution(ctx)
	time.Sleep(2 * time.Second) // the last deliveries reach the sinks
	f.stack.Stop()
	if err := res.readRounds(filepath.Join(dir, "logs", "reconciler.log")); err != nil {
		res.Problems = append(res.Problems, err.Error())
	}
	sinks, err := fleet.ReadSinks(dir)
	if err != nil {
		res.Problems = append(res.Problems, err.Error())
	}
	for _, id := range f.ids {
		d := sinks[id]
		if d == nil {
			res.Problems = append(res.Problems, id+": nothing delivered")
			continue
		}
		res.Duplicates += d.Duplicates
		for s := int64(1); s <= d.Max; s++ {
			if d.Seqs[s] == 0 {
				res.Missing++
			}
		}
	}
	return res, nil
}

// workerIDs is the ids of the live slots' workers.
func (f *benchFleet) workerIDs() []string {
	var out []string
	for slot := range f.spec.Workers {
		if p := f.stack.Sup.Get(slot); p != nil {
			select {
			case <-p.Done():
			default:
				out = append(out, p.ID)
			}
		}
	}
	return out
}

// owners maps each connection to its owner (only held leases).
func (f *benchFleet) owners(ctx context.Context) (map[string]string, error) {
	cs, err := f.conns(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for id, c := range cs {
		if c.Owned() {
			out[id] = c.LeaseOwner
		}
	}
	return out, nil
}

// balanced: every connection is held by a running worker, and each running worker
// holds a count within its band.
func (f *benchFleet) balanced(ctx context.Context, capacity int) bool {
	owners, err := f.owners(ctx)
	if err != nil || len(owners) != len(f.ids) {
		return false
	}
	ws, cs := planOf(f.workerIDs(), owners, capacity)
	running := map[string]bool{}
	for _, w := range ws {
		running[w.ID] = true
	}
	n := map[string]int{}
	for _, o := range owners {
		if !running[o] {
			return false
		}
		n[o]++
	}
	band, err := rebalance.Band(ws, cs, rebalance.Config{})
	if err != nil {
		return false
	}
	for id, b := range band {
		if n[id] < b[0] || n[id] > b[1] {
			return false
		}
	}
	return true
}

func planOf(workers []string, owners map[string]string, capacity int) ([]rebalance.Worker, []rebalance.Conn) {
	var ws []rebalance.Worker
	for _, id := range workers {
		ws = append(ws, rebalance.Worker{ID: id, Capacity: capacity})
	}
	var cs []rebalance.Conn
	for _, id := range slices.Sorted(func(yield func(string) bool) {
		for k := range owners {
			if !yield(k) {
				return
			}
		}
	}) {
		cs = append(cs, rebalance.Conn{ID: id, Owner: owners[id]})
	}
	return ws, cs
}

// minimumMoves is the fewest moves that balance workers from owners.
func minimumMoves(workers []string, owners map[string]string, capacity int) int {
	ws, cs := planOf(workers, owners, capacity)
	p, err := rebalance.Compute(ws, cs, time.Now(), rebalance.Config{MaxFraction: 1})
	if err != nil {
		return -1
	}
	return p.Min
}

// readRounds adds up the reconciler's "rebalance round" log lines.
func (r *RebalanceResult) readRounds(path string) error {
	fh, err := os.Open(path)
	if err != nil {
		return err
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		if !strings.Contains(sc.Text(), `"rebalance round"`) {
			continue
		}
		var l struct {
			Time      string         `json:"time"`
			Accepted  int            `json:"accepted"`
			Results   map[string]int `json:"results"`
			ReadUnits float64        `json:"read_units"`
		}
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			continue // a line of the emulator's own, not the function's
		}
		r.Rounds++
		if at, err := time.Parse(time.RFC3339Nano, l.Time); err == nil && !r.shrinkAt.IsZero() && !at.Before(r.shrinkAt) {
			r.ShrinkAccepted += l.Accepted
		} else {
			r.Accepted += l.Accepted
		}
		r.ReadUnits += l.ReadUnits
		for k, v := range l.Results {
			r.Results[k] += v
		}
	}
	return sc.Err()
}

// writeRebalance prints the scenario's figures as Markdown.
func writeRebalance(w *os.File, r *RebalanceResult, machine, load string) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	p("### Rebalance: 3 → 5 → 3 workers, %d connections (capacity %d each)", r.Conns, r.Capacity)
	p("")
	p("Machine: %s; load average %s (shared with other builds).", machine, load)
	p("")
	p("| figure | value | goal |")
	p("|---|---|---|")
	p("| new workers' start → every worker within ±10 %% of the mean | %s | ≤ 60 s |", secs(r.BalancedSec))
	p("| moves taken on / minimum, growing | %d / %d (%s) | ≤ 1.1 × |", r.Accepted, r.Minimum, ratio(r.Accepted, r.Minimum))
	p("| rebalance moves taken on / minimum after the drains (drain handoffs not counted) | %d / %d (%s) | ≤ 1.1 × |", r.ShrinkAccepted, r.ShrinkMinimum, ratio(r.ShrinkAccepted, r.ShrinkMinimum))
	p("| rounds (log lines), handoff answers | %d, %v | |", r.Rounds, r.Results)
	p("| read units of the rounds | %.1f | |", r.ReadUnits)
	p("| owned before / after growing / after shrinking | %v / %v / %v | |", r.Before, r.After, r.Final)
	p("| first SIGTERM → 3 workers in band, all streaming | %s | |", secs(r.ShrunkSec))
	p("| missing / duplicate sequences at the sinks | %d / %d | 0 / 0 |", r.Missing, r.Duplicates)
	for _, pr := range r.Problems {
		p("")
		p("Problem: %s", pr)
	}
}

func secs(s float64) string {
	if s < 0 {
		return "not reached"
	}
	return fmt.Sprintf("%.1f s", s)
}

func ratio(a, b int) string {
	if b <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f ×", float64(a)/float64(b))
}

func listenPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// rebalanceMain runs the scenario alone (-rebalance N) and writes <out>/rebalance.md
// and <out>/rebalance.json.
func rebalanceMain(ctx context.Context, out string, conns, capacity int) error {
	logf := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "sockfleet-rebalance-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	bins, err := fleet.Build(filepath.Join(work, "bin"))
	if err != nil {
		return err
	}
	started, loadStart := time.Now().UTC().Format("2006-01-02 15:04 MST"), loadavg()
	r, err := runRebalance(ctx, bins, filepath.Join(work, "fleet"), conns, capacity, logf)
	if err != nil {
		return err
	}
	b, _ := json.MarshalIndent(r, "", "  ")
	if err := os.WriteFile(filepath.Join(out, "rebalance.json"), b, 0o644); err != nil {
		return err
	}
	md, err := os.Create(filepath.Join(out, "rebalance.md"))
	if err != nil {
		return err
	}
	defer md.Close()
	fmt.Fprintf(md, "Command: `go run ./cmd/sockfleet-bench -rebalance %d`, started %s.\n\n", conns, started)
	writeRebalance(md, r, machine(), loadStart+" at the start, "+loadavg()+" at the end")
	writeRebalance(os.Stdout, r, machine(), loadStart+" at the start, "+loadavg()+" at the end")
	return nil
}
