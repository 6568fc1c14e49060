package iam

import (
	"encoding/json"
	"errors"
	"github.com/sockfleet/sockfleet/shared/local/cdkout"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
)

const (
	table    = "conns"
	tableARN = "arn:aws:dynamodb:us-east-1:000000000000:table/conns"
	stream   = tableARN + "/stream/2026-01-01T00:00:00.000"
)

func fixture(t *testing.T) *Template {
	t.Helper()
	tpl, err := LoadTemplate("testdata/fixture.template.json")
	if err != nil {
		t.Fatal(err)
	}
	return tpl
}

func fixtureEnv() Env {
	env := LocalEnv(map[string]string{"Table": table, "Messages": "msgs", "Topic": "alarms"})
	env.StreamARNs = map[string]string{"Table": stream}
	return env
}

func policy(t *testing.T, tpl *Template, role string) *Policy {
	t.Helper()
	p, err := tpl.Policy(role, fixtureEnv())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestResolve(t *testing.T) {
	p := policy(t, fixture(t), "WorkerRole")
	want := [][]string{
		{tableARN, tableARN + "/index/*"},
		{tableARN},
		{tableARN},
		{"arn:aws:kinesis:us-east-1:000000000000:stream/msgs"},
	}
	if len(p.Statements) != len(want) {
		t.Fatalf("%d statements, want %d", len(p.Statements), len(want))
	}
	for i, s := range p.Statements {
		if !slices.Equal(s.Resources, want[i]) {
			t.Errorf("statement %d (%s): resources %v, want %v", i, s.Source, s.Resources, want[i])
		}
	}
	if s := p.Statements[0].Source; s != "WorkerPolicy#0" {
		t.Errorf("source %q, want WorkerPolicy#0", s)
	}
	f := policy(t, fixture(t), "FunctionRole")
	if got := f.Statements[0].Resources; !slices.Equal(got, []string{stream}) {
		t.Errorf("StreamArn resolved to %v, want %s", got, stream)
	}
	if got := f.Statements[1].Resources; !slices.Equal(got, []string{"arn:aws:sns:us-east-1:000000000000:alarms"}) {
		t.Errorf("topic Ref resolved to %v", got)
	}
	// Without an explicit stream ARN, any stream of the table.
	noStream, err := fixture(t).Policy("FunctionRole", LocalEnv(map[string]string{"Table": table}))
	if err != nil {
		t.Fatal(err)
	}
	if got := noStream.Statements[0].Resources; !slices.Equal(got, []string{tableARN + "/stream/*"}) {
		t.Errorf("StreamArn without a label: %v", got)
	}
}

func TestPolicyErrors(t *testing.T) {
	tpl := fixture(t)
	for _, tc := range []struct{ role, want string }{
		{"BadRole", "NumericLessThan is not supported"},
		{"Table", "not an AWS::IAM::Role"},
		{"Nope", "not an AWS::IAM::Role"},
	} {
		t.Run(tc.role, func(t *testing.T) {
			_, err := tpl.Policy(tc.role, fixtureEnv())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
	bad := &Template{Resources: map[string]Resource{
		"R": {Type: "AWS::IAM::Role", Properties: map[string]any{"Policies": []any{map[string]any{
			"PolicyName": "P", "PolicyDocument": map[string]any{"Statement": []any{map[string]any{
				"Effect": "Allow", "Action": "dynamodb:GetItem", "Resource": map[string]any{"Fn::ImportValue": "x"},
			}}}}}}},
	}}
	if _, err := bad.Policy("R", fixtureEnv()); err == nil || !strings.Contains(err.Error(), "unsupported intrinsic Fn::ImportValue") {
		t.Errorf("unknown intrinsic: error %v", err)
	}
	unknownKey := &Template{Resources: map[string]Resource{
		"R": {Type: "AWS::IAM::Role", Properties: map[string]any{"Policies": []any{map[string]any{
			"PolicyName": "P", "PolicyDocument": map[string]any{"Statement": []any{map[string]any{
				"Effect": "Allow", "Action": "dynamodb:GetItem", "Resource": "*",
				"Condition": map[string]any{"StringEquals": map[string]any{"dynamodb:Attributes": "x"}},
			}}}}}}},
	}}
	if _, err := unknownKey.Policy("R", fixtureEnv()); err == nil || !strings.Contains(err.Error(), "dynamodb:Attributes") {
		t.Errorf("unknown condition key: error %v", err)
	}
}

func TestEvaluate(t *testing.T) {
	tpl := fixture(t)
	worker, fn := policy(t, tpl, "WorkerRole"), policy(t, tpl, "FunctionRole")
	keys := func(v ...string) map[string][]string { return map[string][]string{"dynamodb:leadingkeys": v} }
	for _, tc := range []struct {
		name     string
		p        *Policy
		req      Request
		allowed  bool
		explicit bool
	}{
		{"allowed action", worker, Request{Action: "dynamodb:GetItem", Resources: []string{tableARN}}, true, false},
		{"action names are case-insensitive", worker, Request{Action: "DynamoDB:getitem", Resources: []string{tableARN}}, true, false},
		{"wildcard action", worker, Request{Action: "dynamodb:PutItem", Resources: []string{tableARN}, Context: keys("CONN#1")}, true, false},
		{"missing action", worker, Request{Action: "dynamodb:Scan", Resources: []string{tableARN}}, false, false},
		{"index by wildcard", worker, Request{Action: "dynamodb:Query", Resources: []string{tableARN + "/index/owner-index"}}, true, false},
		{"other table", worker, Request{Action: "dynamodb:GetItem", Resources: []string{tableARN + "2"}}, false, false},
		{"resources are case-sensitive", worker, Request{Action: "dynamodb:GetItem", Resources: []string{strings.ToUpper(tableARN)}}, false, false},
		{"every resource must allow", worker, Request{Action: "dynamodb:GetItem", Resources: []string{tableARN, tableARN + "2"}}, false, false},
		{"condition holds", worker, Request{Action: "dynamodb:UpdateItem", Resources: []string{tableARN}, Context: keys("CONN#a", "WORKER#1")}, true, false},
		{"condition fails on one value", worker, Request{Action: "dynamodb:UpdateItem", Resources: []string{tableARN}, Context: keys("CONN#a", "WORKER#12")}, false, false},
		{"ForAllValues with no values", worker, Request{Action: "dynamodb:UpdateItem", Resources: []string{tableARN}}, true, false},
		{"explicit deny wins", worker, Request{Action: "dynamodb:PutItem", Resources: []string{tableARN}, Context: keys("CONN#1", "FORBIDDEN")}, false, true},
		{"kinesis", worker, Request{Action: "kinesis:PutRecords", Resources: []string{"arn:aws:kinesis:us-east-1:000000000000:stream/msgs"}}, true, false},
		{"kinesis other stream", worker, Request{Action: "kinesis:PutRecords", Resources: []string{"arn:aws:kinesis:us-east-1:000000000000:stream/other"}}, false, false},
		{"stream read", fn, Request{Action: "dynamodb:GetRecords", Resources: []string{stream}}, true, false},
		{"NotAction allows the rest", fn, Request{Action: "dynamodb:Scan", Resources: []string{tableARN}}, true, false},
		{"NotAction excludes", fn, Request{Action: "dynamodb:DeleteItem", Resources: []string{tableARN}}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := tc.p.Evaluate(tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed != tc.allowed || d.ExplicitDeny != tc.explicit {
				t.Errorf("decision %+v, want allowed %v, explicit deny %v", d, tc.allowed, tc.explicit)
			}
		})
	}
	if _, err := worker.Evaluate(Request{Action: "dynamodb:UpdateItem", Resources: []string{tableARN}, Unknown: []string{"dynamodb:leadingkeys"}}); err == nil {
		t.Error("a condition on a key the request could not compute: no error")
	}
}

func TestConditionOperators(t *testing.T) {
	ctx := func(v ...string) map[string][]string { return map[string][]string{"k:k": v} }
	for _, tc := range []struct {
		op     string
		values []string
		ctx    map[string][]string
		want   bool
	}{
		{"StringEquals", []string{"a"}, ctx("a"), true},
		{"StringEquals", []string{"a"}, ctx("A"), false},
		{"StringEquals", []string{"a"}, nil, false},
		{"StringEqualsIfExists", []string{"a"}, nil, true},
		{"StringNotEquals", []string{"a"}, ctx("b"), true},
		{"StringNotEquals", []string{"a"}, nil, true},
		{"StringEqualsIgnoreCase", []string{"a"}, ctx("A"), true},
		{"StringLike", []string{"a*"}, ctx("abc"), true},
		{"StringNotLike", []string{"a*"}, ctx("abc"), false},
		{"ForAllValues:StringEquals", []string{"a", "b"}, ctx("a", "b"), true},
		{"ForAllValues:StringEquals", []string{"a"}, ctx("a", "b"), false},
		{"ForAnyValue:StringEquals", []string{"a"}, ctx("a", "b"), true},
		{"ForAnyValue:StringEquals", []string{"a"}, nil, false},
	} {
		t.Run(tc.op+"/"+strings.Join(tc.ctx["k:k"], ","), func(t *testing.T) {
			got, err := Condition{Operator: tc.op, Key: "k:k", Values: tc.values}.holds(tc.ctx)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
	for _, op := range []string{"NumericEquals", "ForEach:StringLike", "DateLessThan", "Bool"} {
		if _, err := operator(op); err == nil {
			t.Errorf("operator %s: no error", op)
		}
	}
}

func TestGlob(t *testing.T) {
	for _, tc := range []struct {
		p, s string
		want bool
	}{
		{"*", "", true}, {"*", "anything", true}, {"a*c", "abbc", true}, {"a*c", "abcd", false},
		{"a?c", "abc", true}, {"a?c", "ac", false}, {"*/index/*", "t/index/i", true},
		{"arn:*:table/x", "arn:aws:dynamodb:r:a:table/x", true}, {"arn:*:table/x", "arn:aws:dynamodb:r:a:table/xy", false},
		{"a**b", "ab", true}, {"", "", true}, {"", "a", false},
	} {
		if got := Glob(tc.p, tc.s); got != tc.want {
			t.Errorf("Glob(%q, %q) = %v, want %v", tc.p, tc.s, got, tc.want)
		}
	}
}

func TestMapper(t *testing.T) {
	tpl := fixture(t)
	keys, err := tpl.TableKeys("Table")
	if err != nil {
		t.Fatal(err)
	}
	m := &Mapper{Env: fixtureEnv(), Tables: map[string]TableKeys{table: keys}, StreamARN: func(string) string { return stream }}
	iters := func(it string) (string, bool) { return stream, it == "it-1" }
	type want struct {
		action, resource string
		leading          []string
	}
	for _, tc := range []struct {
		op, body string
		want     []want
	}{
		{"PutItem", `{"TableName":"conns","Item":{"Pk":{"S":"CONN#1"},"x":{"N":"1"}}}`, []want{{"dynamodb:PutItem", tableARN, []string{"CONN#1"}}}},
		{"GetItem", `{"TableName":"conns","Key":{"Pk":{"S":"CONN#1"}}}`, []want{{"dynamodb:GetItem", tableARN, []string{"CONN#1"}}}},
		{"Scan", `{"TableName":"conns"}`, []want{{"dynamodb:Scan", tableARN, nil}}},
		{"Query", `{"TableName":"conns","IndexName":"owner-index","KeyConditionExpression":"#o = :o","ExpressionAttributeNames":{"#o":"owner"},"ExpressionAttributeValues":{":o":{"S":"w1"}}}`,
			[]want{{"dynamodb:Query", tableARN + "/index/owner-index", []string{"w1"}}}},
		{"BatchGetItem", `{"RequestItems":{"b":{"Keys":[{"Pk":{"S":"1"}}]},"conns":{"Keys":[{"Pk":{"S":"CONN#1"}},{"Pk":{"S":"CONN#2"}}]}}}`,
			[]want{{"dynamodb:BatchGetItem", "arn:aws:dynamodb:us-east-1:000000000000:table/b", nil}, {"dynamodb:BatchGetItem", tableARN, []string{"CONN#1", "CONN#2"}}}},
		{"BatchWriteItem", `{"RequestItems":{"conns":[{"PutRequest":{"Item":{"Pk":{"S":"a"}}}},{"DeleteRequest":{"Key":{"Pk":{"S":"b"}}}}]}}`,
			[]want{{"dynamodb:BatchWriteItem", tableARN, []string{"a", "b"}}}},
		{"TransactWriteItems", `{"TransactItems":[{"Update":{"TableName":"conns","Key":{"Pk":{"S":"a"}}}},{"ConditionCheck":{"TableName":"conns","Key":{"Pk":{"S":"b"}}}}]}`,
			[]want{{"dynamodb:UpdateItem", tableARN, []string{"a"}}, {"dynamodb:ConditionCheckItem", tableARN, []string{"b"}}}},
		{"DescribeStream", `{"StreamArn":"` + stream + `"}`, []want{{"dynamodb:DescribeStream", stream, nil}}},
		{"GetRecords", `{"ShardIterator":"it-1"}`, []want{{"dynamodb:GetRecords", stream, nil}}},
		{"ListStreams", `{"TableName":"conns"}`, []want{{"dynamodb:ListStreams", stream, nil}}},
		{"DescribeTable", `{"TableName":"conns"}`, []want{{"dynamodb:DescribeTable", tableARN, nil}}},
	} {
		t.Run(tc.op, func(t *testing.T) {
			c, err := m.dynamo(tc.op, []byte(tc.body), iters)
			if err != nil {
				t.Fatal(err)
			}
			if len(c.reqs) != len(tc.want) {
				t.Fatalf("requests %+v, want %+v", c.reqs, tc.want)
			}
			for i, w := range tc.want {
				r := c.reqs[i]
				if r.Action != w.action || !slices.Equal(r.Resources, []string{w.resource}) || !slices.Equal(r.Context["dynamodb:leadingkeys"], w.leading) {
					t.Errorf("request %d: %+v, want %+v", i, r, w)
				}
			}
		})
	}
	if _, err := m.dynamo("GetRecords", []byte(`{"ShardIterator":"unknown"}`), iters); err == nil {
		t.Error("GetRecords with an iterator never handed out: no error")
	}
	c, err := m.kinesis("PutRecords", []byte(`{"StreamName":"msgs","Records":[]}`), iters)
	if err != nil || c.reqs[0].Action != "kinesis:PutRecords" || c.reqs[0].Resources[0] != "arn:aws:kinesis:us-east-1:000000000000:stream/msgs" {
		t.Errorf("kinesis PutRecords: %+v, %v", c.reqs, err)
	}
}

func TestWithout(t *testing.T) {
	tpl := fixture(t)
	for _, src := range []string{"WorkerPolicy#0", "FunctionRole/Inline#2"} {
		role := "WorkerRole"
		if strings.HasPrefix(src, "Function") {
			role = "FunctionRole"
		}
		before, _ := tpl.Statements(role)
		cut, err := tpl.Without(src)
		if err != nil {
			t.Fatal(err)
		}
		after, _ := cut.Statements(role)
		if len(after) != len(before)-1 {
			t.Errorf("%s: %d statements after, %d before", src, len(after), len(before))
		}
		again, _ := tpl.Statements(role)
		if len(again) != len(before) {
			t.Errorf("%s: Without changed the original", src)
		}
	}
	if _, err := tpl.Without("WorkerPolicy#9"); err == nil {
		t.Error("out of range: no error")
	}
}

// TestSynthesizedTemplate reads the stack's real template, if synthesized: the roles
// the local fleet runs as are found, and their policies resolve.
func TestSynthesizedTemplate(t *testing.T) {
	path, err := cdkout.Find(".")
	if errors.Is(err, cdkout.ErrNoTemplate) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	tpl, err := LoadTemplate(path)
	if err != nil {
		t.Fatal(err)
	}
	tableID, err := tpl.Table()
	if err != nil {
		t.Fatal(err)
	}
	env := LocalEnv(map[string]string{tableID: table})
	worker, err := tpl.TaskRole("worker")
	if err != nil {
		t.Fatal(err)
	}
	fn, err := tpl.StreamFunctionRole(tableID)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		role    string
		action  string
		res     string
		allowed bool
	}{
		{worker, "dynamodb:UpdateItem", tableARN, true},
		{worker, "dynamodb:Query", tableARN + "/index/lease_owner-index", true},
		{worker, "dynamodb:DeleteTable", tableARN, false},
		{worker, "dynamodb:GetRecords", tableARN + "/stream/x", false},
		{fn, "dynamodb:Scan", tableARN, true},
		{fn, "dynamodb:GetRecords", tableARN + "/stream/x", true},
		{fn, "dynamodb:CreateTable", tableARN, false},
	} {
		p, err := tpl.Policy(tc.role, env)
		if err != nil {
			t.Fatal(err)
		}
		d, err := p.Evaluate(Request{Action: tc.action, Resources: []string{tc.res}})
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed != tc.allowed {
			t.Errorf("%s %s on %s: allowed %v, want %v", tc.role, tc.action, tc.res, d.Allowed, tc.allowed)
		}
	}
	keys, err := tpl.TableKeys(tableID)
	if err != nil || keys.PartitionKey == "" {
		t.Errorf("table keys %+v, %v", keys, err)
	}
	raw, _ := json.Marshal(keys)
	t.Logf("%s: worker role %s, reconciler role %s, keys %s", path, worker, fn, raw)
}

// FuzzMapper: any request body maps to requests with an action and a resource each,
// or to an error; never a panic.
func FuzzMapper(f *testing.F) {
	for _, s := range []string{
		`{"TableName":"conns","Key":{"Pk":{"S":"a"}}}`,
		`{"RequestItems":{"conns":[{"PutRequest":{"Item":{"Pk":{"N":"1"}}}}]}}`,
		`{"TransactItems":[{"Put":{"TableName":"conns","Item":{}}}]}`,
		`{"TableName":"conns","KeyConditionExpression":"#p = :v","ExpressionAttributeNames":{"#p":"Pk"},"ExpressionAttributeValues":{":v":{"S":"x"}}}`,
		`{"ShardIterator":"it-1"}`, `{}`, `null`, `[`,
	} {
		for _, op := range []string{"GetItem", "BatchWriteItem", "TransactWriteItems", "Query", "GetRecords", "DescribeTable"} {
			f.Add(op, s)
		}
	}
	m := &Mapper{Env: fixtureEnv(), Tables: map[string]TableKeys{table: {PartitionKey: "Pk"}}}
	iters := func(it string) (string, bool) { return stream, it == "it-1" }
	f.Fuzz(func(t *testing.T, op, body string) {
		for _, mapped := range []func() (call, error){
			func() (call, error) { return m.dynamo(op, []byte(body), iters) },
			func() (call, error) { return m.kinesis(op, []byte(body), iters) },
		} {
			c, err := mapped()
			if err != nil {
				continue
			}
			for _, r := range c.reqs {
				if r.Action == "" || len(r.Resources) == 0 {
					t.Errorf("%s %s: request %+v without an action or a resource", op, body, r)
				}
			}
		}
	})
}

// TestDenyShape: the body of a refusal, per protocol, byte for byte.
func TestDenyShape(t *testing.T) {
	for _, tc := range []struct {
		json11      bool
		ctype, body string
	}{
		{false, "application/x-amz-json-1.0", `{"Message":"User: x is not authorized","__type":"com.amazon.coral.service#AccessDeniedException"}`},
		{true, "application/x-amz-json-1.1", `{"Message":"User: x is not authorized","__type":"AccessDeniedException"}`},
	} {
		p := &Proxy{log: slog.New(slog.DiscardHandler)}
		w := httptest.NewRecorder()
		p.deny(w, Denial{Role: "R", Action: "a:B", Message: "User: x is not authorized"}, tc.json11)
		if w.Code != http.StatusBadRequest || w.Header().Get("Content-Type") != tc.ctype || w.Body.String() != tc.body {
			t.Errorf("json 1.1 %v: %d %s %s; want 400 %s %s", tc.json11, w.Code, w.Header().Get("Content-Type"), w.Body, tc.ctype, tc.body)
		}
	}
}
