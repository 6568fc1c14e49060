package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/sockfleet/sockfleet/shared/local/iam"
	"github.com/sockfleet/sockfleet/shared/schema"
)

// The sinkStreams knob grants kinesis:PutRecords on exactly the streams it names (a
// name in the stack's account and region, an ARN as written), to the task role
// alone, and passes the same names to the workers as SOCKFLEET_SINKS_ALLOWED.
// Without it, no such grant and no variable.
func TestSinkStreams(t *testing.T) {
	const arn = "arn:aws:kinesis:eu-west-1:123456789012:stream/huobi.book"
	_, j := synthWith(t, map[string]any{ctxKinesisStream: KinesisStdout, ctxSinkStreams: "okx-trades, " + arn})
	x := findIDs(t, j)
	grants := kinesisStatements(j)
	if len(grants) != 1 || len(grants[x.taskRole]) != 1 {
		t.Fatalf("Kinesis grants %v; want one statement of the task role", grants)
	}
	s := grants[x.taskRole][0]
	wantSame(t, "actions", s.actions, []string{"kinesis:PutRecords"})
	var named, imported int
	for _, r := range asSlice(s.resource) {
		switch x := fmt.Sprint(r); {
		case r == arn:
			imported++
		case strings.Contains(x, ":stream/okx-trades") && strings.Contains(x, "AWS::AccountId") && strings.Contains(x, "AWS::Region"):
			named++
		default:
			t.Errorf("resource %v granted", r)
		}
	}
	if named != 1 || imported != 1 {
		t.Fatalf("resources %v; want okx-trades in the stack's account and region, and %s", s.resource, arn)
	}
	wantSame(t, "SOCKFLEET_SINKS_ALLOWED", workerEnv(t, j)[schema.EnvSinksAllowed], "okx-trades,"+arn)

	// The same template under the local fleet's IAM enforcement (shared/local/iam):
	// the worker role may put to the granted streams, and to no other.
	raw, err := json.Marshal(j)
	if err != nil {
		t.Fatal(err)
	}
	tpl, err := iam.ParseTemplate(raw)
	if err != nil {
		t.Fatal(err)
	}
	env := iam.LocalEnv(nil)
	pol, err := tpl.Policy(x.taskRole, env)
	if err != nil {
		t.Fatal(err)
	}
	local := "arn:aws:kinesis:us-east-1:000000000000:stream/"
	for res, want := range map[string]bool{local + "okx-trades": true, arn: true, local + "other": false,
		"arn:aws:kinesis:eu-west-1:123456789012:stream/okx-trades": false} {
		d, err := pol.Evaluate(iam.Request{Action: "kinesis:PutRecords", Resources: []string{res}})
		if err != nil || d.Allowed != want {
			t.Errorf("PutRecords on %s: allowed %v (%v), want %v", res, d.Allowed, err, want)
		}
	}

	_, d := template(t)
	if v, ok := workerEnv(t, d)[schema.EnvSinksAllowed]; ok {
		t.Fatalf("SOCKFLEET_SINKS_ALLOWED %v without the knob", v)
	}
	for _, stmts := range kinesisStatements(d) {
		for _, s := range stmts {
			if len(s.actions) == 1 && s.actions[0] == "kinesis:PutRecords" {
				t.Fatalf("a PutRecords-only grant without the knob: %v", s)
			}
		}
	}
}

func TestSinkStreamsKnob(t *testing.T) {
	for _, tc := range []struct {
		v    any
		want string
		err  string
	}{
		{"a b,a", "a,b", ""},
		{[]any{"a", "arn:aws:kinesis:us-east-1:123456789012:stream/b"}, "a,arn:aws:kinesis:us-east-1:123456789012:stream/b", ""},
		{"", "", ""},
		{"file:/tmp/x", "", "for local runs"},
		{"a,b/c", "", "b/c"},
		{[]any{"a", 3}, "", "[1] 3 is not a string"},
		{7, "", "neither a string"},
	} {
		got, err := sinkStreamsFrom(tc.v)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v: error %v, want one saying %q", tc.v, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%v: %q, %v; want %q", tc.v, got, err, tc.want)
		}
	}
	if _, err := ConfigFromContext(func(k string) any {
		if k == ctxSinkStreams {
			return "bad/stream"
		}
		return nil
	}); err == nil || !strings.Contains(err.Error(), "context sinkStreams") {
		t.Fatalf("bad knob: %v", err)
	}
}
