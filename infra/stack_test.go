package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/jsii-runtime-go"

	"github.com/sockfleet/sockfleet/shared/filters"
	"github.com/sockfleet/sockfleet/shared/schema"
)

// Synthesis takes seconds and is the same for every test, so it happens once per
// test binary, with the context cdk.json gives `cdk synth`.
var (
	synthOnce sync.Once
	synthTpl  assertions.Template
	synthJSON map[string]any
	synthErr  error
	synthDir  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if synthDir != "" {
		os.RemoveAll(synthDir)
	}
	jsii.Close()
	os.Exit(code)
}

// cdkContext is the "context" object of the repository's cdk.json: feature flags
// and knob defaults.
func cdkContext() (map[string]any, error) {
	b, err := os.ReadFile(filepath.Join("..", "cdk.json"))
	if err != nil {
		return nil, err
	}
	var doc struct {
		Context map[string]any `json:"context"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("cdk.json: %w", err)
	}
	return doc.Context, nil
}

func synth() (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("synth panicked: %v", r)
		}
	}()
	ctx, err := cdkContext()
	if err != nil {
		return err
	}
	if synthDir, err = os.MkdirTemp("", "sockfleet-infra-test-"); err != nil {
		return err
	}
	// A stand-in for the reconciler binary: asset staging only copies it.
	code := filepath.Join(synthDir, "reconciler")
	if err := os.MkdirAll(code, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(code, "bootstrap"), []byte("#!/bin/false\n"), 0o755); err != nil {
		return err
	}
	root, err := filepath.Abs("..")
	if err != nil {
		return err
	}
	app := awscdk.NewApp(&awscdk.AppProps{Context: &ctx, Outdir: jsii.String(filepath.Join(synthDir, "cdk.out"))})
	cfg, err := ConfigFromContext(func(key string) any { return app.Node().TryGetContext(jsii.String(key)) })
	if err != nil {
		return err
	}
	stack := NewStack(app, stackName, &StackProps{Config: cfg, RepoRoot: root, ReconcilerCode: code})
	synthTpl = assertions.Template_FromStack(stack, nil)
	synthJSON = *synthTpl.ToJSON()
	return nil
}

// synthWith synthesizes the stack afresh with cdk.json's context and extra on top.
func synthWith(t *testing.T, extra map[string]any) (tpl assertions.Template, j obj) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("synth with %v panicked: %v", extra, r)
		}
	}()
	ctx, err := cdkContext()
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range extra {
		ctx[k] = v
	}
	dir := t.TempDir()
	code := filepath.Join(dir, "reconciler")
	if err := os.MkdirAll(code, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(code, "bootstrap"), []byte("#!/bin/false\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	app := awscdk.NewApp(&awscdk.AppProps{Context: &ctx, Outdir: jsii.String(filepath.Join(dir, "cdk.out"))})
	cfg, err := ConfigFromContext(func(key string) any { return app.Node().TryGetContext(jsii.String(key)) })
	if err != nil {
		t.Fatal(err)
	}
	stack := NewStack(app, stackName, &StackProps{Config: cfg, RepoRoot: root, ReconcilerCode: code})
	tpl = assertions.Template_FromStack(stack, nil)
	return tpl, *tpl.ToJSON()
}

func template(t *testing.T) (assertions.Template, map[string]any) {
	t.Helper()
	synthOnce.Do(func() { synthErr = synth() })
	if synthErr != nil {
		t.Fatal(synthErr)
	}
	return synthTpl, synthJSON
}

// check runs one assertions.Template call: a failed assertion panics, and the panic
// becomes a test error naming what was checked.
func check(t *testing.T, what string, assert func()) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			t.Errorf("%s: %v", what, r)
		}
	}()
	assert()
}

// The template as plain JSON values, for the checks assertions.Match cannot say.
type obj = map[string]any

func ref(id string) obj          { return obj{"Ref": id} }
func getAtt(id, attr string) obj { return obj{"Fn::GetAtt": []any{id, attr}} }

// resources returns the resources of type typ, by logical id.
func resources(tpl obj, typ string) map[string]obj {
	out := map[string]obj{}
	for id, r := range tpl["Resources"].(obj) {
		if r := r.(obj); r["Type"] == typ {
			out[id] = r
		}
	}
	return out
}

// only returns the logical id and properties of the one resource of type typ that
// satisfies keep (nil: any).
func only(t *testing.T, tpl obj, typ string, keep func(props obj) bool) (string, obj) {
	t.Helper()
	var ids []string
	var found obj
	for id, r := range resources(tpl, typ) {
		props, _ := r["Properties"].(obj)
		if keep == nil || keep(props) {
			ids = append(ids, id)
			found = props
		}
	}
	if len(ids) != 1 {
		t.Fatalf("want exactly one %s, found %v", typ, ids)
	}
	return ids[0], found
}

// onlyID returns the logical id of the one resource of type typ.
func onlyID(t *testing.T, tpl obj, typ string) string {
	t.Helper()
	id, _ := only(t, tpl, typ, nil)
	return id
}

// path walks nested objects and arrays: path(x, "A", 0, "B").
func path(v any, keys ...any) any {
	for _, k := range keys {
		switch k := k.(type) {
		case string:
			m, ok := v.(obj)
			if !ok {
				return nil
			}
			v = m[k]
		case int:
			a, ok := v.([]any)
			if !ok || k >= len(a) {
				return nil
			}
			v = a[k]
		}
	}
	return v
}

// same compares template values with expected ones through JSON, so numbers, slices
// and maps of any Go type compare by value.
func same(got, want any) bool {
	g, err1 := json.Marshal(got)
	w, err2 := json.Marshal(want)
	if err1 != nil || err2 != nil {
		return false
	}
	var gv, wv any
	_ = json.Unmarshal(g, &gv)
	_ = json.Unmarshal(w, &wv)
	return reflect.DeepEqual(gv, wv)
}

func wantSame(t *testing.T, what string, got, want any) {
	t.Helper()
	if !same(got, want) {
		g, _ := json.Marshal(got)
		w, _ := json.Marshal(want)
		t.Errorf("%s:\n got %s\nwant %s", what, g, w)
	}
}

// ids of the main resources, found by what makes each unique.
type ids struct {
	table, cluster, secret, reconciler, reconcilerRole, reconcilerSG string
	service, task, taskRole, execRole, workerSG, failureTopic        string
}

func findIDs(t *testing.T, tpl obj) ids {
	t.Helper()
	var x ids
	x.table, _ = only(t, tpl, "AWS::DynamoDB::GlobalTable", nil)
	x.cluster, _ = only(t, tpl, "AWS::ECS::Cluster", nil)
	x.secret, _ = only(t, tpl, "AWS::SecretsManager::Secret", nil)
	var fn obj
	x.reconciler, fn = only(t, tpl, "AWS::Lambda::Function", func(p obj) bool { return p["Handler"] == "bootstrap" })
	x.reconcilerRole, _ = path(fn, "Role", "Fn::GetAtt", 0).(string)
	x.reconcilerSG, _ = path(fn, "VpcConfig", "SecurityGroupIds", 0, "Fn::GetAtt", 0).(string)
	var svc, task obj
	x.service, svc = only(t, tpl, "AWS::ECS::Service", nil)
	x.workerSG, _ = path(svc, "NetworkConfiguration", "AwsvpcConfiguration", "SecurityGroups", 0, "Fn::GetAtt", 0).(string)
	x.task, task = only(t, tpl, "AWS::ECS::TaskDefinition", nil)
	x.taskRole, _ = path(task, "TaskRoleArn", "Fn::GetAtt", 0).(string)
	x.execRole, _ = path(task, "ExecutionRoleArn", "Fn::GetAtt", 0).(string)
	esm := resources(tpl, "AWS::Lambda::EventSourceMapping")
	for _, r := range esm {
		x.failureTopic, _ = path(r, "Properties", "DestinationConfig", "OnFailure", "Destination", "Ref").(string)
	}
	for name, v := range map[string]string{
		"reconciler role": x.reconcilerRole, "reconciler security group": x.reconcilerSG,
		"worker security group": x.workerSG, "task role": x.taskRole, "execution role": x.execRole,
		"on-failure destination": x.failureTopic,
	} {
		if v == "" {
			t.Fatalf("cannot find the %s in the template", name)
		}
	}
	return x
}

func testConfig(t *testing.T) Config {
	t.Helper()
	ctx, err := cdkContext()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := ConfigFromContext(func(k string) any { return ctx[k] })
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestTable(t *testing.T) {
	tpl, j := template(t)
	def := schema.Table
	check(t, "table key, billing, stream, TTL, retention", func() {
		tpl.HasResource(jsii.String("AWS::DynamoDB::GlobalTable"), &map[string]any{
			"DeletionPolicy":      "Retain",
			"UpdateReplacePolicy": "Retain",
			"Properties": assertions.Match_ObjectLike(&map[string]any{
				"KeySchema":               []any{obj{"AttributeName": def.PartitionKey, "KeyType": "HASH"}},
				"BillingMode":             "PAY_PER_REQUEST",
				"StreamSpecification":     obj{"StreamViewType": def.StreamView},
				"TimeToLiveSpecification": obj{"AttributeName": def.TTLAttribute, "Enabled": true},
				"Replicas": assertions.Match_ArrayWith(&[]any{assertions.Match_ObjectLike(&map[string]any{
					"DeletionProtectionEnabled":        true,
					"PointInTimeRecoverySpecification": obj{"PointInTimeRecoveryEnabled": true},
				})}),
			}),
		})
	})
	wantSame(t, "stream view type", def.StreamView, "NEW_AND_OLD_IMAGES")

	_, table := only(t, j, "AWS::DynamoDB::GlobalTable", nil)
	var want []obj
	for _, ix := range def.Indexes {
		want = append(want, obj{
			"IndexName":  ix.Name,
			"KeySchema":  []any{obj{"AttributeName": ix.PartitionKey, "KeyType": "HASH"}},
			"Projection": obj{"ProjectionType": string(ix.Projection)},
		})
	}
	wantSame(t, "global secondary indexes (exactly schema.Table's)", table["GlobalSecondaryIndexes"], want)
	if !strings.Contains(fmt.Sprint(table["GlobalSecondaryIndexes"]), schema.IndexLeaseOwner) ||
		strings.Contains(fmt.Sprint(table["GlobalSecondaryIndexes"]), schema.AttrLeaseExpires) {
		t.Errorf("want the %s index and no index keyed on %s", schema.IndexLeaseOwner, schema.AttrLeaseExpires)
	}
	if strings.Contains(fmt.Sprint(table["GlobalSecondaryIndexes"]), schema.LegacyIndexRegistry) {
		t.Errorf("the legacy %s index is kept only on request", schema.LegacyIndexRegistry)
	}

	// The first deploy of a stack that has the legacy index keeps it: CloudFormation
	// then creates only the new index (one GSI creation per update is allowed).
	_, lj := synthWith(t, map[string]any{ctxLegacyIndex: "true"})
	_, legacy := only(t, lj, "AWS::DynamoDB::GlobalTable", nil)
	ix := schema.LegacyRegistryIndex
	want = append(want, obj{
		"IndexName":  ix.Name,
		"KeySchema":  []any{obj{"AttributeName": ix.PartitionKey, "KeyType": "HASH"}},
		"Projection": obj{"ProjectionType": string(ix.Projection)},
	})
	wantSame(t, "global secondary indexes with "+ctxLegacyIndex, legacy["GlobalSecondaryIndexes"], want)
}

func TestStreamEventSource(t *testing.T) {
	tpl, j := template(t)
	x := findIDs(t, j)
	check(t, "event source settings", func() {
		tpl.HasResourceProperties(jsii.String("AWS::Lambda::EventSourceMapping"), assertions.Match_ObjectLike(&map[string]any{
			"FunctionName":                   ref(x.reconciler),
			"EventSourceArn":                 getAtt(x.table, "StreamArn"),
			"StartingPosition":               "LATEST",
			"BatchSize":                      100,
			"MaximumBatchingWindowInSeconds": 0,
			"BisectBatchOnFunctionError":     true,
			"MaximumRetryAttempts":           5,
			"MaximumRecordAgeInSeconds":      3600,
			"FunctionResponseTypes":          []any{"ReportBatchItemFailures"},
		}))
	})
	check(t, "exactly one event source mapping", func() {
		tpl.ResourceCountIs(jsii.String("AWS::Lambda::EventSourceMapping"), jsii.Number(1))
	})

	_, esm := only(t, j, "AWS::Lambda::EventSourceMapping", nil)
	// The filters, as parsed JSON, equal the shared patterns, in order.
	got, _ := path(esm, "FilterCriteria", "Filters").([]any)
	want := filters.JSON()
	if len(got) != len(want) {
		t.Fatalf("filters: got %d, want %d", len(got), len(want))
	}
	for i, f := range got {
		pattern, _ := path(f, "Pattern").(string)
		var g, w any
		if err := json.Unmarshal([]byte(pattern), &g); err != nil {
			t.Errorf("filter %d: %v", i, err)
		}
		if err := json.Unmarshal([]byte(want[i]), &w); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(g, w) {
			t.Errorf("filter %d:\n got %s\nwant %s", i, pattern, want[i])
		}
	}

	// On failure: a topic (the design has no SQS), never a queue.
	r := j["Resources"].(obj)[x.failureTopic].(obj)
	if r["Type"] != "AWS::SNS::Topic" {
		t.Errorf("on-failure destination is a %v, want AWS::SNS::Topic", r["Type"])
	}
	if n := len(resources(j, "AWS::SQS::Queue")); n != 0 {
		t.Errorf("the stack has %d SQS queues, want none", n)
	}
}

func TestReconcilerFunction(t *testing.T) {
	tpl, j := template(t)
	x := findIDs(t, j)
	check(t, "runtime, architecture, handler, memory, timeout, VPC", func() {
		tpl.HasResourceProperties(jsii.String("AWS::Lambda::Function"), assertions.Match_ObjectLike(&map[string]any{
			"Runtime":       "provided.al2023",
			"Architectures": []any{"arm64"},
			"Handler":       "bootstrap",
			"MemorySize":    256,
			"Timeout":       30,
			"VpcConfig": obj{
				"SecurityGroupIds": []any{getAtt(x.reconcilerSG, "GroupId")},
				"SubnetIds":        assertions.Match_AnyValue(),
			},
		}))
	})
	_, fn := only(t, j, "AWS::Lambda::Function", func(p obj) bool { return p["Handler"] == "bootstrap" })
	wantSame(t, "reconciler environment", withoutTracing(path(fn, "Environment", "Variables")), obj{
		schema.EnvTable:                ref(x.table),
		schema.EnvWakeupSecretARN:      ref(x.secret),
		schema.EnvClusterARN:           getAtt(x.cluster, "Arn"),
		schema.EnvSkewMargin:           "2s",
		schema.EnvSweepPeriod:          seconds(sweepPeriodSeconds),
		schema.EnvRebalance:            "on",
		schema.EnvRebalanceTolerance:   "0.1",
		schema.EnvRebalanceMaxFraction: "0.1",
		schema.EnvRebalanceCooling:     "5m",
		schema.EnvRebalanceMinInterval: "5s",
		schema.EnvRebalanceSettle:      "15s",
	})
	// In private subnets only.
	for _, s := range path(fn, "VpcConfig", "SubnetIds").([]any) {
		if id, _ := path(s, "Ref").(string); !strings.Contains(id, "Private") {
			t.Errorf("reconciler subnet %v is not private", s)
		}
	}
	if timeout := path(fn, "Timeout").(float64); timeout >= sweepPeriodSeconds {
		t.Errorf("timeout %vs must be shorter than the sweep period %ds", timeout, sweepPeriodSeconds)
	}
}

func TestNetwork(t *testing.T) {
	tpl, j := template(t)
	x := findIDs(t, j)
	// The workers' ingress: the wakeup port, from the reconciler's group (wakeups)
	// and from the workers' own group (handoff calls between workers), nothing else.
	if in := path(j, "Resources", x.workerSG, "Properties", "SecurityGroupIngress"); in != nil {
		t.Errorf("worker security group has inline ingress %v", in)
	}
	var rules []obj
	for _, r := range resources(j, "AWS::EC2::SecurityGroupIngress") {
		p := r["Properties"].(obj)
		if same(p["GroupId"], getAtt(x.workerSG, "GroupId")) {
			rules = append(rules, p)
		}
	}
	wantRule := func(source string) obj {
		return obj{"IpProtocol": "tcp", "FromPort": schema.DefaultWakeupPort, "ToPort": schema.DefaultWakeupPort,
			"SourceSecurityGroupId": getAtt(source, "GroupId")}
	}
	var got []obj
	for _, r := range rules {
		got = append(got, obj{"IpProtocol": r["IpProtocol"], "FromPort": r["FromPort"], "ToPort": r["ToPort"],
			"SourceSecurityGroupId": r["SourceSecurityGroupId"]})
		for _, k := range []string{"CidrIp", "CidrIpv6", "SourcePrefixListId"} {
			if r[k] != nil {
				t.Errorf("worker ingress has %s %v", k, r[k])
			}
		}
	}
	slices.SortFunc(got, func(a, b obj) int { return strings.Compare(fmt.Sprint(a), fmt.Sprint(b)) })
	want := []obj{wantRule(x.reconcilerSG), wantRule(x.workerSG)}
	slices.SortFunc(want, func(a, b obj) int { return strings.Compare(fmt.Sprint(a), fmt.Sprint(b)) })
	wantSame(t, "worker ingress rules (reconciler wakeups, worker-to-worker handoffs)", got, want)
	// The reconciler may only reach the workers' wakeup port and HTTPS.
	check(t, "reconciler egress to workers", func() {
		tpl.HasResourceProperties(jsii.String("AWS::EC2::SecurityGroupEgress"), &map[string]any{
			"GroupId":                    getAtt(x.reconcilerSG, "GroupId"),
			"DestinationSecurityGroupId": getAtt(x.workerSG, "GroupId"),
			"IpProtocol":                 "tcp",
			"FromPort":                   schema.DefaultWakeupPort,
			"ToPort":                     schema.DefaultWakeupPort,
			"Description":                assertions.Match_AnyValue(),
		})
	})
	wantSame(t, "reconciler inline egress", path(j, "Resources", x.reconcilerSG, "Properties", "SecurityGroupEgress"), []any{obj{
		"CidrIp": "0.0.0.0/0", "IpProtocol": "tcp", "FromPort": 443, "ToPort": 443,
		"Description": path(j, "Resources", x.reconcilerSG, "Properties", "SecurityGroupEgress", 0, "Description"),
	}})
	// One NAT gateway per AZ by default, so an AZ outage cuts off only its own
	// workers; natGateways=1 shares one (TestOneNatGateway).
	check(t, "a NAT gateway per AZ", func() { tpl.ResourceCountIs(jsii.String("AWS::EC2::NatGateway"), jsii.Number(2)) })
	check(t, "DynamoDB gateway endpoint", func() {
		tpl.HasResourceProperties(jsii.String("AWS::EC2::VPCEndpoint"), assertions.Match_ObjectLike(&map[string]any{
			"VpcEndpointType": "Gateway",
		}))
	})
	_, ep := only(t, j, "AWS::EC2::VPCEndpoint", nil)
	if s := fmt.Sprint(ep["ServiceName"]); !strings.Contains(s, "dynamodb") {
		t.Errorf("gateway endpoint service %s, want dynamodb", s)
	}
}

// statement is one IAM statement of a role, with its actions as a list.
type statement struct {
	policy    string
	actions   []string
	resource  any
	condition any
}

func roleStatements(j obj) map[string][]statement {
	out := map[string][]statement{}
	add := func(role, policy string, doc any) {
		stmts, _ := path(doc, "Statement").([]any)
		for _, s := range stmts {
			var acts []string
			switch a := path(s, "Action").(type) {
			case string:
				acts = []string{a}
			case []any:
				for _, x := range a {
					acts = append(acts, fmt.Sprint(x))
				}
			}
			out[role] = append(out[role], statement{policy: policy, actions: acts, resource: path(s, "Resource"), condition: path(s, "Condition")})
		}
	}
	for id, r := range resources(j, "AWS::IAM::Policy") {
		for _, role := range path(r, "Properties", "Roles").([]any) {
			roleID, _ := path(role, "Ref").(string)
			add(roleID, id, path(r, "Properties", "PolicyDocument"))
		}
	}
	for id, r := range resources(j, "AWS::IAM::Role") {
		for _, p := range asSlice(path(r, "Properties", "Policies")) {
			add(id, fmt.Sprint(path(p, "PolicyName")), path(p, "PolicyDocument"))
		}
	}
	return out
}

func asSlice(v any) []any { s, _ := v.([]any); return s }

func actionSet(stmts []statement) []string {
	var out []string
	for _, s := range stmts {
		out = append(out, s.actions...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func TestIAMLeastPrivilege(t *testing.T) {
	_, j := template(t)
	x := findIDs(t, j)
	roles := roleStatements(j)

	for role, stmts := range roles {
		for _, s := range stmts {
			for _, a := range s.actions {
				if a == "*" || strings.HasSuffix(a, ":*") || strings.Contains(a, "*") {
					t.Errorf("role %s, policy %s: wildcard action %q", role, s.policy, a)
				}
			}
		}
	}
	for id, r := range resources(j, "AWS::IAM::Role") {
		for _, arn := range asSlice(path(r, "Properties", "ManagedPolicyArns")) {
			if b, _ := json.Marshal(arn); strings.Contains(string(b), "FullAccess") {
				t.Errorf("role %s has managed policy %s", id, b)
			}
		}
	}

	wantSame(t, "worker task role actions", actionSet(roles[x.taskRole]), []string{
		"dynamodb:BatchGetItem", "dynamodb:DeleteItem", "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:Query", "dynamodb:Scan",
		"dynamodb:UpdateItem", "kinesis:ListShards", "kinesis:PutRecord", "kinesis:PutRecords", "secretsmanager:DescribeSecret", "secretsmanager:GetSecretValue",
		"xray:PutSpans", "xray:PutSpansForIndexing",
	})
	wantSame(t, "reconciler actions", actionSet(roles[x.reconcilerRole]), []string{
		"dynamodb:BatchGetItem", "dynamodb:DeleteItem", "dynamodb:DescribeStream", "dynamodb:GetItem", "dynamodb:GetRecords",
		"dynamodb:GetShardIterator", "dynamodb:ListStreams", "dynamodb:PutItem", "dynamodb:Query", "dynamodb:Scan",
		"dynamodb:UpdateItem", "secretsmanager:GetSecretValue", "sns:Publish", "xray:PutSpans", "xray:PutSpansForIndexing",
	})
	for _, a := range actionSet(roles[x.execRole]) {
		switch a {
		case "ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer",
			"ecr:GetAuthorizationToken", "logs:CreateLogStream", "logs:PutLogEvents",
			"secretsmanager:GetSecretValue", "secretsmanager:DescribeSecret":
		default:
			t.Errorf("task execution role: unexpected action %s", a)
		}
	}

	// Table actions reach the table and its indexes, nothing else; the secret and
	// the topic are named exactly.
	tableAndIndexes := []any{getAtt(x.table, "Arn"),
		obj{"Fn::Join": []any{"", []any{getAtt(x.table, "Arn"), "/index/*"}}}}
	for _, role := range []string{x.taskRole, x.reconcilerRole} {
		for _, s := range roles[role] {
			switch {
			case slices.Contains(s.actions, "dynamodb:GetItem"):
				wantSame(t, role+" table resources", s.resource, tableAndIndexes)
			case slices.Contains(s.actions, "dynamodb:PutItem") && role == x.taskRole:
				// Worker items only: TestWorkerPutDeleteOnlyWorkerItems checks it.
			case slices.Contains(s.actions, "dynamodb:UpdateItem") && role == x.taskRole:
				// Its three kinds of key only: TestWorkerUpdateOnlyItsKeys checks it.
			case slices.Contains(s.actions, "dynamodb:Scan") && role == x.taskRole:
				// The start-up pass scans the base table, never an index.
				wantSame(t, role+" Scan actions", s.actions, []string{"dynamodb:Scan"})
				wantSame(t, role+" Scan resource", s.resource, getAtt(x.table, "Arn"))
			case slices.Contains(s.actions, "dynamodb:GetRecords"):
				wantSame(t, role+" stream resources", s.resource, getAtt(x.table, "StreamArn"))
			case slices.Contains(s.actions, "secretsmanager:GetSecretValue") && role == x.taskRole:
				// Connection secrets: only those under the prefix knob, and their
				// allowed-hosts tag (DescribeSecret) on exactly the same secrets.
				if b, _ := json.Marshal(s.resource); !strings.Contains(string(b), ":secret:sockfleet/connections/*") {
					t.Errorf("worker secret resource %s, want secrets under sockfleet/connections/", b)
				}
				if !slices.Contains(s.actions, "secretsmanager:DescribeSecret") {
					t.Errorf("worker secret actions %v: want DescribeSecret beside GetSecretValue", s.actions)
				}
			case slices.Contains(s.actions, "secretsmanager:GetSecretValue"):
				wantSame(t, role+" secret resource", s.resource, ref(x.secret))
			case slices.Contains(s.actions, "kinesis:PutRecords") && role == x.taskRole:
				// The default sink's stream: TestKinesisSinkCreated checks the resource.
			case slices.Contains(s.actions, "sns:Publish"):
				wantSame(t, role+" topic resource", s.resource, ref(x.failureTopic))
			case slices.Contains(s.actions, "xray:PutSpans"):
				// X-Ray has no resource-level permissions (tracing.go).
				wantSame(t, role+" X-Ray actions", s.actions, xrayWrite)
				wantSame(t, role+" X-Ray resource", s.resource, "*")
			default:
				t.Errorf("%s: unexpected statement %v", role, s.actions)
			}
		}
	}
}

func TestEventRules(t *testing.T) {
	tpl, j := template(t)
	x := findIDs(t, j)
	check(t, "task-stopped rule", func() {
		tpl.HasResourceProperties(jsii.String("AWS::Events::Rule"), assertions.Match_ObjectLike(&map[string]any{
			"EventPattern": obj{
				"source":      []any{"aws.ecs"},
				"detail-type": []any{"ECS Task State Change"},
				// The worker container's exit, not the task's desiredStatus.
				"detail": obj{
					"clusterArn": []any{getAtt(x.cluster, "Arn")},
					"containers": obj{"name": []any{schema.WorkerContainer}, "lastStatus": []any{"STOPPED"}},
				},
			},
			"Targets": []any{assertions.Match_ObjectLike(&map[string]any{"Arn": getAtt(x.reconciler, "Arn")})},
		}))
	})
	// Nothing about the task's own status: a task asked to stop still runs a draining worker.
	_, stopped := only(t, j, "AWS::Events::Rule", func(p obj) bool { return p["EventPattern"] != nil })
	if d, _ := path(stopped, "EventPattern", "detail").(obj); d == nil || d["lastStatus"] != nil || d["desiredStatus"] != nil {
		t.Errorf("task-stopped rule detail %v: want it to match the worker container, not the task's status", d)
	}
	_, sweep := only(t, j, "AWS::Events::Rule", func(p obj) bool { return p["ScheduleExpression"] != nil })
	wantSame(t, "sweep schedule", sweep["ScheduleExpression"], "rate(1 minute)")
	wantSame(t, "sweep target", path(sweep, "Targets", 0, "Arn"), getAtt(x.reconciler, "Arn"))
	var input any
	if err := json.Unmarshal([]byte(fmt.Sprint(path(sweep, "Targets", 0, "Input"))), &input); err != nil {
		t.Fatalf("sweep input: %v", err)
	}
	wantSame(t, "sweep input", input, obj{schema.SweepInputKey: schema.SweepInputValue})
	check(t, "two rules", func() { tpl.ResourceCountIs(jsii.String("AWS::Events::Rule"), jsii.Number(2)) })
}

func TestWorkerTask(t *testing.T) {
	tpl, j := template(t)
	x := findIDs(t, j)
	cfg := testConfig(t)
	check(t, "task platform and container", func() {
		tpl.HasResourceProperties(jsii.String("AWS::ECS::TaskDefinition"), assertions.Match_ObjectLike(&map[string]any{
			"RequiresCompatibilities": []any{"FARGATE"},
			"RuntimePlatform":         obj{"CpuArchitecture": "ARM64", "OperatingSystemFamily": "LINUX"},
			"ContainerDefinitions": assertions.Match_ArrayWith(&[]any{assertions.Match_ObjectLike(&map[string]any{
				"Name":      schema.WorkerContainer, // the name the task-stopped rule and handler match
				"Essential": true,
				"HealthCheck": assertions.Match_ObjectLike(&map[string]any{
					"Command": []any{"CMD", "/worker", "healthcheck"},
				}),
				"StopTimeout":  120,
				"PortMappings": []any{assertions.Match_ObjectLike(&map[string]any{"ContainerPort": schema.DefaultWakeupPort, "Protocol": "tcp"})},
				"Secrets":      []any{obj{"Name": schema.EnvWakeupSecret, "ValueFrom": ref(x.secret)}},
			})}),
		}))
	})
	_, task := only(t, j, "AWS::ECS::TaskDefinition", nil)
	env := map[string]any{}
	for _, e := range asSlice(path(task, "ContainerDefinitions", 0, "Environment")) {
		env[fmt.Sprint(path(e, "Name"))] = path(e, "Value")
	}
	wantSame(t, "worker environment", env, obj{
		schema.EnvTable:          ref(x.table),
		schema.EnvListenAddr:     ":8080",
		schema.EnvMaxConnections: fmt.Sprint(cfg.MaxConnectionsPerTask),
		schema.EnvLease:          seconds(cfg.LeaseSeconds),
		schema.EnvRenewInterval:  seconds(cfg.RenewSeconds),
		schema.EnvRenewDeadline:  "7s",
		schema.EnvSkewMargin:     "2s",
		schema.EnvDrainTimeout:   "60s",
		schema.EnvServiceName:    stackName + "-worker",
		// Tracing (on by default): spans to the collector sidecar.
		"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318",
		"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
		"OTEL_SERVICE_NAME":           "sockfleet-worker",
		// The default sink: the stream the stack creates.
		schema.EnvSink: obj{"Fn::Join": []any{"", []any{"kinesis:", ref(onlyID(t, j, "AWS::Kinesis::Stream"))}}},
	})
	if _, ok := env[schema.EnvWakeupSecret]; ok {
		t.Errorf("the wakeup secret is a plain environment variable")
	}
	// The secret reaches the task through the execution role, not the task role.
	var execCanRead bool
	for _, s := range roleStatements(j)[x.execRole] {
		execCanRead = execCanRead || slices.Contains(s.actions, "secretsmanager:GetSecretValue") && same(s.resource, ref(x.secret))
	}
	if !execCanRead {
		t.Errorf("the task execution role cannot read the wakeup secret")
	}
	// The drain must end well before ECS's SIGKILL.
	if drainTimeoutSeconds >= stopTimeoutSeconds {
		t.Errorf("drain %ds is not shorter than stopTimeout %ds", drainTimeoutSeconds, stopTimeoutSeconds)
	}
}

func TestWorkerService(t *testing.T) {
	tpl, j := template(t)
	x := findIDs(t, j)
	cfg := testConfig(t)
	check(t, "cluster with Container Insights", func() {
		tpl.HasResourceProperties(jsii.String("AWS::ECS::Cluster"), &map[string]any{
			"ClusterSettings": []any{obj{"Name": "containerInsights", "Value": "enabled"}},
		})
	})
	check(t, "service", func() {
		tpl.HasResourceProperties(jsii.String("AWS::ECS::Service"), assertions.Match_ObjectLike(&map[string]any{
			"Cluster":     ref(x.cluster),
			"LaunchType":  "FARGATE",
			"ServiceName": stackName + "-worker",
			// Autoscaling owns the count: a DesiredCount here would be re-applied
			// by every stack update, resetting a scaled-out fleet.
			"DesiredCount": assertions.Match_Absent(),
			"DeploymentConfiguration": assertions.Match_ObjectLike(&map[string]any{
				"DeploymentCircuitBreaker": obj{"Enable": true, "Rollback": true},
				"MinimumHealthyPercent":    100,
			}),
			"NetworkConfiguration": obj{"AwsvpcConfiguration": assertions.Match_ObjectLike(&map[string]any{
				"AssignPublicIp": "DISABLED",
			})},
		}))
	})
	check(t, "scaling bounds", func() {
		tpl.HasResourceProperties(jsii.String("AWS::ApplicationAutoScaling::ScalableTarget"), assertions.Match_ObjectLike(&map[string]any{
			"MinCapacity": cfg.DesiredCount, "MaxCapacity": cfg.MaxCount,
		}))
	})
	for metric, value := range map[string]int{"ECSServiceAverageCPUUtilization": 60, "ECSServiceAverageMemoryUtilization": 70} {
		check(t, metric+" scaling", func() {
			tpl.HasResourceProperties(jsii.String("AWS::ApplicationAutoScaling::ScalingPolicy"), assertions.Match_ObjectLike(&map[string]any{
				"TargetTrackingScalingPolicyConfiguration": assertions.Match_ObjectLike(&map[string]any{
					"PredefinedMetricSpecification": obj{"PredefinedMetricType": metric},
					"TargetValue":                   value,
				}),
			}))
		})
	}
	check(t, "connections-per-task scaling", func() {
		tpl.HasResourceProperties(jsii.String("AWS::ApplicationAutoScaling::ScalingPolicy"), assertions.Match_ObjectLike(&map[string]any{
			"TargetTrackingScalingPolicyConfiguration": assertions.Match_ObjectLike(&map[string]any{
				"CustomizedMetricSpecification": obj{
					"Namespace":  schema.MetricNamespace,
					"MetricName": schema.MetricOwned,
					"Statistic":  "Average",
					"Dimensions": []any{obj{"Name": schema.MetricDimService, "Value": stackName + "-worker"}},
				},
				"TargetValue": cfg.ConnectionsTarget(),
			}),
		}))
	})
}

func TestOperations(t *testing.T) {
	tpl, j := template(t)
	x := findIDs(t, j)
	alarms := map[string]*map[string]any{
		"orphaned connections": {
			"Namespace": schema.MetricNamespace, "MetricName": schema.MetricOrphanedOldest,
			"Statistic": "Maximum", "Threshold": 120, "TreatMissingData": "breaching",
		},
		"reconciler errors": {
			"Namespace": "AWS/Lambda", "MetricName": "Errors",
			"Dimensions": []any{obj{"Name": "FunctionName", "Value": ref(x.reconciler)}},
		},
		"stream iterator age": {
			"Namespace": "AWS/Lambda", "MetricName": "IteratorAge",
			"Dimensions": []any{obj{"Name": "FunctionName", "Value": ref(x.reconciler)}},
		},
		"self-fences": {
			"Namespace": schema.MetricNamespace, "MetricName": schema.MetricSelfFences,
			"Dimensions": []any{obj{"Name": schema.MetricDimService, "Value": stackName + "-worker"}},
		},
		"idle connections": {
			"Namespace": schema.MetricNamespace, "MetricName": schema.MetricIdle, "Statistic": "Maximum", "Period": 60,
			"Threshold": 0, "ComparisonOperator": "GreaterThanThreshold", "EvaluationPeriods": 3, "DatapointsToAlarm": 3,
			"TreatMissingData": "notBreaching",
			"Dimensions":       []any{obj{"Name": schema.MetricDimService, "Value": stackName + "-worker"}},
		},
		"failed stream batches": {
			"Namespace": "AWS/SNS", "MetricName": "NumberOfMessagesPublished",
			"Dimensions": []any{obj{"Name": "TopicName", "Value": getAtt(x.failureTopic, "TopicName")}},
		},
		"reconciler throttles": {
			"Namespace": "AWS/Lambda", "MetricName": "Throttles", "Statistic": "Sum", "Threshold": 1,
			"ComparisonOperator": "GreaterThanOrEqualToThreshold",
			"Dimensions":         []any{obj{"Name": "FunctionName", "Value": ref(x.reconciler)}},
		},
	}
	for name, props := range alarms {
		(*props)["AlarmActions"] = assertions.Match_AnyValue()
		check(t, name+" alarm", func() {
			tpl.HasResourceProperties(jsii.String("AWS::CloudWatch::Alarm"), assertions.Match_ObjectLike(props))
		})
	}
	check(t, "dashboard", func() { tpl.ResourceCountIs(jsii.String("AWS::CloudWatch::Dashboard"), jsii.Number(1)) })
	for id, value := range map[string]any{
		"TableName": ref(x.table), "ClusterName": ref(x.cluster), "FunctionName": ref(x.reconciler),
	} {
		check(t, "output "+id, func() {
			tpl.HasOutput(jsii.String(id), &map[string]any{"Value": value})
		})
	}
}

// The worker image's build context is the repository root: what must never enter it.
func TestDockerignore(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Fields(string(b))
	for _, want := range []string{"cdk.out", "infra", ".tools", ".local", ".git"} {
		if !slices.Contains(lines, want) {
			t.Errorf(".dockerignore does not exclude %s", want)
		}
	}
}

// README, "Deploying to AWS": what a fresh account and the deployer's machine need,
// and every context knob in the table.
func TestReadmeDeploying(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	start := strings.Index(doc, "\n## Deploying to AWS\n")
	if start < 0 {
		t.Fatal(`README.md has no "## Deploying to AWS" section`)
	}
	section := doc[start+1:]
	if end := strings.Index(section[3:], "\n## "); end >= 0 {
		section = section[:end+3]
	}
	for _, want := range []string{
		"aws iam create-service-linked-role --aws-service-name ecs.amazonaws.com",
		"Unable to assume the service linked role",
		"linux/arm64", "docker buildx ls", "### First deploy",
		".tools/deploy/node_modules/.bin/cdk bootstrap",
	} {
		if !strings.Contains(section, want) {
			t.Errorf("README, Deploying to AWS, does not say %q", want)
		}
	}
	ctx, err := cdkContext()
	if err != nil {
		t.Fatal(err)
	}
	for key := range ctx {
		if !strings.HasPrefix(key, "@") && !strings.Contains(section, "| `"+key+"` |") {
			t.Errorf("README's knob table has no row for %s", key)
		}
	}
}

// workerEnv returns the worker container's environment.
func workerEnv(t *testing.T, j obj) obj {
	t.Helper()
	_, task := only(t, j, "AWS::ECS::TaskDefinition", nil)
	env := obj{}
	for _, e := range asSlice(path(task, "ContainerDefinitions", 0, "Environment")) {
		env[fmt.Sprint(path(e, "Name"))] = path(e, "Value")
	}
	return env
}

// kinesisStatements returns, per role, the statements granting Kinesis actions.
func kinesisStatements(j obj) map[string][]statement {
	out := map[string][]statement{}
	for role, stmts := range roleStatements(j) {
		for _, s := range stmts {
			for _, a := range s.actions {
				if strings.HasPrefix(a, "kinesis:") {
					out[role] = append(out[role], s)
					break
				}
			}
		}
	}
	return out
}

var kinesisWrite = []string{"kinesis:ListShards", "kinesis:PutRecord", "kinesis:PutRecords"}

// workerLogOptions returns the worker container's awslogs options.
func workerLogOptions(t *testing.T, j obj) obj {
	t.Helper()
	_, task := only(t, j, "AWS::ECS::TaskDefinition", nil)
	if d := path(task, "ContainerDefinitions", 0, "LogConfiguration", "LogDriver"); d != "awslogs" {
		t.Fatalf("worker log driver %v, want awslogs", d)
	}
	opts, _ := path(task, "ContainerDefinitions", 0, "LogConfiguration", "Options").(obj)
	return opts
}

// kinesisStream=stdout: no stream, workers write to stdout, no role may touch
// Kinesis, and the log driver blocks rather than drop lines the worker counted as
// delivered.
func TestKinesisSinkOff(t *testing.T) {
	tpl, j := synthWith(t, map[string]any{ctxKinesisStream: "stdout"})
	check(t, "no stream", func() { tpl.ResourceCountIs(jsii.String("AWS::Kinesis::Stream"), jsii.Number(0)) })
	if v, ok := workerEnv(t, j)[schema.EnvSink]; ok {
		t.Errorf("%s set to %v without a stream", schema.EnvSink, v)
	}
	if k := kinesisStatements(j); len(k) != 0 {
		t.Errorf("Kinesis grants without a stream: %v", k)
	}
	opts := workerLogOptions(t, j)
	wantSame(t, "log delivery mode with the stdout sink", opts["mode"], "blocking")
	if v, ok := opts["max-buffer-size"]; ok {
		t.Errorf("max-buffer-size %v with the stdout sink: a buffer that drops when full loses messages", v)
	}
}

// The default (cdk.json, kinesisStream=create): an on-demand encrypted stream,
// written by the task role only, named in the worker's SOCKFLEET_SINK; the log
// pipe carries diagnostics only, so it never blocks the worker.
func TestKinesisSinkCreated(t *testing.T) {
	tpl, j := template(t)
	x := findIDs(t, j)
	check(t, "on-demand encrypted stream", func() {
		tpl.HasResourceProperties(jsii.String("AWS::Kinesis::Stream"), assertions.Match_ObjectLike(&map[string]any{
			"StreamModeDetails":    obj{"StreamMode": "ON_DEMAND"},
			"StreamEncryption":     obj{"EncryptionType": "KMS", "KeyId": "alias/aws/kinesis"},
			"RetentionPeriodHours": 24,
		}))
	})
	id, _ := only(t, j, "AWS::Kinesis::Stream", nil)
	wantSame(t, "worker sink", workerEnv(t, j)[schema.EnvSink], obj{"Fn::Join": []any{"", []any{"kinesis:", ref(id)}}})
	grants := kinesisStatements(j)
	if len(grants) != 1 || grants[x.taskRole] == nil {
		t.Fatalf("Kinesis grants %v; want the task role's only", grants)
	}
	wantSame(t, "task role Kinesis actions", actionSet(grants[x.taskRole]), kinesisWrite)
	for _, s := range grants[x.taskRole] {
		wantSame(t, "task role Kinesis resource", s.resource, getAtt(id, "Arn"))
	}
	opts := workerLogOptions(t, j)
	wantSame(t, "log delivery mode with the Kinesis sink", []any{opts["mode"], opts["max-buffer-size"]}, []any{"non-blocking", "26214400b"})
}

// kinesisStream=ARN: an existing stream, no new one; the grant names that ARN.
func TestKinesisSinkExisting(t *testing.T) {
	const arn = "arn:aws:kinesis:eu-west-1:123456789012:stream/feed"
	tpl, j := synthWith(t, map[string]any{ctxKinesisStream: arn})
	x := findIDs(t, j)
	check(t, "no new stream", func() { tpl.ResourceCountIs(jsii.String("AWS::Kinesis::Stream"), jsii.Number(0)) })
	wantSame(t, "worker sink", workerEnv(t, j)[schema.EnvSink], "kinesis:"+arn)
	grants := kinesisStatements(j)
	if len(grants) != 1 || grants[x.taskRole] == nil {
		t.Fatalf("Kinesis grants %v; want the task role's only", grants)
	}
	wantSame(t, "task role Kinesis actions", actionSet(grants[x.taskRole]), kinesisWrite)
	for _, s := range grants[x.taskRole] {
		wantSame(t, "task role Kinesis resource", s.resource, arn)
	}
}

// kmsStatements returns, per role, the statements granting KMS actions.
func kmsStatements(j obj) map[string][]statement {
	out := map[string][]statement{}
	for role, stmts := range roleStatements(j) {
		for _, s := range stmts {
			for _, a := range s.actions {
				if strings.HasPrefix(a, "kms:") {
					out[role] = append(out[role], s)
					break
				}
			}
		}
	}
	return out
}

// Customer-managed keys: an imported stream's (producers need kms:GenerateDataKey)
// and the connection secrets' (GetSecretValue needs kms:Decrypt), each exactly that
// action on exactly that key, for the task role only. Without the knobs no role
// has any KMS action.
func TestKMSKeys(t *testing.T) {
	_, d := template(t)
	if k := kmsStatements(d); len(k) != 0 {
		t.Errorf("KMS grants without customer-managed keys: %v", k)
	}
	const (
		stream     = "arn:aws:kinesis:eu-west-1:123456789012:stream/feed"
		streamKey  = "arn:aws:kms:eu-west-1:123456789012:key/11111111-2222-3333-4444-555555555555"
		secretsKey = "arn:aws:kms:eu-west-1:123456789012:key/66666666-7777-8888-9999-000000000000"
	)
	_, j := synthWith(t, map[string]any{ctxKinesisStream: stream, "kinesisKmsKeyArn": streamKey, "connectionSecretsKmsKeyArn": secretsKey})
	x := findIDs(t, j)
	grants := kmsStatements(j)
	if len(grants) != 1 || grants[x.taskRole] == nil {
		t.Fatalf("KMS grants %v; want the task role's only", grants)
	}
	var got []obj
	for _, s := range grants[x.taskRole] {
		got = append(got, obj{"actions": s.actions, "resource": s.resource, "condition": s.condition})
	}
	slices.SortFunc(got, func(a, b obj) int { return strings.Compare(fmt.Sprint(a), fmt.Sprint(b)) })
	wantSame(t, "task role KMS statements", got, []obj{
		{"actions": []string{"kms:Decrypt"}, "resource": secretsKey, "condition": nil},
		{"actions": []string{"kms:GenerateDataKey"}, "resource": streamKey, "condition": nil},
	})
}

// The worker's PutItem and DeleteItem reach only worker items (WORKER#…): one
// statement, on the base table, with the dynamodb:LeadingKeys condition.
func TestWorkerPutDeleteOnlyWorkerItems(t *testing.T) {
	_, j := template(t)
	x := findIDs(t, j)
	var found []statement
	for _, s := range roleStatements(j)[x.taskRole] {
		if slices.Contains(s.actions, "dynamodb:PutItem") || slices.Contains(s.actions, "dynamodb:DeleteItem") {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("task role statements with PutItem or DeleteItem: %+v; want one", found)
	}
	s := found[0]
	acts := slices.Sorted(slices.Values(s.actions))
	wantSame(t, "actions", acts, []string{"dynamodb:DeleteItem", "dynamodb:PutItem"})
	wantSame(t, "resource", s.resource, getAtt(x.table, "Arn"))
	wantSame(t, "condition", s.condition, obj{
		"ForAllValues:StringLike": obj{"dynamodb:LeadingKeys": []any{schema.WorkerPrefix + "*"}},
	})
}

// natGateways=1: one NAT gateway shared by both AZs.
func TestOneNatGateway(t *testing.T) {
	tpl, _ := synthWith(t, map[string]any{"natGateways": 1})
	check(t, "one NAT gateway", func() { tpl.ResourceCountIs(jsii.String("AWS::EC2::NatGateway"), jsii.Number(1)) })
}

// dependsOnRoutes returns the default routes among a resource's DependsOn.
func dependsOnRoutes(j obj, id string) []string {
	var out []string
	for _, d := range asSlice(path(j, "Resources", id, "DependsOn")) {
		dep := fmt.Sprint(d)
		if path(j, "Resources", dep, "Type") == "AWS::EC2::Route" {
			out = append(out, dep)
		}
	}
	slices.Sort(out)
	return out
}

// The service starts no task before the private subnets' default routes exist, as
// the Lambda in the same subnets does not.
func TestServiceWaitsForRoutes(t *testing.T) {
	_, j := template(t)
	x := findIDs(t, j)
	var private []string
	for id, r := range resources(j, "AWS::EC2::Route") {
		if strings.Contains(id, "Private") && path(r, "Properties", "DestinationCidrBlock") == "0.0.0.0/0" {
			private = append(private, id)
		}
	}
	slices.Sort(private)
	if len(private) == 0 {
		t.Fatal("no default routes of private subnets in the template")
	}
	wantSame(t, "the reconciler's route dependencies", dependsOnRoutes(j, x.reconciler), private)
	wantSame(t, "the worker service's route dependencies", dependsOnRoutes(j, x.service), private)
}

// An alarm when fewer worker tasks run than the service wants, from Container
// Insights' per-service counts.
func TestWorkersBelowDesiredAlarm(t *testing.T) {
	_, j := template(t)
	x := findIDs(t, j)
	_, alarm := only(t, j, "AWS::CloudWatch::Alarm", func(p obj) bool {
		for _, m := range asSlice(p["Metrics"]) {
			if path(m, "Expression") == "desired - running" {
				return true
			}
		}
		return false
	})
	byID := map[string]any{}
	for _, m := range asSlice(alarm["Metrics"]) {
		byID[fmt.Sprint(path(m, "Id"))] = m
	}
	for id, name := range map[string]string{"desired": "DesiredTaskCount", "running": "RunningTaskCount"} {
		m := byID[id]
		wantSame(t, id+" metric", path(m, "MetricStat", "Metric"), obj{
			"Namespace": "ECS/ContainerInsights", "MetricName": name,
			"Dimensions": []any{
				obj{"Name": "ClusterName", "Value": ref(x.cluster)},
				obj{"Name": "ServiceName", "Value": getAtt(x.service, "Name")},
			},
		})
		wantSame(t, id+" period", path(m, "MetricStat", "Period"), 60)
	}
	wantSame(t, "threshold", []any{alarm["ComparisonOperator"], alarm["Threshold"], alarm["EvaluationPeriods"], alarm["DatapointsToAlarm"]},
		[]any{"GreaterThanThreshold", 0, 5, 5})
	if alarm["AlarmActions"] == nil {
		t.Error("the alarm notifies nobody")
	}
}

// The worker's UpdateItem reaches only connection, worker and connect-quota items:
// one statement, on the base table, with the dynamodb:LeadingKeys condition; no
// other task role statement grants UpdateItem.
func TestWorkerUpdateOnlyItsKeys(t *testing.T) {
	_, j := template(t)
	x := findIDs(t, j)
	var found []statement
	for _, s := range roleStatements(j)[x.taskRole] {
		if slices.Contains(s.actions, "dynamodb:UpdateItem") {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("task role statements with UpdateItem: %+v; want one", found)
	}
	s := found[0]
	wantSame(t, "actions", s.actions, []string{"dynamodb:UpdateItem"})
	wantSame(t, "resource", s.resource, getAtt(x.table, "Arn"))
	wantSame(t, "condition", s.condition, obj{
		"ForAllValues:StringLike": obj{"dynamodb:LeadingKeys": []any{
			schema.ConnPrefix + "*", schema.WorkerPrefix + "*", schema.QuotaPrefix + "*"}},
	})
}
