package fleet_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sockfleet/sockfleet/shared/local/fleet"
	"github.com/sockfleet/sockfleet/shared/schema"
)

// effective is what a process started with env sees for name: os/exec keeps the
// last of duplicate keys.
func effective(env []string, name string) (string, bool) {
	v, found := "", false
	for _, kv := range env {
		if k, val, ok := strings.Cut(kv, "="); ok && k == name {
			v, found = val, true
		}
	}
	return v, found
}

// TestWorkerEnvironPrecedence: explicit worker settings beat the fleet's defaults
// (SOCKFLEET_SEQ_PATH=seq, the sink file), and never beat what the fleet owns.
func TestWorkerEnvironPrecedence(t *testing.T) {
	cfg := fleet.Config{
		Dir: "/d", Endpoint: "http://127.0.0.1:1", Table: "tbl", Secret: "s3cret-s3cret-s3cret",
		WorkerEnv: func(int, string) []string {
			return []string{schema.EnvSeqPath + "=data.seq", schema.EnvWorkerID + "=hijack", "AWS_REGION=eu-west-1"}
		},
	}
	env := cfg.WorkerEnviron(0, "w0-x-1", 8123)
	for name, want := range map[string]string{
		schema.EnvSeqPath:       "data.seq",                   // the user's choice beats the default
		schema.EnvSink:          "file:/d/sinks/w0-x-1.jsonl", // a default left alone
		schema.EnvWorkerID:      "w0-x-1",                     // fleet-owned
		schema.EnvListenAddr:    "127.0.0.1:8123",
		schema.EnvTable:         "tbl",
		"AWS_REGION":            fleet.LocalRegion,
		schema.EnvWakeupSecret:  "s3cret-s3cret-s3cret",
		schema.EnvAdvertiseAddr: "127.0.0.1:8123",
	} {
		if got, _ := effective(env, name); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	cfg.SlotEndpoint = func(slot int) string { return fmt.Sprintf("http://127.0.0.1:%d", 9000+slot) }
	if got, _ := effective(cfg.WorkerEnviron(2, "w2-x-1", 8125), "AWS_ENDPOINT_URL_DYNAMODB"); got != "http://127.0.0.1:9002" {
		t.Errorf("slot 2's endpoint = %q, want its own", got)
	}
	cfg.WorkerEnv = nil
	if got, _ := effective(cfg.WorkerEnviron(0, "w", 1), schema.EnvSeqPath); got != "seq" {
		t.Errorf("default %s = %q, want seq (the demo upstream's field)", schema.EnvSeqPath, got)
	}
	cfg.WorkerEnv = func(int, string) []string { return []string{schema.EnvSeqPath + "="} }
	if got, ok := effective(cfg.WorkerEnviron(0, "w", 1), schema.EnvSeqPath); !ok || got != "" {
		t.Errorf("an explicit empty %s (count messages) became %q", schema.EnvSeqPath, got)
	}
}

func TestCheckWorkerEnv(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  []string
		want string // "" means accepted
	}{
		{"settings", []string{"SOCKFLEET_RESUME=none", "SOCKFLEET_SEQ_PATH=", "SOCKFLEET_SINK=stdout", "GODEBUG=x=1"}, ""},
		{"no equals sign", []string{"SOCKFLEET_RESUME"}, "want NAME=VALUE"},
		{"empty name", []string{"=x"}, "want NAME=VALUE"},
		{"space in name", []string{"SOCKFLEET RESUME=none"}, "want NAME=VALUE"},
		{"misspelt", []string{"SOCKFLEET_RESUM=none"}, "not a variable the worker reads"},
		{"fleet-owned id", []string{"SOCKFLEET_WORKER_ID=w9"}, "set by the local fleet"},
		{"fleet-owned endpoint", []string{"AWS_ENDPOINT_URL_DYNAMODB=http://x"}, "set by the local fleet"},
		{"twice", []string{"SOCKFLEET_RESUME=none", "SOCKFLEET_RESUME=query:from={seq}"}, "given twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := fleet.CheckWorkerEnv(tc.env)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("%v: %v", tc.env, err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("%v: error %v, want one saying %q", tc.env, err, tc.want)
			}
		})
	}
}

// TestWorkerSignsAsItsRole: a worker signs with the worker key when one is given
// (it then runs as the stack's task role behind the IAM proxy), and as the
// unrestricted administrator otherwise; a worker setting cannot change it.
func TestWorkerSignsAsItsRole(t *testing.T) {
	hijack := func(int, string) []string { return []string{"AWS_ACCESS_KEY_ID=local"} }
	for _, tc := range []struct {
		keys fleet.Keys
		want string
	}{
		{fleet.Keys{Worker: "WorkerTaskRole", Reconciler: "FunctionRole"}, "WorkerTaskRole"},
		{fleet.Keys{}, fleet.AdminKey},
	} {
		cfg := fleet.Config{Dir: "/d", Endpoint: "http://127.0.0.1:1", Table: "tbl", Keys: tc.keys, WorkerEnv: hijack}
		if got, _ := effective(cfg.WorkerEnviron(0, "w0-x-1", 8123), "AWS_ACCESS_KEY_ID"); got != tc.want {
			t.Errorf("keys %+v: the worker signs as %q, want %q", tc.keys, got, tc.want)
		}
	}
}
