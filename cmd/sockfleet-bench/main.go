// Command sockfleet-bench compares the stream-driven design with the seed's polling
// design (issue 7), running both modes one after the other in one process on this
// machine, against the same kind of fleet: real worker processes, the real reconciler
// under the Lambda runtime emulator (stream mode only), the local DynamoDB engine and
// the demo upstream. Each fleet gets a fresh engine. It measures
//
//   - the failover gap after SIGTERM and after SIGKILL of the worker owning most, in a
//     fleet of 3 workers and 30 connections at each mode's production timings;
//   - flip-to-effect latency of STARTED and STOPPED;
//   - the steady-state DynamoDB bill (through metering proxies, index writes
//     included) and the reconciler's stream invocations, over a window;
//   - a mass failover: 5 workers, 1,000 connections, SIGKILL of the worker holding
//     most;
//
// and prints a Markdown report (also written to <out>/report.md), the raw results as
// <out>/results.json, and a PNG of the failover gap distributions. `make bench` runs
// it; it builds the binaries it needs and takes about 15 minutes with the defaults,
// most of it polling mode waiting out 20 s leases.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"image/color"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sockfleet/sockfleet/shared/local/fleet"
	"github.com/sockfleet/sockfleet/shared/schema"
)

func main() {
	trials := flag.Int("trials", 10, "trials per failover signal and per flip, per mode")
	out := flag.String("out", "docs/bench", "folder for report.md, results.json and the PNG")
	quick := flag.Bool("quick", false, "a tiny run, for a smoke test: 2 trials, small fleets, a 20 s window")
	modes := flag.String("modes", "stream,polling", "modes to run, in order")
	window := flag.Duration("window", 120*time.Second, "steady-state measuring window (a multiple of the 60 s sweep period)")
	massConns := flag.Int("mass", 1000, "connections in the mass failover; 0 skips it")
	keep := flag.Bool("keep", false, "keep the fleets' logs and sinks")
	restart := flag.Duration("restart-delay", 20*time.Second, "how long a replacement for an exited worker takes to start "+
		"(an ECS task takes tens of seconds); survivors must cover the gap")
	rebalanceConns := flag.Int("rebalance", 0, "run only the rebalance scenario (3 → 5 → 3 workers) with this many connections")
	from := flag.String("from", "", "render the report and the plot again from this results.json, without running fleets")
	density := flag.Int("density", 0, "membership (stream mode): 2 workers holding this many connections each, idle then streaming; 0 skips it")
	outage := flag.Duration("outage", 0, "membership (stream mode): cut the table off from the workers and the reconciler this long, "+
		"longer than the 11 s membership lease, then time the recovery; 0 skips it")
	members := flag.String("members", "", "membership (stream mode): fleet sizes whose steady-state stream invocations to count, e.g. 3,10")
	flag.Parse()
	if *from != "" {
		if err := rerender(*from, *out); err != nil {
			fmt.Fprintln(os.Stderr, "sockfleet-bench:", err)
			os.Exit(1)
		}
		return
	}

	if *deployOnly { // handoff.go
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		if err := runDeploy(ctx, *out, *deployConns, *deployRate, *keep); err != nil {
			fmt.Fprintln(os.Stderr, "sockfleet-bench:", err)
			os.Exit(1)
		}
		return
	}
	if *rebalanceConns > 0 {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		if err := rebalanceMain(ctx, *out, *rebalanceConns, *rebalanceConns/2); err != nil {
			fmt.Fprintln(os.Stderr, "sockfleet-bench:", err)
			os.Exit(1)
		}
		return
	}
	o := options{trials: *trials, out: *out, window: *window, smallConns: 30, massConns: *massConns, massCap: 300, keep: *keep, restartDelay: *restart}
	if *quick {
		o.trials, o.window, o.smallConns = 2, 20*time.Second, 9
		if o.massConns > 0 {
			o.massConns, o.massCap = 60, 20
		}
	}
	mo := membershipOptions{density: *density, outage: *outage, trials: o.trials, restart: *restart}
	for _, n := range strings.Split(*members, ",") {
		if n = strings.TrimSpace(n); n == "" {
			continue
		}
		k, err := strconv.Atoi(n)
		if err != nil || k < 1 || k > 50 {
			fmt.Fprintf(os.Stderr, "sockfleet-bench: -members %q: want fleet sizes from 1 to 50\n", n)
			os.Exit(2)
		}
		mo.members = append(mo.members, k)
	}
	if *density < 0 || *density > 500 || *outage < 0 {
		fmt.Fprintln(os.Stderr, "sockfleet-bench: -density wants 0 to 500 connections per worker, -outage a duration of 0 or more")
		os.Exit(2)
	}
	o.membership = mo
	for _, m := range strings.Split(*modes, ",") {
		m = strings.TrimSpace(m)
		if m == "" && mo.any() {
			continue // only the membership scenarios
		}
		if m != schema.ModeStream && m != schema.ModePolling {
			fmt.Fprintf(os.Stderr, "sockfleet-bench: unknown mode %q\n", m)
			os.Exit(2)
		}
		o.modes = append(o.modes, m)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "sockfleet-bench:", err)
		os.Exit(1)
	}
}

type options struct {
	trials             int
	out                string
	window             time.Duration
	modes              []string
	smallConns         int
	massConns, massCap int
	keep               bool
	restartDelay       time.Duration
	membership         membershipOptions
}

var timings = map[string]string{
	schema.ModeStream: "the worker's defaults (membership lease 11 s renewed every 3 s, fence 7 s, skew margin 2 s, " +
		"checkpoints at most every 30 s, backstop read every 60 s); the reconciler " +
		"binary under the Lambda runtime emulator, fed by the local stream poller with the production filters; " +
		"backstop sweep every 60 s",
	schema.ModePolling: "`SOCKFLEET_MODE=polling`, the seed's timings (heartbeat 5 s, lease 20 s, margin 2 s, " +
		"orphan query on the seed's index every 5 s ± 50 %, a desired_state read per connection per tick); no reconciler",
}

func run(ctx context.Context, o options) error {
	logf := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "sockfleet-bench-")
	if err != nil {
		return err
	}
	if o.keep {
		logf("fleet logs and sinks in %s", work)
	} else {
		defer os.RemoveAll(work)
	}
	logf("building the worker and the reconciler")
	bins, err := fleet.Build(filepath.Join(work, "bin"))
	if err != nil {
		return err
	}
	res := &Results{
		Command:   strings.TrimSpace("go run ./cmd/sockfleet-bench " + strings.Join(os.Args[1:], " ")),
		Started:   time.Now().Format("2006-01-02 15:04 MST"),
		Machine:   machine(),
		LoadStart: loadavg(),
		Trials:    o.trials,
		WindowSec: o.window.Seconds(), RestartDelaySec: o.restartDelay.Seconds(),
	}
	r := &runner{trials: o.trials, window: o.window, logf: logf}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	for _, mode := range o.modes {
		if ctx.Err() != nil {
			break
		}
		m := &ModeResult{Mode: mode, Timings: timings[mode], Workers: 3, Conns: o.smallConns, Rate: 5}
		res.Modes = append(res.Modes, m)
		spec := fleetSpec{Mode: mode, Workers: 3, Conns: o.smallConns, Rate: 5, Size: 32, RestartDelay: o.restartDelay}
		logf("%s: starting %d workers, %d connections", mode, spec.Workers, spec.Conns)
		f, err := startFleet(ctx, bins, spec, filepath.Join(work, mode+"-small"), log)
		if err != nil {
			return fmt.Errorf("%s fleet: %w", mode, err)
		}
		err = r.small(ctx, f, m)
		f.Stop()
		if err != nil {
			m.Problems = append(m.Problems, err.Error())
			logf("%s: %v", mode, err)
		}

		if o.massConns == 0 || ctx.Err() != nil {
			continue
		}
		// 1 message per second of 16 bytes: 1,000 streams plus 5 workers fit on 2 cores.
		spec = fleetSpec{Mode: mode, Workers: 5, Conns: o.massConns, MaxConnections: o.massCap, Rate: 1, Size: 16, RestartDelay: o.restartDelay}
		m.Mass = &Mass{Workers: spec.Workers, Conns: spec.Conns, MaxConnections: spec.MaxConnections}
		logf("%s mass: starting %d workers, %d connections, cap %d", mode, spec.Workers, spec.Conns, spec.MaxConnections)
		f, err = startFleet(ctx, bins, spec, filepath.Join(work, mode+"-mass"), log)
		if err != nil {
			return fmt.Errorf("%s mass fleet: %w", mode, err)
		}
		if err := r.mass(ctx, f, m.Mass); err != nil {
			m.Mass.Err = err.Error()
			logf("%s mass: %v", mode, err)
		}
		logf("%s mass: stopping (the workers drain)", mode)
		f.Stop()
	}
	if o.membership.any() && ctx.Err() == nil {
		mo := o.membership
		mo.workDir, mo.bins, mo.logf, mo.log = work, bins, logf, log
		res.Membership = runMembership(ctx, mo, r)
	}
	res.LoadEnd = loadavg()
	if err := write(res, o.out); err != nil {
		return err
	}
	return ctx.Err()
}

// rerender writes the report and the plot again from a results.json of an earlier run.
func rerender(path, out string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var res Results
	if err := json.Unmarshal(raw, &res); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return write(&res, out)
}

// write renders res into out: the plot, results.json, report.md, and the report on
// standard output.
func write(res *Results, out string) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	var series []Series
	colors := map[string]color.RGBA{schema.ModeStream: {31, 119, 180, 255}, schema.ModePolling: {214, 39, 40, 255}}
	conns := 0
	for _, m := range res.Modes {
		conns = m.Conns
		series = append(series,
			Series{Label: m.Mode + ", SIGTERM", Color: colors[m.Mode], Xs: m.Sigterm},
			Series{Label: m.Mode + ", SIGKILL", Color: colors[m.Mode], Dashed: true, Xs: m.Sigkill})
	}
	plot := Plot{
		Title:  fmt.Sprintf("Failover gap, 3 workers, %d connections: stream-driven vs polling", conns),
		XLabel: "signal to all of the victim's connections streaming elsewhere (log scale)",
		YLabel: "fraction of trials at or below",
		Series: series,
	}
	var png bytes.Buffer
	if err := plot.WritePNG(&png); err != nil {
		return err
	}
	res.Plot = filepath.Join(out, "failover-gaps.png")
	if err := os.WriteFile(res.Plot, png.Bytes(), 0o644); err != nil {
		return err
	}
	raw, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, "results.json"), append(raw, '\n'), 0o644); err != nil {
		return err
	}
	var md bytes.Buffer
	WriteReport(&md, res)
	if err := os.WriteFile(filepath.Join(out, "report.md"), md.Bytes(), 0o644); err != nil {
		return err
	}
	_, err = os.Stdout.Write(md.Bytes())
	return err
}

func machine() string {
	arch := runtime.GOARCH
	if out, err := exec.Command("uname", "-m").Output(); err == nil {
		arch = strings.TrimSpace(string(out))
	}
	return fmt.Sprintf("`nproc` = %d, `uname -m` = %s, %s", runtime.NumCPU(), arch, runtime.Version())
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
