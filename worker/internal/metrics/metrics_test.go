package metrics

import (
	"bytes"
	"encoding/json"
	"maps"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func TestEMFLine(t *testing.T) {
	var buf bytes.Buffer
	e := &EMF{W: &buf, Service: "svc", Now: func() time.Time { return time.UnixMilli(1234) }}
	e.Put("OwnedConnections", 7)
	var line map[string]any
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatal(err)
	}
	aws := line["_aws"].(map[string]any)
	cw := aws["CloudWatchMetrics"].([]any)[0].(map[string]any)
	if line["OwnedConnections"] != 7.0 || line["ServiceName"] != "svc" || aws["Timestamp"] != 1234.0 ||
		cw["Namespace"] != "Sockfleet" || cw["Dimensions"].([]any)[0].([]any)[0] != "ServiceName" {
		t.Fatalf("line %s", buf.Bytes())
	}
	var nilEMF *EMF
	nilEMF.Put("x", 1) // no writer configured: a no-op
}

// Every series of /metrics keeps the name and type the docs and the benchmarks read
// (testdata/series.golden, one "name type" line each, in the order of the old
// hand-written text), and the registry's own consistency checks pass.
func TestRegisterPedantic(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	var c Counters
	if err := c.Register(reg); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, mf := range mfs {
		got[mf.GetName()] = strings.ToLower(mf.GetType().String())
		if mf.GetHelp() == "" || len(mf.GetMetric()) != 1 || len(mf.GetMetric()[0].GetLabel()) != 0 {
			t.Errorf("%s: want help text and one series without labels: %v", mf.GetName(), mf)
		}
	}
	golden, err := os.ReadFile("testdata/series.golden")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(golden)), "\n") {
		name, typ, _ := strings.Cut(l, " ")
		want[name] = typ
	}
	if !maps.Equal(got, want) {
		t.Errorf("series differ from testdata/series.golden:\ngot  %v\nwant %v", got, want)
	}
	// The same counters twice in one registry: a clear error, not a panic.
	if err := c.Register(reg); err == nil || !strings.Contains(err.Error(), "register metrics") {
		t.Errorf("second registration: %v", err)
	}
}

// A scrape reads the counters as they are now: values move between scrapes, and
// the sink time is reported in seconds.
func TestRegisterReadsLiveValues(t *testing.T) {
	reg := prometheus.NewRegistry()
	var c Counters
	if err := c.Register(reg); err != nil {
		t.Fatal(err)
	}
	value := func(name string) float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == name {
				m := mf.GetMetric()[0]
				if m.GetGauge() != nil {
					return m.GetGauge().GetValue()
				}
				return m.GetCounter().GetValue()
			}
		}
		t.Fatalf("no series %s", name)
		return 0
	}
	c.Owned.Store(3)
	c.SinkWriteNanos.Add(1_500_000_000)
	if v := value("sockfleet_owned_connections"); v != 3 {
		t.Errorf("owned %v, want 3", v)
	}
	if v := value("sockfleet_sink_write_seconds_total"); v != 1.5 {
		t.Errorf("sink seconds %v, want 1.5", v)
	}
	c.Owned.Add(-1)
	c.Messages.Add(1 << 40)
	if v := value("sockfleet_owned_connections"); v != 2 {
		t.Errorf("owned %v after a release, want 2", v)
	}
	if v := value("sockfleet_messages_total"); v != 1<<40 {
		t.Errorf("messages %v, want %d", v, 1<<40)
	}
}

// Counting on the message path allocates nothing.
func TestCountingAllocatesNothing(t *testing.T) {
	var c Counters
	if n := testing.AllocsPerRun(1000, func() {
		c.Messages.Add(1)
		c.Bytes.Add(100)
		c.SinkQueued.Add(-1)
	}); n != 0 {
		t.Errorf("%v allocations per message", n)
	}
}

// The idle and quota gauges go out on one EMF line, both declared as metrics.
func TestEMFGauges(t *testing.T) {
	var buf bytes.Buffer
	var c Counters
	c.IdleNow.Store(2)
	c.QuotaWaiting.Store(5)
	e := &EMF{W: &buf, Service: "svc"}
	e.PutGauges(&c)
	if n := bytes.Count(buf.Bytes(), []byte("\n")); n != 1 {
		t.Fatalf("%d lines, want 1: %s", n, buf.Bytes())
	}
	var line map[string]any
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatal(err)
	}
	cw := line["_aws"].(map[string]any)["CloudWatchMetrics"].([]any)[0].(map[string]any)
	var declared []string
	for _, m := range cw["Metrics"].([]any) {
		declared = append(declared, m.(map[string]any)["Name"].(string))
	}
	if line["IdleConnections"] != 2.0 || line["QuotaWaiting"] != 5.0 || line["ServiceName"] != "svc" ||
		strings.Join(declared, ",") != "IdleConnections,QuotaWaiting" {
		t.Fatalf("line %s", buf.Bytes())
	}
}

// The worker's EMF line, byte for byte: a dimension set of ServiceName when the
// service is named, none otherwise, every value a Count.
func TestEMFGolden(t *testing.T) {
	at := func() time.Time { return time.UnixMilli(1_764_680_000_000) }
	for _, c := range []struct {
		service, want string
	}{
		{"svc", `{"IdleConnections":2,"QuotaWaiting":5,"ServiceName":"svc","_aws":{"CloudWatchMetrics":[{"Dimensions":[["ServiceName"]],` +
			`"Metrics":[{"Name":"IdleConnections","Unit":"Count"},{"Name":"QuotaWaiting","Unit":"Count"}],"Namespace":"Sockfleet"}],` +
			`"Timestamp":1764680000000}}` + "\n"},
		{"", `{"IdleConnections":2,"QuotaWaiting":5,"_aws":{"CloudWatchMetrics":[{"Dimensions":[[]],` +
			`"Metrics":[{"Name":"IdleConnections","Unit":"Count"},{"Name":"QuotaWaiting","Unit":"Count"}],"Namespace":"Sockfleet"}],` +
			`"Timestamp":1764680000000}}` + "\n"},
	} {
		var buf bytes.Buffer
		e := &EMF{W: &buf, Service: c.service, Now: at}
		e.PutAll(Value{"IdleConnections", 2}, Value{"QuotaWaiting", 5})
		if buf.String() != c.want {
			t.Errorf("service %q:\ngot  %s\nwant %s", c.service, buf.String(), c.want)
		}
	}
}
