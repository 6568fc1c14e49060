package main

import (
	"context"
	"fmt"
	"syscall"
	"time"

	"github.com/sockfleet/sockfleet/shared/schema"
)

// ModeResult is everything measured for one mode. Times are in milliseconds.
type ModeResult struct {
	Mode    string `json:"mode"`
	Timings string `json:"timings"`
	Workers int    `json:"workers"`
	Conns   int    `json:"conns"`
	Rate    float64
	Sigterm []float64 `json:"sigterm_gap_ms"`
	Sigkill []float64 `json:"sigkill_gap_ms"`
	// Sigstop: a hung worker (SIGSTOP, then SIGCONT once its connections stream
	// elsewhere), signal to all of them streaming elsewhere.
	Sigstop     []float64 `json:"sigstop_gap_ms,omitempty"`
	StopVictims []int     `json:"sigstop_victims,omitempty"`
	Victims     []int     `json:"victims_per_trial"` // SIGTERM trials, then SIGKILL trials
	Started     []float64 `json:"flip_started_ms"`
	Stopped     []float64 `json:"flip_stopped_ms"`
	Steady      *Steady   `json:"steady,omitempty"`
	Mass        *Mass     `json:"mass,omitempty"`
	Problems    []string  `json:"problems,omitempty"`
}

// Steady is the fleet's DynamoDB bill and reconciler invocations over a quiet window.
type Steady struct {
	WindowSec         float64 `json:"window_s"`
	Conns             int     `json:"conns"`
	WorkerWriteUnits  float64 `json:"worker_wcu"`
	WorkerReadUnits   float64 `json:"worker_rcu"`
	ReconWriteUnits   float64 `json:"reconciler_wcu"` // the sweep, in steady state
	ReconReadUnits    float64 `json:"reconciler_rcu"`
	StreamInvocations int     `json:"stream_invocations"`
	SweepRuns         int     `json:"sweep_runs"`
	SweepPeriodSec    float64 `json:"sweep_period_s"`
	Calls             map[string]int
}

func (s *Steady) window() time.Duration { return time.Duration(s.WindowSec * float64(time.Second)) }

// WCUPerConnHour is the whole bill's write units per connection-hour.
func (s *Steady) WCUPerConnHour() float64 {
	return PerConnHour(s.WorkerWriteUnits+s.ReconWriteUnits, s.Conns, s.window())
}

// RCUPerHour is the whole fleet's read units per hour.
func (s *Steady) RCUPerHour() float64 {
	return PerHour(s.WorkerReadUnits+s.ReconReadUnits, s.window())
}

// SweepRCUPerHour is the part of RCUPerHour the sweep reads.
func (s *Steady) SweepRCUPerHour() float64 { return PerHour(s.ReconReadUnits, s.window()) }

// InvocationsPerConnHour is stream invocations of the reconciler per connection-hour.
func (s *Steady) InvocationsPerConnHour() float64 {
	return PerConnHour(float64(s.StreamInvocations), s.Conns, s.window())
}

// Mass is the 1,000-connection failover.
type Mass struct {
	Workers        int     `json:"workers"`
	Conns          int     `json:"conns"`
	MaxConnections int     `json:"max_connections"`
	StartupSec     float64 `json:"startup_s"` // last insert to all streaming
	Before         []int   `json:"owned_before"`
	Victim         int     `json:"victim_conns"`
	GapMs          float64 `json:"gap_ms"`
	CCF            int     `json:"conditional_check_failed"`
	LostRaces      float64 `json:"lost_races"` // from the survivors' /metrics
	Err            string  `json:"error,omitempty"`
}

// CCFPerConn is conditional-check failures per reassigned connection.
func (m *Mass) CCFPerConn() float64 {
	if m.Victim == 0 {
		return 0
	}
	return float64(m.CCF) / float64(m.Victim)
}

type runner struct {
	trials int
	window time.Duration
	logf   func(format string, args ...any)
}

// small runs the 3-worker fleet: steady state, flips, then failover trials.
func (r *runner) small(ctx context.Context, f *benchFleet, res *ModeResult) error {
	start := time.Now()
	if err := f.waitSettled(ctx, 3*time.Minute); err != nil {
		return fmt.Errorf("start-up: %w", err)
	}
	r.logf("%s: %d connections streaming after %s, owned %v", res.Mode, len(f.ids), time.Since(start).Round(time.Millisecond), f.distribution(ctx))

	// Steady state: let start-up writes pass a full renew cycle first.
	time.Sleep(25 * time.Second)
	st, err := r.steady(ctx, f)
	if err != nil {
		return err
	}
	res.Steady = st
	r.logf("%s: steady: %.1f WCU/conn-h, %.0f RCU/h (sweep %.0f), %d stream invocations", res.Mode,
		st.WCUPerConnHour(), st.RCUPerHour(), st.SweepRCUPerHour(), st.StreamInvocations)

	for i := range r.trials {
		id := f.ids[(i*7)%len(f.ids)]
		stop, start, err := r.flip(ctx, f, id)
		if err != nil {
			res.Problems = append(res.Problems, fmt.Sprintf("flip %d (%s): %v", i, id, err))
			r.logf("%s: flip %d: %v", res.Mode, i, err)
			continue
		}
		res.Stopped, res.Started = append(res.Stopped, ms1(stop)), append(res.Started, ms1(start))
		r.logf("%s: flip %d: STOPPED %s, STARTED %s", res.Mode, i, stop.Round(time.Millisecond), start.Round(time.Millisecond))
	}

	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		for i := range r.trials {
			gap, n, err := r.failover(ctx, f, sig, 2*time.Minute)
			if err != nil {
				res.Problems = append(res.Problems, fmt.Sprintf("%s trial %d: %v", sigName(sig), i, err))
				r.logf("%s: %s trial %d: %v", res.Mode, sigName(sig), i, err)
				continue
			}
			if sig == syscall.SIGTERM {
				res.Sigterm = append(res.Sigterm, ms1(gap))
			} else {
				res.Sigkill = append(res.Sigkill, ms1(gap))
			}
			res.Victims = append(res.Victims, n)
			r.logf("%s: %s trial %d: %d connections streaming elsewhere after %s", res.Mode, sigName(sig), i, n, gap.Round(time.Millisecond))
		}
	}
	for i := range r.trials {
		gap, n, err := r.failover(ctx, f, syscall.SIGSTOP, 2*time.Minute)
		if err != nil {
			res.Problems = append(res.Problems, fmt.Sprintf("SIGSTOP trial %d: %v", i, err))
			r.logf("%s: SIGSTOP trial %d: %v", res.Mode, i, err)
			continue
		}
		res.Sigstop, res.StopVictims = append(res.Sigstop, ms1(gap)), append(res.StopVictims, n)
		r.logf("%s: SIGSTOP trial %d: %d connections streaming elsewhere after %s", res.Mode, i, n, gap.Round(time.Millisecond))
	}
	return nil
}

func (r *runner) steady(ctx context.Context, f *benchFleet) (*Steady, error) {
	w0, r0 := f.usage()
	inv0, sw0 := f.invokes("stream"), f.invokes("sweep")
	t0 := time.Now()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(r.window):
	}
	w1, r1 := f.usage()
	dw, dr := w1.Sub(w0), r1.Sub(r0)
	st := &Steady{
		WindowSec: time.Since(t0).Seconds(), Conns: len(f.ids),
		WorkerWriteUnits: dw.WriteUnits, WorkerReadUnits: dw.ReadUnits,
		ReconWriteUnits: dr.WriteUnits, ReconReadUnits: dr.ReadUnits,
		StreamInvocations: f.invokes("stream") - inv0, SweepRuns: f.invokes("sweep") - sw0,
		Calls: dw.Calls,
	}
	if f.spec.Mode == schema.ModeStream {
		st.SweepPeriodSec = sweepPeriod.Seconds()
	}
	for op, n := range dr.Calls {
		st.Calls["reconciler "+op] = n
	}
	return st, nil
}

// flip stops id, timing the write to the upstream client's departure, waits for the
// release, then starts it, timing the write to a new upstream client.
func (r *runner) flip(ctx context.Context, f *benchFleet, id string) (stopped, started time.Duration, err error) {
	if err := f.waitSettled(ctx, 2*time.Minute); err != nil {
		return 0, 0, err
	}
	t0 := time.Now()
	if err := f.setState(ctx, id, schema.Stopped); err != nil {
		return 0, 0, err
	}
	if stopped, err = waitFor(t0, 5*time.Millisecond, time.Minute, "STOPPED closes the socket", func() bool {
		return f.up.Stats(id).Clients == 0
	}); err != nil {
		return 0, 0, err
	}
	if _, err := waitFor(time.Now(), 20*time.Millisecond, time.Minute, "released", func() bool {
		cs, err := f.conns(ctx)
		return err == nil && !cs[id].Owned()
	}); err != nil {
		return 0, 0, err
	}
	time.Sleep(500 * time.Millisecond)
	t0 = time.Now()
	if err := f.setState(ctx, id, schema.Started); err != nil {
		return 0, 0, err
	}
	started, err = waitFor(t0, 5*time.Millisecond, time.Minute, "STARTED connects", func() bool {
		return f.up.Stats(id).Clients == 1
	})
	return stopped, started, err
}

// failover waits for a settled fleet, signals the worker owning most, and times the
// signal to every one of its connections streaming elsewhere.
func (r *runner) failover(ctx context.Context, f *benchFleet, sig syscall.Signal, timeout time.Duration) (time.Duration, int, error) {
	if err := f.waitSettled(ctx, 3*time.Minute); err != nil {
		return 0, 0, err
	}
	time.Sleep(time.Second)
	slot, id, victims, err := f.biggestOwner(ctx)
	if err != nil {
		return 0, 0, err
	}
	t0 := time.Now()
	if err := f.stack.Sup.Signal(slot, sig); err != nil {
		return 0, 0, err
	}
	gap, err := f.waitGap(ctx, t0, victims, id, 10*time.Millisecond, timeout)
	if sig == syscall.SIGSTOP {
		// Let it go: in stream mode it learns it was declared dead and exits (the
		// supervisor replaces it); in polling mode it finds its leases taken.
		_ = f.stack.Sup.Signal(slot, syscall.SIGCONT)
	}
	return gap, len(victims), err
}

// mass kills the worker holding most of a 1,000-connection fleet.
func (r *runner) mass(ctx context.Context, f *benchFleet, m *Mass) error {
	t0 := time.Now()
	if err := f.waitSettled(ctx, 10*time.Minute); err != nil {
		return fmt.Errorf("start-up: %w", err)
	}
	m.StartupSec = time.Since(t0).Seconds()
	r.logf("%s mass: %d connections streaming after %s", f.spec.Mode, len(f.ids), time.Since(t0).Round(time.Second))
	time.Sleep(15 * time.Second)
	if err := f.waitSettled(ctx, 5*time.Minute); err != nil {
		return err
	}
	m.Before = f.distribution(ctx)
	slot, id, victims, err := f.biggestOwner(ctx)
	if err != nil {
		return err
	}
	m.Victim = len(victims)
	r.logf("%s mass: owned %v; killing %s with %d", f.spec.Mode, m.Before, id, len(victims))
	w0, r0 := f.usage()
	lost0 := f.metric(ctx, "sockfleet_lost_races_total") // the victim's share is subtracted below
	victimLost := f.metricOf(ctx, slot, "sockfleet_lost_races_total")
	start := time.Now()
	if err := f.stack.Sup.Signal(slot, syscall.SIGKILL); err != nil {
		return err
	}
	gap, err := f.waitGap(ctx, start, victims, id, 100*time.Millisecond, 5*time.Minute)
	if err != nil {
		return err
	}
	m.GapMs = ms1(gap)
	// Stragglers: a worker that lost a race may still be finishing its attempts.
	time.Sleep(5 * time.Second)
	w1, r1 := f.usage()
	m.CCF = w1.Sub(w0).ConditionalCheckFailed + r1.Sub(r0).ConditionalCheckFailed
	m.LostRaces = f.metric(ctx, "sockfleet_lost_races_total") - (lost0 - victimLost)
	r.logf("%s mass: %d connections streaming elsewhere after %s; %d conditional-check failures", f.spec.Mode, m.Victim, gap.Round(time.Millisecond), m.CCF)
	return nil
}

func sigName(s syscall.Signal) string {
	switch s {
	case syscall.SIGKILL:
		return "SIGKILL"
	case syscall.SIGSTOP:
		return "SIGSTOP"
	}
	return "SIGTERM"
}

func ms1(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
