package main

// Membership scenarios (issue 12, stream mode only): the write bill at a realistic
// density, idle and streaming; an outage of the table longer than the membership
// lease; and the reconciler's stream invocations at several fleet sizes.

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/sockfleet/sockfleet/shared/local/fleet"
	"github.com/sockfleet/sockfleet/shared/schema"
)

// Protocol constants the formula uses: the worker's defaults (docs/MEMBERSHIP.md).
const (
	renewEvery      = 3 * time.Second  // SOCKFLEET_RENEW_INTERVAL
	checkpointEvery = 30 * time.Second // SOCKFLEET_CHECKPOINT_INTERVAL
	renewWRU        = 1.0              // the worker item alone: the registry index is KEYS_ONLY
	checkpointWRU   = 1.0              // a connection item under 1 KB, no index touched
)

// FormulaWCU is the write units per connection-hour the protocol predicts at perWorker
// connections per worker: the membership renews shared out, plus, for streaming
// connections, one checkpoint per interval.
func FormulaWCU(perWorker int, streaming bool) float64 {
	w := float64(time.Hour/renewEvery) * renewWRU / float64(perWorker)
	if streaming {
		w += float64(time.Hour/checkpointEvery) * checkpointWRU
	}
	return w
}

// MembershipResult holds the issue-12 scenarios.
type MembershipResult struct {
	Density []*Density `json:"density,omitempty"`
	Outage  *Outage    `json:"outage,omitempty"`
	Members []*Members `json:"members,omitempty"`
}

// Density is the bill of one fleet at many connections per worker.
type Density struct {
	Phase     string  `json:"phase"` // "idle" (no messages) or "streaming"
	Workers   int     `json:"workers"`
	PerWorker int     `json:"per_worker"`
	Rate      float64 `json:"rate"`
	SettleSec float64 `json:"settle_s"` // last insert to all streaming
	Steady    *Steady `json:"steady,omitempty"`
	// Checkpoints is the workers' sockfleet_checkpoints_total over the window; the
	// other UpdateItem calls of the workers are membership renews.
	Checkpoints float64 `json:"checkpoints"`
	Err         string  `json:"error,omitempty"`
}

// Renews is the membership renews in the window (worker UpdateItems that were not
// checkpoints: in steady state nothing else is updated).
func (d *Density) Renews() float64 {
	if d.Steady == nil {
		return 0
	}
	return float64(d.Steady.Calls["UpdateItem"]) - d.Checkpoints
}

// Outage is the table cut off from every worker and the reconciler for longer than
// the membership lease, then back.
type Outage struct {
	Workers int            `json:"workers"`
	Conns   int            `json:"conns"`
	DownSec float64        `json:"down_s"`
	Trials  []OutageTrial  `json:"trials"`
	Notes   map[string]int `json:"notes,omitempty"`
}

// OutageTrial is one outage.
type OutageTrial struct {
	// FencedClients is the upstream clients left at the end of the outage: the
	// workers' self-fence should have closed every socket.
	FencedClients int `json:"fenced_clients"`
	// RecoverMs: from the engine's return to every connection streaming again (one
	// upstream client each, owned by a running worker).
	RecoverMs float64 `json:"recover_ms"`
	// Replaced is how many workers exited (declared dead, say) between the outage's
	// start and 5 s after the recovery.
	Replaced int    `json:"replaced"`
	Err      string `json:"error,omitempty"`
}

// Members is the steady state of a fleet of a given size, for its invocations.
type Members struct {
	Workers int     `json:"workers"`
	Steady  *Steady `json:"steady,omitempty"`
	Err     string  `json:"error,omitempty"`
}

// InvocationsPerHour is the stream invocations of the reconciler per hour.
func (m *Members) InvocationsPerHour() float64 {
	if m.Steady == nil {
		return 0
	}
	return PerHour(float64(m.Steady.StreamInvocations), m.Steady.window())
}

// membershipOptions selects the scenarios; zero values skip them.
type membershipOptions struct {
	density int           // connections per worker, 2 workers
	outage  time.Duration // how long the table is cut off
	members []int         // fleet sizes for the invocation count
	trials  int
	restart time.Duration
	workDir string
	bins    fleet.Binaries
	logf    func(string, ...any)
	log     *slog.Logger // the fleets' own log
}

func (o membershipOptions) any() bool { return o.density > 0 || o.outage > 0 || len(o.members) > 0 }

// runMembership runs the selected scenarios one after the other, each on a fresh
// fleet, and records what it can even when one fails.
func runMembership(ctx context.Context, o membershipOptions, r *runner) *MembershipResult {
	res := &MembershipResult{}
	if o.density > 0 {
		for _, phase := range []struct {
			name string
			rate float64
		}{{"idle", 0}, {"streaming", 1}} {
			if ctx.Err() != nil {
				break
			}
			d := &Density{Phase: phase.name, Workers: 2, PerWorker: o.density, Rate: phase.rate}
			res.Density = append(res.Density, d)
			if err := r.density(ctx, o, d); err != nil {
				d.Err = err.Error()
				o.logf("density %s: %v", phase.name, err)
			}
		}
	}
	if o.outage > 0 && ctx.Err() == nil {
		res.Outage = &Outage{Workers: 3, Conns: 30, DownSec: o.outage.Seconds()}
		if err := r.outage(ctx, o, res.Outage); err != nil {
			res.Outage.Trials = append(res.Outage.Trials, OutageTrial{Err: err.Error()})
			o.logf("outage: %v", err)
		}
	}
	for _, n := range o.members {
		if ctx.Err() != nil {
			break
		}
		m := &Members{Workers: n}
		res.Members = append(res.Members, m)
		if err := r.members(ctx, o, m); err != nil {
			m.Err = err.Error()
			o.logf("members %d: %v", n, err)
		}
	}
	return res
}

// density holds 2 × perWorker connections (capacity 500 each, the CDK default),
// lets start-up writes pass one checkpoint interval, then meters a window of at
// least two checkpoint intervals.
func (r *runner) density(ctx context.Context, o membershipOptions, d *Density) error {
	spec := fleetSpec{Mode: schema.ModeStream, Workers: d.Workers, Conns: d.Workers * d.PerWorker, MaxConnections: 500,
		Rate: d.Rate, Size: 16, RestartDelay: o.restart}
	o.logf("density %s: starting %d workers, %d connections", d.Phase, spec.Workers, spec.Conns)
	f, err := startFleet(ctx, o.bins, spec, filepath.Join(o.workDir, "density-"+d.Phase), o.log)
	if err != nil {
		return err
	}
	defer f.Stop()
	t0 := time.Now()
	if err := f.waitSettled(ctx, 10*time.Minute); err != nil {
		return fmt.Errorf("start-up: %w", err)
	}
	d.SettleSec = time.Since(t0).Seconds()
	o.logf("density %s: all streaming after %s, owned %v", d.Phase, time.Since(t0).Round(time.Second), f.distribution(ctx))
	if err := sleep(ctx, checkpointEvery+5*time.Second); err != nil {
		return err
	}
	w := max(r.window, 2*checkpointEvery)
	cp0 := f.metric(ctx, "sockfleet_checkpoints_total")
	st, err := (&runner{window: w}).steady(ctx, f)
	if err != nil {
		return err
	}
	d.Checkpoints = f.metric(ctx, "sockfleet_checkpoints_total") - cp0
	d.Steady = st
	o.logf("density %s: %.2f WCU/conn-h over %s (%.0f renews, %.0f checkpoints), %.0f RCU/h, %d stream invocations",
		d.Phase, st.WCUPerConnHour(), w, d.Renews(), d.Checkpoints, st.RCUPerHour(), st.StreamInvocations)
	return nil
}

// outage cuts the table off from every worker and the reconciler for o.outage
// (longer than the membership lease), then restores it and times the recovery.
func (r *runner) outage(ctx context.Context, o membershipOptions, out *Outage) error {
	spec := fleetSpec{Mode: schema.ModeStream, Workers: out.Workers, Conns: out.Conns, Rate: 5, Size: 32, RestartDelay: o.restart}
	o.logf("outage: starting %d workers, %d connections", spec.Workers, spec.Conns)
	f, err := startFleet(ctx, o.bins, spec, filepath.Join(o.workDir, "outage"), o.log)
	if err != nil {
		return err
	}
	defer f.Stop()
	for i := range max(1, o.trials) {
		if err := f.waitSettled(ctx, 3*time.Minute); err != nil {
			return err
		}
		if err := sleep(ctx, 5*time.Second); err != nil {
			return err
		}
		before := f.procIDs()
		f.workers.SetDown(true)
		f.recon.SetDown(true)
		err := sleep(ctx, o.outage)
		clients := 0
		for _, id := range f.ids {
			clients += f.up.Stats(id).Clients
		}
		back := time.Now()
		f.workers.SetDown(false)
		f.recon.SetDown(false)
		if err != nil {
			return err
		}
		tr := OutageTrial{FencedClients: clients}
		gap, err := waitFor(back, 20*time.Millisecond, 3*time.Minute, "all streaming after the outage", func() bool {
			return f.allStreaming(ctx)
		})
		if err != nil {
			tr.Err = err.Error()
		}
		tr.RecoverMs = ms1(gap)
		// A member declared dead learns it at its next renew (within 3 s) and exits.
		if err := sleep(ctx, 5*time.Second); err != nil {
			return err
		}
		tr.Replaced = f.replacedSince(before)
		out.Trials = append(out.Trials, tr)
		o.logf("outage trial %d: %d clients left at the end of %s down; all streaming %s after the return; %d workers replaced",
			i, clients, o.outage, gap.Round(time.Millisecond), tr.Replaced)
	}
	return nil
}

// members runs a fleet of m.Workers workers, 3 connections each at 1 message/s, and
// counts the reconciler's stream invocations over the window.
func (r *runner) members(ctx context.Context, o membershipOptions, m *Members) error {
	spec := fleetSpec{Mode: schema.ModeStream, Workers: m.Workers, Conns: 3 * m.Workers, Rate: 1, Size: 16, RestartDelay: o.restart}
	o.logf("members: starting %d workers, %d connections", spec.Workers, spec.Conns)
	f, err := startFleet(ctx, o.bins, spec, filepath.Join(o.workDir, fmt.Sprintf("members-%d", m.Workers)), o.log)
	if err != nil {
		return err
	}
	defer f.Stop()
	if err := f.waitSettled(ctx, 5*time.Minute); err != nil {
		return fmt.Errorf("start-up: %w", err)
	}
	if err := sleep(ctx, 25*time.Second); err != nil {
		return err
	}
	st, err := r.steady(ctx, f)
	if err != nil {
		return err
	}
	m.Steady = st
	o.logf("members %d: %d stream invocations in %s: %.0f per hour", m.Workers, st.StreamInvocations,
		st.window().Round(time.Second), m.InvocationsPerHour())
	return nil
}

// allStreaming reports whether every connection has exactly one upstream client and
// is owned by a worker that is running now.
func (f *benchFleet) allStreaming(ctx context.Context) bool {
	if !f.oneClientEach(f.ids) {
		return false
	}
	running := f.procIDs()
	cs, err := f.conns(ctx)
	if err != nil {
		return false
	}
	for _, id := range f.ids {
		c := cs[id]
		if !c.Owned() || !running[c.LeaseOwner] {
			return false
		}
	}
	return true
}

// procIDs is the ids of the workers running now.
func (f *benchFleet) procIDs() map[string]bool {
	ids := map[string]bool{}
	for slot := range f.spec.Workers {
		p := f.stack.Sup.Get(slot)
		if p == nil {
			continue
		}
		select {
		case <-p.Done():
		default:
			ids[p.ID] = true
		}
	}
	return ids
}

// replacedSince counts the workers of before that are no longer running.
func (f *benchFleet) replacedSince(before map[string]bool) int {
	now := f.procIDs()
	n := 0
	for id := range before {
		if !now[id] {
			n++
		}
	}
	return n
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// writeMembership renders the issue-12 scenarios.
func writeMembership(p func(string, ...any), m *MembershipResult) {
	if len(m.Density) > 0 {
		p("")
		p("## Write units at a realistic density (issue 12, stream mode)")
		p("")
		p("2 workers (capacity 500 each, the CDK default), measured after every connection streamed and one more checkpoint interval, over a window of at least two checkpoint intervals; billed capacity through the metering proxies, index writes included. Renews are the workers' UpdateItem calls that were not checkpoints (`sockfleet_checkpoints_total`).")
		p("")
		p("| phase | connections per worker | messages/s per stream | window | renews | checkpoints | WCU per connection-hour | goal | formula | RCU per hour, fleet | stream invocations | result |")
		p("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
		for _, d := range m.Density {
			streaming := d.Phase == "streaming"
			goal := 5.0
			if streaming {
				goal = 130
			}
			if d.Steady == nil {
				p("| %s | %d | %g | – | – | – | – | ≤ %g | %s | – | – | failed: %s |", d.Phase, d.PerWorker, d.Rate, goal,
					fmtWCU(FormulaWCU(d.PerWorker, streaming)), oneLine(d.Err))
				continue
			}
			s := d.Steady
			w := s.WCUPerConnHour()
			result := "pass"
			if w > goal {
				result = "**miss**"
			}
			p("| %s | %d | %g | %.0f s | %.0f | %.0f | %s | ≤ %g | %s | %s | %d | %s |", d.Phase, d.PerWorker, d.Rate, s.WindowSec,
				d.Renews(), d.Checkpoints, fmtWCU(w), goal, fmtWCU(FormulaWCU(d.PerWorker, streaming)), fmtNum(s.RCUPerHour()),
				s.StreamInvocations, result)
		}
		p("")
		p("The formula: %s renews per worker-hour at %g WRU, shared by the worker's connections, plus %s checkpoints per streaming connection-hour at %g WRU:",
			commas(int64(time.Hour/renewEvery)), renewWRU, commas(int64(time.Hour/checkpointEvery)), checkpointWRU)
		p("")
		p("| connections per worker | idle | streaming |")
		p("|---:|---:|---:|")
		for _, n := range []int{1, 10, 100, 250, 500} {
			p("| %d | %s | %s |", n, fmtWCU(FormulaWCU(n, false)), fmtWCU(FormulaWCU(n, true)))
		}
	}
	if o := m.Outage; o != nil {
		p("")
		p("## Outage longer than the membership lease (issue 12, stream mode)")
		p("")
		p("%d workers, %d connections; the table cut off from every worker and the reconciler (both metering proxies cut every connection) for %.0f s, against a membership lease of 11 s. Recovery: from the table's return to every connection streaming again (exactly one upstream client, owned by a running worker). Goal: at most 15 s.", o.Workers, o.Conns, o.DownSec)
		p("")
		p("| trial | upstream clients at the end of the outage | recovery | workers replaced | result |")
		p("|---:|---:|---:|---:|---|")
		for i, t := range o.Trials {
			result := "pass"
			if t.Err != "" {
				result = "failed: " + oneLine(t.Err)
			} else if t.RecoverMs > 15000 {
				result = "**miss**"
			}
			p("| %d | %d | %s | %d | %s |", i, t.FencedClients, fmtMs(t.RecoverMs), t.Replaced, result)
		}
	}
	if len(m.Members) > 0 {
		p("")
		p("## Reconciler invocations by fleet size (issue 12, stream mode)")
		p("")
		p("Steady state, 3 connections per worker at 1 message/s. Every worker-item change passes the event filter (one record per worker per 3 s renew, at most %s per worker-hour); the local stream poller batches what it finds per poll, as the event source mapping batches a shard's records, so invocations are at most that.", commas(int64(time.Hour/renewEvery)))
		p("")
		p("| workers | window | stream invocations | per hour | per worker-hour |")
		p("|---:|---:|---:|---:|---:|")
		for _, x := range m.Members {
			if x.Steady == nil {
				p("| %d | – | – | – | failed: %s |", x.Workers, oneLine(x.Err))
				continue
			}
			h := x.InvocationsPerHour()
			p("| %d | %.0f s | %d | %s | %s |", x.Workers, x.Steady.WindowSec, x.Steady.StreamInvocations, fmtNum(h), fmtNum(h/float64(x.Workers)))
		}
	}
	p("")
}

// fmtWCU keeps one decimal below 1,000, where the goals (5 and 130) sit.
func fmtWCU(x float64) string {
	if x >= 1000 {
		return commas(int64(x + 0.5))
	}
	return fmt.Sprintf("%.1f", x)
}
