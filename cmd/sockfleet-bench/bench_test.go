package main

import (
	"bytes"
	"image/color"
	"image/png"
	"math"
	"strings"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	ten := []float64{10, 9, 8, 7, 6, 5, 4, 3, 2, 1}
	for _, tc := range []struct {
		name string
		xs   []float64
		p    float64
		want float64
	}{
		{"p50 of 10 is the 5th", ten, 50, 5},
		{"p99 of 10 is the largest", ten, 99, 10},
		{"p90 of 10 is the 9th", ten, 90, 9},
		{"p100 is the largest", ten, 100, 10},
		{"one sample", []float64{42}, 50, 42},
		{"p99 of 200 is the 198th", seq(200), 99, 198},
		{"tiny p is the smallest", ten, 0.1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Percentile(tc.xs, tc.p); got != tc.want {
				t.Errorf("Percentile(%v, %v) = %v, want %v", tc.xs, tc.p, got, tc.want)
			}
		})
	}
	if !math.IsNaN(Percentile(nil, 50)) {
		t.Error("no samples: want NaN")
	}
	xs := []float64{3, 1, 2}
	Percentile(xs, 50)
	if xs[0] != 3 {
		t.Error("Percentile sorted its argument in place")
	}
}

func seq(n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = float64(n - i)
	}
	return out
}

func TestPerHour(t *testing.T) {
	for _, tc := range []struct {
		name  string
		got   float64
		want  float64
		exact bool
	}{
		{"120 s window, 30 connections, 180 WCU", PerConnHour(180, 30, 2*time.Minute), 180, true},
		{"a 5 s heartbeat on one connection over a minute", PerConnHour(12, 1, time.Minute), 720, true},
		{"fleet reads over 90 s", PerHour(50, 90*time.Second), 2000, false},
		{"zero window", PerHour(1, 0), math.NaN(), false},
		{"no connections", PerConnHour(1, 0, time.Minute), math.NaN(), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if math.IsNaN(tc.want) {
				if !math.IsNaN(tc.got) {
					t.Errorf("got %v, want NaN", tc.got)
				}
				return
			}
			if math.Abs(tc.got-tc.want) > 1e-9 {
				t.Errorf("got %v, want %v", tc.got, tc.want)
			}
		})
	}
	if r := Ratio(1, 10); r != 0.1 {
		t.Errorf("Ratio(1, 10) = %v", r)
	}
	if r := Ratio(0, 0); r != 1 {
		t.Errorf("Ratio(0, 0) = %v, want 1", r)
	}
	if r := Ratio(1, 0); !math.IsNaN(r) {
		t.Errorf("Ratio(1, 0) = %v, want NaN", r)
	}
}

func TestSteadyFigures(t *testing.T) {
	s := &Steady{WindowSec: 120, Conns: 30, WorkerWriteUnits: 170, ReconWriteUnits: 10,
		WorkerReadUnits: 4, ReconReadUnits: 6, StreamInvocations: 0}
	if got := s.WCUPerConnHour(); math.Abs(got-180) > 1e-9 {
		t.Errorf("WCU per connection-hour = %v, want 180", got)
	}
	if got := s.RCUPerHour(); math.Abs(got-300) > 1e-9 {
		t.Errorf("RCU per hour = %v, want 300", got)
	}
	if got := s.SweepRCUPerHour(); math.Abs(got-180) > 1e-9 {
		t.Errorf("sweep RCU per hour = %v, want 180", got)
	}
	if got := s.InvocationsPerConnHour(); got != 0 {
		t.Errorf("invocations = %v, want 0", got)
	}
	m := &Mass{Victim: 200, CCF: 5}
	if got := m.CCFPerConn(); got != 0.025 {
		t.Errorf("CCF per connection = %v, want 0.025", got)
	}
}

func TestPlotRenders(t *testing.T) {
	p := Plot{
		Title: "t", XLabel: "x", YLabel: "y",
		Series: []Series{
			{Label: "stream, SIGTERM", Color: color.RGBA{0, 0, 255, 255}, Xs: []float64{40, 55, 61}},
			{Label: "polling, SIGKILL", Color: color.RGBA{255, 0, 0, 255}, Dashed: true, Xs: []float64{21000, 26000}},
			{Label: "empty", Color: color.RGBA{0, 255, 0, 255}},
		},
	}
	var buf bytes.Buffer
	if err := p.WritePNG(&buf); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != 1120 || b.Dy() != 560 {
		t.Errorf("size %v", b)
	}
	// Both series' colours must appear.
	var blue, red bool
	for y := 0; y < img.Bounds().Dy(); y++ {
		for x := 0; x < img.Bounds().Dx(); x++ {
			r, g, b, _ := img.At(x, y).RGBA()
			blue = blue || (b>>8 == 255 && r == 0 && g == 0)
			red = red || (r>>8 == 255 && g == 0 && b == 0)
		}
	}
	if !blue || !red {
		t.Errorf("series missing from the plot: blue %v, red %v", blue, red)
	}
	// No samples at all still renders.
	if err := (Plot{}).WritePNG(&bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
}

func TestReport(t *testing.T) {
	res := &Results{Command: "go run ./cmd/sockfleet-bench", Trials: 2, WindowSec: 120, Modes: []*ModeResult{
		{Mode: "stream", Workers: 3, Sigterm: []float64{50, 60}, Sigkill: []float64{80, 90}, Victims: []int{10, 11, 12, 13},
			Sigstop: []float64{12000, 14000}, StopVictims: []int{10, 11},
			Started: []float64{30, 40}, Stopped: []float64{20, 25},
			Steady: &Steady{WindowSec: 120, Conns: 30, WorkerWriteUnits: 180, ReconReadUnits: 2, StreamInvocations: 100},
			Mass:   &Mass{Workers: 5, Conns: 1000, Victim: 200, CCF: 1, GapMs: 900}},
		{Mode: "polling", Sigterm: []float64{5000, 6000}, Sigkill: []float64{21000, 25000}, Victims: []int{10, 11, 12, 13},
			Started: []float64{3000, 4000}, Stopped: []float64{2000, 4000},
			Steady: &Steady{WindowSec: 120, Conns: 30, WorkerWriteUnits: 2160, WorkerReadUnits: 700},
			Mass:   &Mass{Workers: 5, Conns: 1000, Victim: 300, CCF: 1200, GapMs: 27000}},
	}}
	var b bytes.Buffer
	WriteReport(&b, res)
	out := b.String()
	for _, want := range []string{
		"| stream | SIGTERM | 2 | 50 ms | 60 ms | 60 ms | 10–11 |",
		"| polling | SIGKILL | 2 | 21.0 s | 25.0 s | 25.0 s | 12–13 |",
		"| WCU per connection-hour | 180 | 2,160 | 0.083 |",
		"| mass failover: conditional-check failures per reassigned connection | at most 0.05 | 0.0050 (polling: 4.000) | pass |",
		"| Lambda invocations per hour, steady state (issue 12) | stated, O(workers) | 3,000 per hour with 3 workers (1,000 per worker-hour; heartbeats every 3 s are 1,200) | pass |",
		"| hung worker (SIGSTOP) to all its connections streaming elsewhere (issue 12) | p99 at most 15 s | p50 12.0 s, p99 14.0 s (membership lease 11 s, margin 2 s) | pass |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}
