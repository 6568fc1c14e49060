package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestFormulaWCU(t *testing.T) {
	for _, c := range []struct {
		perWorker int
		streaming bool
		want      float64
	}{
		{1, false, 1200}, {1, true, 1320}, {250, false, 4.8}, {250, true, 124.8}, {500, false, 2.4}, {500, true, 122.4},
	} {
		if got := FormulaWCU(c.perWorker, c.streaming); got < c.want-1e-9 || got > c.want+1e-9 {
			t.Errorf("FormulaWCU(%d, %v) = %v, want %v", c.perWorker, c.streaming, got, c.want)
		}
	}
}

func TestMembershipReport(t *testing.T) {
	res := &Results{Trials: 1, Membership: &MembershipResult{
		Density: []*Density{
			{Phase: "idle", Workers: 2, PerWorker: 250, Steady: &Steady{WindowSec: 120, Conns: 500, WorkerWriteUnits: 80,
				Calls: map[string]int{"UpdateItem": 80}}},
			{Phase: "streaming", Workers: 2, PerWorker: 250, Rate: 1, Err: "start-up: not within 10m0s"},
		},
		Outage:  &Outage{Workers: 3, Conns: 30, DownSec: 20, Trials: []OutageTrial{{RecoverMs: 900}, {RecoverMs: 21000, Replaced: 2}}},
		Members: []*Members{{Workers: 10, Steady: &Steady{WindowSec: 120, StreamInvocations: 300}}},
	}}
	var b bytes.Buffer
	WriteReport(&b, res)
	out := b.String()
	for _, want := range []string{
		"| idle | 250 | 0 | 120 s | 80 | 0 | 4.8 | ≤ 5 | 4.8 |",
		"| streaming | 250 | 1 | – | – | – | – | ≤ 130 | 124.8 | – | – | failed: start-up: not within 10m0s |",
		"| 1 | 1,200 | 1,320 |",
		"| 500 | 2.4 | 122.4 |",
		"| 0 | 0 | 900 ms | 0 | pass |",
		"| 1 | 0 | 21.0 s | 2 | **miss** |",
		"| 10 | 120 s | 300 | 9,000 | 900 |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}
