package server

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/sockfleet/sockfleet/shared/wakeup"
	"github.com/sockfleet/sockfleet/worker/internal/metrics"
)

// GET /metrics over a real listener parses with the Prometheus text parser, and its
// values move with what the worker does: a wakeup, a refused one, messages counted.
func TestMetricsScrape(t *testing.T) {
	m := new(metrics.Counters)
	ts := httptest.NewServer((&Server{Secret: secret, Owner: &fakeOwner{}, Metrics: m}).Handler())
	defer ts.Close()
	scrape := func() map[string]float64 {
		t.Helper()
		resp, err := http.Get(ts.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
			t.Fatalf("status %d, content type %q", resp.StatusCode, ct)
		}
		p := expfmt.NewTextParser(model.LegacyValidation)
		mfs, err := p.TextToMetricFamilies(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]float64{}
		for name, mf := range mfs {
			for _, s := range mf.GetMetric() {
				switch {
				case s.Counter != nil:
					out[name] += s.GetCounter().GetValue()
				case s.Gauge != nil:
					out[name] += s.GetGauge().GetValue()
				case s.Untyped != nil:
					t.Errorf("%s: untyped", name)
				}
			}
		}
		return out
	}
	before := scrape()
	for _, name := range []string{"sockfleet_wakeups_total", "sockfleet_wakeups_refused_total", "sockfleet_messages_total", "sockfleet_owned_connections", "go_goroutines", "process_resident_memory_bytes"} {
		if _, ok := before[name]; !ok {
			t.Errorf("no %s in the scrape", name)
		}
	}

	post := func(sign bool) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, ts.URL+wakeup.Path, strings.NewReader(good))
		if sign {
			at := wakeup.Timestamp(time.Now())
			req.Header.Set(wakeup.HeaderTimestamp, at)
			req.Header.Set(wakeup.HeaderSignature, wakeup.Sign(secret, at, []byte(good)))
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	post(true)
	post(false)
	m.Messages.Add(1_000_000)
	m.Owned.Add(2)
	after := scrape()
	for name, want := range map[string]float64{
		"sockfleet_wakeups_total":         1,
		"sockfleet_wakeups_refused_total": 1,
		"sockfleet_messages_total":        1_000_000,
		"sockfleet_owned_connections":     2,
	} {
		if got := after[name] - before[name]; got != want {
			t.Errorf("%s moved by %v, want %v", name, got, want)
		}
	}
}
