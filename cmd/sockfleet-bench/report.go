package main

import (
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"time"
)

// Results is one run of the benchmark: what the report and the JSON file hold.
type Results struct {
	Command   string  `json:"command"`
	Started   string  `json:"started"`
	Machine   string  `json:"machine"`
	LoadStart string  `json:"loadavg_start"`
	LoadEnd   string  `json:"loadavg_end"`
	Trials    int     `json:"trials"`
	WindowSec float64 `json:"steady_window_s"`
	// RestartDelaySec is how long the supervisor took to replace an exited worker.
	RestartDelaySec float64       `json:"restart_delay_s"`
	Plot            string        `json:"plot"`
	Modes           []*ModeResult `json:"modes"`
	// Membership is the issue-12 scenarios (membership.go), when asked for.
	Membership *MembershipResult `json:"membership,omitempty"`
}

func (r *Results) mode(name string) *ModeResult {
	for _, m := range r.Modes {
		if m.Mode == name {
			return m
		}
	}
	return nil
}

func fmtMs(x float64) string {
	switch {
	case math.IsNaN(x):
		return "–"
	case x >= 10000:
		return fmt.Sprintf("%.1f s", x/1000)
	case x >= 1000:
		return fmt.Sprintf("%.2f s", x/1000)
	default:
		return fmt.Sprintf("%.0f ms", x)
	}
}

func fmtNum(x float64) string {
	switch {
	case math.IsNaN(x):
		return "–"
	case x == 0:
		return "0"
	case math.Abs(x) >= 100:
		return commas(int64(math.Round(x)))
	case math.Abs(x) >= 1:
		return fmt.Sprintf("%.1f", x)
	default:
		return fmt.Sprintf("%.3f", x)
	}
}

func commas(n int64) string {
	s := fmt.Sprint(n)
	if n < 0 {
		return "-" + commas(-n)
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

func fmtRatio(x float64) string {
	switch {
	case math.IsNaN(x):
		return "–"
	case x == 0:
		return "0"
	case x < 0.01:
		return fmt.Sprintf("%.4f", x)
	default:
		return fmt.Sprintf("%.3f", x)
	}
}

// WriteReport renders r as Markdown.
func WriteReport(w io.Writer, r *Results) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	p("# sockfleet-bench: stream-driven vs polling")
	p("")
	p("Command: `%s`  ", r.Command)
	p("Started: %s  ", r.Started)
	p("Machine: %s  ", r.Machine)
	p("Load average (1, 5, 15 min) at start: %s; at end: %s", r.LoadStart, r.LoadEnd)
	p("")
	for _, m := range r.Modes {
		p("- **%s**: %s", m.Mode, m.Timings)
	}
	p("")

	p("## Failover gap (%d trials per signal; p99 is nearest-rank, so the largest of up to 100 trials)", r.Trials)
	p("")
	p("From the signal to every connection the victim owned streaming elsewhere: exactly one upstream client and a live owner other than the victim. The victim is the worker owning most; the supervisor replaces it after %s, as an ECS service starts a new task, so the survivors must cover the gap; the next trial waits for 3 workers and every connection streaming.", time.Duration(r.RestartDelaySec*float64(time.Second)))
	p("")
	p("| mode | signal | trials | p50 | p99 | max | victim's connections (min–max) |")
	p("|---|---|---:|---:|---:|---:|---|")
	for _, m := range r.Modes {
		nt := len(m.Sigterm)
		for _, row := range []struct {
			sig string
			xs  []float64
			vs  []int
		}{{"SIGTERM", m.Sigterm, m.Victims[:min(nt, len(m.Victims))]}, {"SIGKILL", m.Sigkill, m.Victims[min(nt, len(m.Victims)):]}} {
			p("| %s | %s | %d | %s | %s | %s | %s |", m.Mode, row.sig, len(row.xs),
				fmtMs(Percentile(row.xs, 50)), fmtMs(Percentile(row.xs, 99)), fmtMs(Percentile(row.xs, 100)), span(row.vs))
		}
	}
	p("")

	p("## Flip-to-effect latency (%d trials each)", r.Trials)
	p("")
	p("STARTED: the `desired_state` write to the upstream accepting a client. STOPPED: the write to the upstream losing its client. Both clocks start before the write is sent.")
	p("")
	p("| mode | flip | trials | p50 | p99 | max |")
	p("|---|---|---:|---:|---:|---:|")
	for _, m := range r.Modes {
		for _, row := range []struct {
			name string
			xs   []float64
		}{{"STARTED", m.Started}, {"STOPPED", m.Stopped}} {
			p("| %s | %s | %d | %s | %s | %s |", m.Mode, row.name, len(row.xs),
				fmtMs(Percentile(row.xs, 50)), fmtMs(Percentile(row.xs, 99)), fmtMs(Percentile(row.xs, 100)))
		}
	}
	p("")

	p("## Steady state (measured over %.0f s, extrapolated to one hour)", r.WindowSec)
	p("")
	p("Billed capacity as DynamoDB reports it (`ReturnConsumedCapacity=INDEXES`, index writes included) for every call of the workers and of the reconciler, through metering proxies. Stream mode includes the backstop sweep every %.0f s (the CDK stack's schedule); its reads are shown apart and included in the total.", sweepPeriod.Seconds())
	p("")
	p("| mode | connections | window | WCU per connection-hour | RCU per hour, fleet | of which the sweep | sweep runs in window | stream invocations | invocations per connection-hour |")
	p("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, m := range r.Modes {
		s := m.Steady
		if s == nil {
			p("| %s | – | – | – | – | – | – | – | – |", m.Mode)
			continue
		}
		inv, sweep := fmtNum(s.InvocationsPerConnHour()), fmtNum(s.SweepRCUPerHour())
		if m.Mode == "polling" {
			inv, sweep = "no reconciler", "no sweep"
		}
		p("| %s | %d | %.0f s | %s | %s | %s | %d | %d | %s |", m.Mode, s.Conns, s.WindowSec,
			fmtNum(s.WCUPerConnHour()), fmtNum(s.RCUPerHour()), sweep, s.SweepRuns, s.StreamInvocations, inv)
	}
	p("")
	for _, m := range r.Modes {
		if m.Steady != nil {
			p("Calls in the window, %s: %s  ", m.Mode, calls(m.Steady.Calls))
		}
	}
	p("")

	p("## Mass failover (SIGKILL of the worker holding most; one trial per mode)")
	p("")
	p("Failover time: the kill to every one of the victim's connections streaming elsewhere (checked every 100 ms). Conditional-check failures: the metering proxies' count over the kill to 5 s after that point, over the victim's connection count. Lost races: the survivors' `sockfleet_lost_races_total` over the same span.")
	p("")
	p("| mode | workers | connections | per-worker cap | owned before | victim's connections | last insert to all streaming | failover time | conditional-check failures | per reassigned connection | lost races |")
	p("|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|")
	for _, m := range r.Modes {
		x := m.Mass
		if x == nil {
			continue
		}
		if x.Err != "" {
			p("| %s | %d | %d | %d | %v | %d | %.0f s | failed: %s | | | |", m.Mode, x.Workers, x.Conns, x.MaxConnections, x.Before, x.Victim, x.StartupSec, oneLine(x.Err))
			continue
		}
		p("| %s | %d | %s | %d | %v | %d | %.0f s | %s | %d | %s | %.0f |", m.Mode, x.Workers, commas(int64(x.Conns)), x.MaxConnections, x.Before, x.Victim,
			x.StartupSec, fmtMs(x.GapMs), x.CCF, fmtRatio(x.CCFPerConn()), x.LostRaces)
	}
	p("")

	s, pl := r.mode("stream"), r.mode("polling")
	if s != nil && pl != nil {
		writeRatios(p, s, pl)
	}
	if s != nil {
		writeGoals(p, s, pl)
	}
	for _, m := range r.Modes {
		for _, pr := range m.Problems {
			p("- problem (%s): %s", m.Mode, oneLine(pr))
		}
	}
	if r.Membership != nil {
		writeMembership(p, r.Membership)
	}
	if r.Plot != "" {
		p("")
		p("Plot of the failover gaps: `%s`", r.Plot)
	}
}

func writeRatios(p func(string, ...any), s, pl *ModeResult) {
	p("## Ratios, stream / polling")
	p("")
	p("| figure | stream | polling | stream / polling |")
	p("|---|---:|---:|---:|")
	row := func(name string, a, b float64, f func(float64) string) {
		p("| %s | %s | %s | %s |", name, f(a), f(b), fmtRatio(Ratio(a, b)))
	}
	for _, q := range []float64{50, 99} {
		row(fmt.Sprintf("SIGTERM gap p%.0f", q), Percentile(s.Sigterm, q), Percentile(pl.Sigterm, q), fmtMs)
		row(fmt.Sprintf("SIGKILL gap p%.0f", q), Percentile(s.Sigkill, q), Percentile(pl.Sigkill, q), fmtMs)
		row(fmt.Sprintf("SIGSTOP (hung worker) gap p%.0f", q), Percentile(s.Sigstop, q), Percentile(pl.Sigstop, q), fmtMs)
		row(fmt.Sprintf("STARTED flip p%.0f", q), Percentile(s.Started, q), Percentile(pl.Started, q), fmtMs)
		row(fmt.Sprintf("STOPPED flip p%.0f", q), Percentile(s.Stopped, q), Percentile(pl.Stopped, q), fmtMs)
	}
	if s.Steady != nil && pl.Steady != nil {
		row("WCU per connection-hour", s.Steady.WCUPerConnHour(), pl.Steady.WCUPerConnHour(), fmtNum)
		row("RCU per hour, fleet", s.Steady.RCUPerHour(), pl.Steady.RCUPerHour(), fmtNum)
	}
	if s.Mass != nil && pl.Mass != nil && s.Mass.Err == "" && pl.Mass.Err == "" {
		row("mass failover time", s.Mass.GapMs, pl.Mass.GapMs, fmtMs)
		row("conditional-check failures per reassigned connection", s.Mass.CCFPerConn(), pl.Mass.CCFPerConn(), fmtRatio)
	}
	p("")
}

func writeGoals(p func(string, ...any), s, pl *ModeResult) {
	p("## Goals (issue 7) for the stream-driven mode")
	p("")
	p("| figure | goal | stream-driven | result |")
	p("|---|---|---|---|")
	pass := func(ok bool) string {
		if ok {
			return "pass"
		}
		return "**miss**"
	}
	goal := func(name, g, got string, ok bool) { p("| %s | %s | %s | %s |", name, g, got, pass(ok)) }
	t50, t99 := Percentile(s.Sigterm, 50), Percentile(s.Sigterm, 99)
	goal("failover gap after SIGTERM", "p99 under 1 s", fmt.Sprintf("p50 %s, p99 %s", fmtMs(t50), fmtMs(t99)), t99 < 1000)
	k50, k99 := Percentile(s.Sigkill, 50), Percentile(s.Sigkill, 99)
	goal("failover gap after SIGKILL", "p99 under 2 s, far below lease + poll interval",
		fmt.Sprintf("p50 %s, p99 %s", fmtMs(k50), fmtMs(k99)), k99 < 2000)
	if len(s.Sigstop) > 0 {
		h50, h99 := Percentile(s.Sigstop, 50), Percentile(s.Sigstop, 99)
		goal("hung worker (SIGSTOP) to all its connections streaming elsewhere (issue 12)", "p99 at most 15 s",
			fmt.Sprintf("p50 %s, p99 %s (membership lease 11 s, margin 2 s)", fmtMs(h50), fmtMs(h99)), h99 <= 15000)
	}
	a99, b99 := Percentile(s.Started, 99), Percentile(s.Stopped, 99)
	goal("flip-to-effect, STARTED and STOPPED", "p99 under 1 s", fmt.Sprintf("STARTED p99 %s, STOPPED p99 %s", fmtMs(a99), fmtMs(b99)), a99 < 1000 && b99 < 1000)
	if s.Steady != nil && pl != nil && pl.Steady != nil {
		w := Ratio(s.Steady.WCUPerConnHour(), pl.Steady.WCUPerConnHour())
		goal("WCU per connection-hour, index writes included", "at most 1/10 of polling",
			fmt.Sprintf("%s vs %s: %s", fmtNum(s.Steady.WCUPerConnHour()), fmtNum(pl.Steady.WCUPerConnHour()), fmtRatio(w)), w <= 0.1)
		rr := Ratio(s.Steady.RCUPerHour(), pl.Steady.RCUPerHour())
		goal("RCU per hour, whole fleet, steady state", "at most 1/10 of polling",
			fmt.Sprintf("%s vs %s: %s", fmtNum(s.Steady.RCUPerHour()), fmtNum(pl.Steady.RCUPerHour()), fmtRatio(rr)), rr <= 0.1)
	}
	if s.Steady != nil {
		// Issue 12: membership renewals pass the filter, one record per worker per
		// renew interval, so invocations are O(workers), stated rather than zero.
		perHour := PerHour(float64(s.Steady.StreamInvocations), s.Steady.window())
		perWorker := 0.0
		if s.Workers > 0 {
			perWorker = perHour / float64(s.Workers)
		}
		goal("Lambda invocations per hour, steady state (issue 12)", "stated, O(workers)",
			fmt.Sprintf("%s per hour with %d workers (%s per worker-hour; heartbeats every 3 s are 1,200)",
				fmtNum(perHour), s.Workers, fmtNum(perWorker)), perWorker <= 1200*1.1)
	}
	if s.Mass != nil {
		if s.Mass.Err != "" {
			goal(fmt.Sprintf("mass failover time (%s connections)", commas(int64(s.Mass.Conns))), "measured", "failed: "+oneLine(s.Mass.Err), false)
		} else {
			got := fmt.Sprintf("%s for %d connections", fmtMs(s.Mass.GapMs), s.Mass.Victim)
			if pl != nil && pl.Mass != nil && pl.Mass.Err == "" {
				got += fmt.Sprintf(" (polling: %s for %d)", fmtMs(pl.Mass.GapMs), pl.Mass.Victim)
			}
			p("| mass failover time (%s connections) | measured | %s | measured |", commas(int64(s.Mass.Conns)), got)
			c := s.Mass.CCFPerConn()
			got = fmtRatio(c)
			if pl != nil && pl.Mass != nil && pl.Mass.Err == "" {
				got += fmt.Sprintf(" (polling: %s)", fmtRatio(pl.Mass.CCFPerConn()))
			}
			goal("mass failover: conditional-check failures per reassigned connection", "at most 0.05", got, c <= 0.05)
		}
	}
	p("")
}

func span(vs []int) string {
	if len(vs) == 0 {
		return "–"
	}
	lo, hi := vs[0], vs[0]
	for _, v := range vs {
		lo, hi = min(lo, v), max(hi, v)
	}
	return fmt.Sprintf("%d–%d", lo, hi)
}

func calls(m map[string]int) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if m[k] != 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
		}
	}
	return strings.Join(parts, ", ")
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	s = strings.ReplaceAll(s, "|", "/")
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}
