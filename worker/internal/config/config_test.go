package config

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/worker/internal/sink"
)

const secret = "0123456789abcdef0123"

func getenv(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestLoadDefaultsAndFallbacks(t *testing.T) {
	c, err := Load(context.Background(), getenv(map[string]string{schema.EnvWakeupSecret: secret}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Lease != 11*time.Second || c.RenewInterval != 3*time.Second || c.RenewDeadline != 7*time.Second ||
		c.CheckpointInterval != 30*time.Second || c.BackstopInterval != time.Minute || c.Sink != "stdout" || c.MaxConnections != 1000 ||
		c.IdleTimeout != 5*time.Minute {
		t.Fatalf("defaults %+v", c)
	}
	if c.AdvertiseAddr != "127.0.0.1:8080" || c.WorkerID == "" || schema.ValidateID(c.WorkerID) != nil {
		t.Fatalf("fallbacks: id %q addr %q", c.WorkerID, c.AdvertiseAddr)
	}
}

func TestLoadECSMetadata(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v4/abc/task" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(`{"TaskARN":"arn:aws:ecs:eu-west-1:123:task/fleet/0f1e2d3c","Containers":[
			{"Networks":[{"NetworkMode":"awsvpc","IPv4Addresses":["10.0.3.7"]}]}]}`))
	}))
	defer srv.Close()
	c, err := Load(context.Background(), getenv(map[string]string{
		schema.EnvWakeupSecret: secret, EnvECSMetadata: srv.URL + "/v4/abc", schema.EnvListenAddr: ":9090",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if c.WorkerID != "0f1e2d3c" || c.AdvertiseAddr != "10.0.3.7:9090" {
		t.Fatalf("id %q addr %q", c.WorkerID, c.AdvertiseAddr)
	}
}

func TestLoadErrorsNameTheVariable(t *testing.T) {
	base := map[string]string{schema.EnvWakeupSecret: secret, schema.EnvWorkerID: "w1"}
	cases := []struct {
		set  map[string]string
		want string
	}{
		{map[string]string{schema.EnvLease: "ten"}, schema.EnvLease},
		{map[string]string{schema.EnvMaxConnections: "-1"}, schema.EnvMaxConnections},
		{map[string]string{schema.EnvMaxConnections: "x"}, schema.EnvMaxConnections},
		{map[string]string{schema.EnvRenewDeadline: "2s"}, schema.EnvRenewDeadline},                   // not > interval 3s
		{map[string]string{schema.EnvLease: "7s"}, schema.EnvLease},                                   // not > deadline 7s
		{map[string]string{schema.EnvSkewMargin: "9s", schema.EnvLease: "11s"}, schema.EnvSkewMargin}, // 11-9 < 3
		{map[string]string{schema.EnvLease: "31s", schema.EnvRenewDeadline: "20s"}, schema.EnvLease},  // over the tombstone lease
		{map[string]string{schema.EnvCheckpointInterval: "0s"}, schema.EnvCheckpointInterval},
		{map[string]string{schema.EnvCheckpointInterval: "often"}, schema.EnvCheckpointInterval},
		{map[string]string{schema.EnvBackstopInterval: "-1s"}, schema.EnvBackstopInterval},
		{map[string]string{schema.EnvWakeupSecret: "short"}, schema.EnvWakeupSecret},
		{map[string]string{schema.EnvSink: "kafka://x"}, schema.EnvSink},
		{map[string]string{schema.EnvSink: "kinesis:"}, schema.EnvSink},
		{map[string]string{schema.EnvSink: "kinesis:has space"}, schema.EnvSink},
		{map[string]string{schema.EnvSink: "kinesis:arn:aws:sqs:us-east-1:123456789012:q"}, schema.EnvSink},
		{map[string]string{schema.EnvResume: "cookie:x"}, schema.EnvResume},
		{map[string]string{schema.EnvSeqPath: "a..b"}, schema.EnvSeqPath},
		{map[string]string{schema.EnvBadMessages: "explode"}, schema.EnvBadMessages},
		{map[string]string{schema.EnvWorkerID: "has#hash"}, schema.EnvWorkerID},
		{map[string]string{schema.EnvAdvertiseAddr: "host:"}, schema.EnvAdvertiseAddr},
		{map[string]string{schema.EnvDrainTimeout: "0s"}, schema.EnvDrainTimeout},
		{map[string]string{schema.EnvMode: "gossip"}, schema.EnvMode},
		{map[string]string{schema.EnvMode: "polling", schema.EnvPollInterval: "0s"}, schema.EnvPollInterval},
		{map[string]string{schema.EnvClockOffset: "3s"}, schema.EnvClockOffset}, // beyond the 2s margin
		{map[string]string{schema.EnvClockOffset: "soon"}, schema.EnvClockOffset},
		{map[string]string{schema.EnvIdleTimeout: "quiet"}, schema.EnvIdleTimeout},
		{map[string]string{schema.EnvIdleTimeout: "500ms"}, schema.EnvIdleTimeout}, // under the 1s minimum
		{map[string]string{schema.EnvIdleTimeout: "-1m"}, schema.EnvIdleTimeout},
	}
	for _, tc := range cases {
		env := map[string]string{}
		for k, v := range base {
			env[k] = v
		}
		for k, v := range tc.set {
			env[k] = v
		}
		_, err := Load(context.Background(), getenv(env))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err %v, want it to name %s", tc.set, err, tc.want)
		}
	}
}

// A Kinesis sink spec is checked at load time, without reaching AWS, and opens a
// Kinesis sink.
func TestKinesisSinkSpec(t *testing.T) {
	for _, spec := range []string{"kinesis:feed-1", "kinesis:arn:aws:kinesis:us-east-1:123456789012:stream/feed-1"} {
		c, err := Load(context.Background(), getenv(map[string]string{schema.EnvWakeupSecret: secret, schema.EnvWorkerID: "w", schema.EnvSink: spec}))
		if err != nil {
			t.Fatalf("%s: %v", spec, err)
		}
		t.Setenv("AWS_REGION", "us-east-1")
		snk, err := c.OpenSink(context.Background(), nil, sink.KinesisOptions{})
		if err != nil {
			t.Fatalf("%s: %v", spec, err)
		}
		if _, ok := snk.(*sink.Kinesis); !ok {
			t.Fatalf("%s opened a %T", spec, snk)
		}
	}
}

func TestBareAdvertiseHostGetsListenPort(t *testing.T) {
	c, err := Load(context.Background(), getenv(map[string]string{
		schema.EnvWakeupSecret: secret, schema.EnvWorkerID: "w", schema.EnvAdvertiseAddr: "10.1.2.3",
	}))
	if err != nil || c.AdvertiseAddr != "10.1.2.3:8080" {
		t.Fatalf("%q %v", c.AdvertiseAddr, err)
	}
}

func TestPollingModeTakesTheSeedsTimings(t *testing.T) {
	c, err := Load(context.Background(), getenv(map[string]string{schema.EnvWakeupSecret: secret, schema.EnvMode: "polling"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Mode != schema.ModePolling || c.Lease != 20*time.Second || c.RenewInterval != 5*time.Second || c.PollInterval != 5*time.Second {
		t.Fatalf("polling defaults %+v", c)
	}
}

// A write checked just before the fence must land before another worker may
// acquire: the sink timeout fits in the lease less the skew margin less the fence.
func TestSinkTimeoutFitsInsideFenceMargin(t *testing.T) {
	c := Defaults() // fence 7 s, lease 11 s, skew 2 s: a 2 s window
	if got := c.EffectiveSinkTimeout(); got != 2*time.Second {
		t.Errorf("default sink timeout %s, want the 2s window", got)
	}
	p := PollingDefaults(Defaults()) // fence 15 s, lease 20 s, skew 2 s: 3 s
	if got := p.EffectiveSinkTimeout(); got != 3*time.Second {
		t.Errorf("polling sink timeout %s, want 3s", got)
	}
	for _, tc := range []struct {
		timeout time.Duration
		ok      bool
	}{{0, true}, {2 * time.Second, true}, {2*time.Second + 1, false}, {-1, false}} {
		c := Defaults()
		c.WorkerID, c.AdvertiseAddr, c.WakeupSecret = "w1", "127.0.0.1:1", []byte(strings.Repeat("k", 32))
		c.SinkTimeout = tc.timeout
		err := c.Validate()
		if (err == nil) != tc.ok || (err != nil && !strings.Contains(err.Error(), "SOCKFLEET_SINK_TIMEOUT")) {
			t.Errorf("sink timeout %s: %v", tc.timeout, err)
		}
	}
}

// TestWorkerEnvVarsListsEveryVariableRead keeps schema.WorkerEnvVars, by which the
// local fleet refuses misspelt worker settings, in step with what Load reads.
func TestWorkerEnvVarsListsEveryVariableRead(t *testing.T) {
	known := map[string]bool{}
	for _, v := range schema.WorkerEnvVars {
		known[v] = true
	}
	read := map[string]bool{}
	env := map[string]string{schema.EnvWakeupSecret: secret}
	if _, err := Load(context.Background(), func(k string) string { read[k] = true; return env[k] }); err != nil {
		t.Fatal(err)
	}
	for k := range read {
		if strings.HasPrefix(k, "SOCKFLEET_") && !known[k] {
			t.Errorf("Load reads %s, which schema.WorkerEnvVars does not list", k)
		}
	}
	if len(read) < 10 {
		t.Fatalf("Load read only %v; the recording getenv is not in use", read)
	}
}

// SOCKFLEET_IDLE_TIMEOUT sets the fleet's idle_timeout; 0 turns it off.
func TestIdleTimeoutFleetDefault(t *testing.T) {
	for v, want := range map[string]time.Duration{"90s": 90 * time.Second, "0": 0, "0s": 0} {
		c, err := Load(context.Background(), getenv(map[string]string{schema.EnvWakeupSecret: secret, schema.EnvIdleTimeout: v}))
		if err != nil || c.IdleTimeout != want {
			t.Errorf("%s=%s: %s, %v; want %s", schema.EnvIdleTimeout, v, c.IdleTimeout, err, want)
		}
	}
}
