package filtermatch

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/sockfleet/sockfleet/shared/filters"
)

func TestMatchSemantics(t *testing.T) {
	event := `{
		"eventName": "MODIFY",
		"dynamodb": {
			"NewImage": {
				"desired_state": {"S": "STARTED"},
				"lease_expires_at_ms": {"N": "0"},
				"tags": {"L": [{"S": "red"}, {"S": "blue"}]}
			}
		},
		"size": 42,
		"flag": true,
		"nothing": null
	}`
	cases := []struct {
		name    string
		pattern string
		want    bool
	}{
		{"exact string", `{"eventName": ["MODIFY"]}`, true},
		{"exact string mismatch", `{"eventName": ["INSERT"]}`, false},
		{"OR within an array", `{"eventName": ["INSERT", "MODIFY"]}`, true},
		{"AND across fields", `{"eventName": ["MODIFY"], "size": [41]}`, false},
		{"AND across fields, both", `{"eventName": ["MODIFY"], "size": [42]}`, true},
		{"nested object", `{"dynamodb": {"NewImage": {"desired_state": {"S": ["STARTED"]}}}}`, true},
		{"case matters", `{"dynamodb": {"NewImage": {"desired_state": {"S": ["started"]}}}}`, false},
		{"equals-ignore-case", `{"dynamodb": {"NewImage": {"desired_state": {"S": [{"equals-ignore-case": "started"}]}}}}`, true},
		{"DynamoDB number is a string", `{"dynamodb": {"NewImage": {"lease_expires_at_ms": {"N": ["0"]}}}}`, true},
		{"DynamoDB number is not a JSON number", `{"dynamodb": {"NewImage": {"lease_expires_at_ms": {"N": [0]}}}}`, false},
		{"numeric ignores strings", `{"dynamodb": {"NewImage": {"lease_expires_at_ms": {"N": [{"numeric": ["=", 0]}]}}}}`, false},
		{"numeric range", `{"size": [{"numeric": [">", 40, "<=", 42]}]}`, true},
		{"numeric range miss", `{"size": [{"numeric": [">", 42]}]}`, false},
		{"number exact", `{"size": [42.0]}`, true},
		{"prefix", `{"eventName": [{"prefix": "MOD"}]}`, true},
		{"prefix miss", `{"eventName": [{"prefix": "INS"}]}`, false},
		{"suffix", `{"eventName": [{"suffix": "IFY"}]}`, true},
		{"anything-but", `{"eventName": [{"anything-but": "INSERT"}]}`, true},
		{"anything-but list", `{"eventName": [{"anything-but": ["INSERT", "MODIFY"]}]}`, false},
		{"anything-but prefix", `{"eventName": [{"anything-but": {"prefix": "MO"}}]}`, false},
		{"anything-but needs the field", `{"missing": [{"anything-but": "x"}]}`, false},
		{"exists on a leaf", `{"eventName": [{"exists": true}]}`, true},
		{"exists false on a missing field", `{"missing": [{"exists": false}]}`, true},
		{"exists false on a present leaf", `{"eventName": [{"exists": false}]}`, false},
		{"exists false on a missing nested field", `{"dynamodb": {"NewImage": {"lease_owner": {"S": [{"exists": false}]}}}}`, true},
		// Exists works on leaves only: an object is not one (as in Lambda).
		{"exists true on an object", `{"dynamodb": {"NewImage": {"desired_state": [{"exists": true}]}}}`, false},
		{"exists false on an object", `{"dynamodb": {"NewImage": {"desired_state": [{"exists": false}]}}}`, true},
		{"array element matches", `{"dynamodb": {"NewImage": {"tags": {"L": {"S": ["blue"]}}}}}`, true},
		{"bool", `{"flag": [true]}`, true},
		{"bool miss", `{"flag": [false]}`, false},
		{"null", `{"nothing": [null]}`, true},
		{"null is present", `{"nothing": [{"exists": true}]}`, true},
		{"string never matches a number", `{"size": ["42"]}`, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, err := CompileJSON([]byte(tc.pattern))
			if err != nil {
				t.Fatal(err)
			}
			got, err := s.MatchJSON([]byte(event))
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("match = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestCompileRefuses(t *testing.T) {
	for _, p := range []string{
		`[]`, `{}`, `{"a": "x"}`, `{"a": []}`, `{"a": {}}`, `{"a": [{"cidr": "10.0.0.0/8"}]}`,
		`{"a": [{"prefix": 1}]}`, `{"a": [{"numeric": [">"]}]}`, `{"a": [{"numeric": ["~", 1]}]}`,
		`{"a": [{"exists": "yes"}]}`, `{"a": [{"prefix": "x", "suffix": "y"}]}`, `{"a": [{"anything-but": []}]}`,
		`{"a": ["x"]} trailing`,
	} {
		if _, err := CompileJSON([]byte(p)); err == nil {
			t.Errorf("%s compiled", p)
		}
	}
}

func TestPatternsCompileAndRender(t *testing.T) {
	s, err := Compile(filters.Patterns)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.patterns) != len(filters.Patterns) {
		t.Fatalf("%d compiled, want %d", len(s.patterns), len(filters.Patterns))
	}
	for i, j := range filters.JSON() {
		if !json.Valid([]byte(j)) {
			t.Errorf("pattern %d renders invalid JSON: %s", i, j)
		}
		if _, err := CompileJSON([]byte(j)); err != nil {
			t.Errorf("pattern %d as rendered: %v", i, err)
		}
	}
}

// A heartbeat (an owned STARTED item whose expiry moves) written the way Lambda shows
// it. It must pass no pattern; the untyped form {"exists": false} on the attribute
// would have passed it, because exists looks at leaves only.
func TestHeartbeatNeverPasses(t *testing.T) {
	heartbeat := `{"eventName": "MODIFY", "dynamodb": {
		"OldImage": {"Pk": {"S": "CONN#c"}, "desired_state": {"S": "STARTED"}, "lease_owner": {"S": "w1"}, "lease_expires_at_ms": {"N": "1000"}},
		"NewImage": {"Pk": {"S": "CONN#c"}, "desired_state": {"S": "STARTED"}, "lease_owner": {"S": "w1"}, "lease_expires_at_ms": {"N": "2000"}}}}`
	s := MustCompile(filters.Patterns)
	if ok, _ := s.MatchJSON([]byte(heartbeat)); ok {
		t.Fatal("a heartbeat passes the filters")
	}
	untyped, _ := CompileJSON([]byte(`{"eventName": ["MODIFY"], "dynamodb": {"NewImage": {"lease_expires_at_ms": [{"exists": false}]}}}`))
	if ok, _ := untyped.MatchJSON([]byte(heartbeat)); !ok {
		t.Fatal("the untyped exists pattern should match an object-valued attribute (Lambda's leaf-only rule)")
	}
	if !strings.Contains(strings.Join(filters.JSON(), ""), `"lease_expires_at_ms":{"N":[{"exists":false}]}`) {
		t.Fatal("the absent-expiry pattern must name the N type")
	}
}

// trace_parent (tracing.AttrTraceParent) changes nothing the filters see: a checkpoint
// or a transfer whose item carries one (left by an earlier release, or written by the
// transfer itself) passes no pattern, and a release passes with or without one.
func TestTraceParentChangesNoFilterDecision(t *testing.T) {
	const tp = `"trace_parent": {"S": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}, `
	item := func(extra, owner, expires, seq string) string {
		return `{"Pk": {"S": "CONN#c"}, "desired_state": {"S": "STARTED"}, ` + extra +
			`"lease_owner": {"S": "` + owner + `"}, "lease_expires_at_ms": {"N": "` + expires + `"}, "last_seq": {"N": "` + seq + `"}}`
	}
	record := func(old, cur string) []byte {
		return []byte(`{"eventName": "MODIFY", "dynamodb": {"OldImage": ` + old + `, "NewImage": ` + cur + `}}`)
	}
	s := MustCompile(filters.Patterns)
	for _, c := range []struct {
		name string
		rec  []byte
		want bool
	}{
		{"checkpoint", record(item("", "w1", "1000", "5"), item("", "w1", "1000", "9")), false},
		{"checkpoint after a traced write", record(item(tp, "w1", "1000", "5"), item(tp, "w1", "1000", "9")), false},
		{"transfer carrying trace_parent", record(item("", "w1", "1000", "5"), item(tp, "w2", "1000", "5")), false},
		{"release", record(item("", "w1", "1000", "5"), item("", "w1", "0", "5")), true},
		{"release carrying trace_parent", record(item("", "w1", "1000", "5"), item(tp, "w1", "0", "5")), true},
	} {
		if ok, err := s.MatchJSON(c.rec); err != nil || ok != c.want {
			t.Errorf("%s: passes %v (err %v), want %v", c.name, ok, err, c.want)
		}
	}
}
