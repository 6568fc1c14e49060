package main

// The rolling-deploy scenario (issue 13, docs/HANDOFF.md): a stream-mode fleet of 5
// workers holding many connections, every worker replaced one at a time with
// SIGTERM, once with planned handoffs (the default) and once with
// SOCKFLEET_HANDOFF=off (release-then-acquire), in the same run. Every worker's sink
// is a collector that stamps each message's arrival, so the per-connection gap of
// each move is measured at the sink: the stall between the old owner's last message
// and the new owner's first, their arrival spacing less their production spacing
// (the time a consumer waited beyond the upstream's own pace).

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/gorilla/websocket"
	"github.com/sockfleet/sockfleet/shared/local/fleet"
	"github.com/sockfleet/sockfleet/shared/schema"
)

var (
	deployOnly  = flag.Bool("deploy", false, "run only the rolling-deploy scenario (handoff against release-then-acquire) and print its figures")
	deployConns = flag.Int("deploy-conns", 1000, "connections in the rolling-deploy scenario")
	deployRate  = flag.Float64("deploy-rate", 1, "upstream messages per second per connection in the rolling-deploy scenario")
	deployRTT   = flag.Duration("deploy-rtt", 0, "in the rolling-deploy scenario, put the upstream this round trip away "+
		"(a TCP proxy that delays connects and bytes); 0: on loopback")
)

// DeployResult is one path of the rolling deploy.
type DeployResult struct {
	Path       string    `json:"path"` // handoff or release
	Workers    int       `json:"workers"`
	Conns      int       `json:"conns"`
	Moves      int       `json:"moves"`
	Missing    int64     `json:"missing"`
	Duplicates int64     `json:"duplicates"`
	Serial     int       `json:"serial_conns"` // connections whose arrivals were exactly 1, 2, 3, …
	Rate       float64   `json:"rate"`
	BaseMs     float64   `json:"base_delay_ms"` // median arrival minus production time
	GapMs      []float64 `json:"gap_ms"`        // per move: the stall between the two owners' messages
	DrainMs    []float64 `json:"drain_ms"`
	// DialMs: WebSocket dials to the same upstream from this process while the fleet
	// runs (TCP connect and handshake, then a close), before the drains; DrainDialMs:
	// the same dials made during the drains, at the load the moves themselves see.
	// "One dial time" on this machine.
	DialMs      []float64 `json:"dial_ms"`
	DrainDialMs []float64 `json:"drain_dial_ms"`
	OverlapMs   float64   `json:"longest_two_sockets_ms"`
	Err         string    `json:"error,omitempty"`
}

func runDeploy(ctx context.Context, out string, conns int, rate float64, keep bool) error {
	work, err := os.MkdirTemp("", "sockfleet-deploy-")
	if err != nil {
		return err
	}
	if keep {
		defer deployLogf("fleet logs and sinks in %s", work)
	} else {
		defer os.RemoveAll(work)
	}
	deployLogf("building the worker and the reconciler")
	bins, err := fleet.Build(filepath.Join(work, "bin"))
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	where := "on loopback"
	if *deployRTT > 0 {
		where = fmt.Sprintf("%s round trip away (delayLink)", *deployRTT)
	}
	fmt.Printf("rolling deploy, %s, upstream %s, load at start %s\n", machine(), where, loadavg())
	for _, path := range []string{"handoff", "release"} {
		r := deploy(ctx, bins, filepath.Join(work, path), path, conns, rate, log)
		printDeploy(r)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	fmt.Printf("load at end %s\n", loadavg())
	return nil
}

func deployLogf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

func deploy(ctx context.Context, bins fleet.Binaries, dir, path string, conns int, rate float64, log *slog.Logger) *DeployResult {
	res := &DeployResult{Path: path, Workers: 5, Conns: conns, Rate: rate}
	col, err := fleet.NewCollector()
	if err != nil {
		res.Err = err.Error()
		return res
	}
	defer col.Close()
	spec := fleetSpec{Mode: schema.ModeStream, Workers: 5, Conns: conns, MaxConnections: conns, Rate: rate, Size: 16,
		RestartDelay: 2 * time.Second, UpstreamRTT: *deployRTT, Env: func(id string) []string {
			env := []string{schema.EnvSink + "=" + col.URL(id)}
			if path == "release" {
				env = append(env, schema.EnvHandoff+"=off")
			}
			return env
		}}
	deployLogf("%s: starting %d workers, %d connections", path, spec.Workers, spec.Conns)
	f, err := startFleet(ctx, bins, spec, dir, log)
	if err != nil {
		res.Err = err.Error()
		return res
	}
	defer f.Stop()
	if err := f.waitSettled(ctx, 5*time.Minute); err != nil {
		res.Err = err.Error()
		return res
	}
	time.Sleep(3 * time.Second)
	res.DialMs = measureDials(ctx, f.upstreamURL, 200, 0)
	dctx, stopDials := context.WithCancel(ctx)
	dialed := make(chan []float64, 1)
	go func() { dialed <- measureDials(dctx, f.upstreamURL, -1, 20*time.Millisecond) }()
	endDials := sync.OnceFunc(func() { stopDials(); res.DrainDialMs = <-dialed })
	defer endDials()
	for slot := range spec.Workers {
		p := f.stack.Sup.Get(slot)
		start := time.Now()
		if err := f.stack.Sup.Signal(slot, syscall.SIGTERM); err != nil {
			res.Err = err.Error()
			return res
		}
		<-p.Done()
		res.DrainMs = append(res.DrainMs, ms1(time.Since(start)))
		deployLogf("%s: %s drained in %s", path, p.ID, time.Since(start).Round(time.Millisecond))
		if err := f.waitSettled(ctx, 2*time.Minute); err != nil {
			res.Err = err.Error()
			return res
		}
		time.Sleep(2 * time.Second) // the replacement registers before the next drain
	}
	endDials()
	time.Sleep(3 * time.Second) // let the sinks catch up
	var delays []float64
	for _, id := range f.ids {
		arr := col.Arrivals(id)
		if len(arr) == 0 {
			res.Missing++
			continue
		}
		seen := map[int64]bool{}
		lo, hi := arr[0].Seq, arr[0].Seq
		for _, a := range arr {
			if seen[a.Seq] {
				res.Duplicates++
			}
			seen[a.Seq] = true
			lo, hi = min(lo, a.Seq), max(hi, a.Seq)
			delays = append(delays, float64(a.At.UnixMilli()-a.TS))
		}
		res.Missing += hi - lo + 1 - int64(len(seen))
		if _, err := fleet.CheckSerial(arr); err == nil {
			res.Serial++
		}
		for i := 1; i < len(arr); i++ {
			if arr[i].Worker != arr[i-1].Worker {
				res.Moves++
				stall := arr[i].At.Sub(arr[i-1].At) - time.Duration(arr[i].TS-arr[i-1].TS)*time.Millisecond
				res.GapMs = append(res.GapMs, max(0, ms1(stall)))
			}
		}
	}
	slices.Sort(delays)
	if len(delays) > 0 {
		res.BaseMs = delays[len(delays)/2]
	}
	slices.Sort(res.GapMs)
	for _, o := range fleet.Overlaps(f.up.Events()) {
		res.OverlapMs = max(res.OverlapMs, ms1(o.Longest))
	}
	return res
}

// measureDials dials n probe streams of the upstream one after the other (n < 0:
// until ctx ends), every pause, and returns each dial's time (connect and
// handshake), sorted.
func measureDials(ctx context.Context, url func(id string) string, n int, pause time.Duration) []float64 {
	var out []float64
	for i := 0; n < 0 || i < n; i++ {
		if pause > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(pause):
			}
		}
		if ctx.Err() != nil {
			break
		}
		start := time.Now()
		c, _, err := websocket.DefaultDialer.DialContext(ctx, url(fmt.Sprintf("dial-probe-%d", i)), nil)
		if err != nil {
			continue
		}
		out = append(out, ms1(time.Since(start)))
		c.Close()
	}
	slices.Sort(out)
	return out
}

func printDeploy(r *DeployResult) {
	if r.Err != "" {
		fmt.Printf("%s: error: %s\n", r.Path, r.Err)
	}
	q := func(p float64) float64 { return quantile(r.GapMs, p) }
	fmt.Printf("%s: %d workers, %d connections, %d moves; missing %d, duplicates %d, serial %d/%d; "+
		"%.0f msg/s each, usual delay %.0f ms; stall at a move p50 %.1f ms, p99 %.1f ms, max %.1f ms; drains %.0f ms; longest two sockets %.0f ms\n",
		r.Path, r.Workers, r.Conns, r.Moves, r.Missing, r.Duplicates, r.Serial, r.Conns, r.Rate, r.BaseMs,
		q(0.5), q(0.99), q(1), r.DrainMs, r.OverlapMs)
	if len(r.DialMs) > 0 {
		fmt.Printf("%s: one dial to the upstream, %d dials while the fleet ran, before the drains: p50 %.1f ms, p99 %.1f ms\n",
			r.Path, len(r.DialMs), quantile(r.DialMs, 0.5), quantile(r.DialMs, 0.99))
	}
	if len(r.DrainDialMs) > 0 {
		fmt.Printf("%s: one dial to the upstream, %d dials during the drains: p50 %.1f ms, p99 %.1f ms, max %.1f ms\n",
			r.Path, len(r.DrainDialMs), quantile(r.DrainDialMs, 0.5), quantile(r.DrainDialMs, 0.99), quantile(r.DrainDialMs, 1))
	}
}

// quantile of sorted xs (0 if empty).
func quantile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	return xs[min(len(xs)-1, int(p*float64(len(xs))))]
}
