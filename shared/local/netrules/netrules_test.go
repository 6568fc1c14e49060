package netrules

import (
	"encoding/json"
	"fmt"
	"github.com/sockfleet/sockfleet/shared/local/cdkout"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sockfleet/sockfleet/shared/schema"
)

// The fixture's logical ids: testdata/sockfleet.template.json is the network part of
// a synthesized stack.
const (
	workerSG     = "WorkerSecurityGroup5529CF0B"
	reconcilerSG = "ReconcilerSecurityGroup9C195047"
	wakeupIn     = "WorkerSecurityGroupfromSockfleetReconcilerSecurityGroup369420FB8080494E5E3A"
	wakeupOut    = "ReconcilerSecurityGrouptoSockfleetWorkerSecurityGroup5489633480801F5A8A56"
)

func fixture(t *testing.T) *Template {
	t.Helper()
	tm, err := Load(filepath.Join("testdata", "sockfleet.template.json"))
	if err != nil {
		t.Fatal(err)
	}
	return tm
}

func TestParseFixture(t *testing.T) {
	tm := fixture(t)
	if len(tm.Groups) != 2 || tm.Groups[workerSG].ID != workerSG || tm.Groups[reconcilerSG].ID != reconcilerSG {
		t.Errorf("groups %v", tm.Groups)
	}
	w, r := tm.Workloads[Worker], tm.Workloads[Reconciler]
	if w.Resource != "WorkerService99815FA9" || !slices.Equal(w.Groups, []string{workerSG}) || !slices.Equal(w.Ports, []int{8080}) {
		t.Errorf("worker %+v", w)
	}
	if r.Resource != "Reconciler066B3B2B" || !slices.Equal(r.Groups, []string{reconcilerSG}) || len(r.Ports) != 0 {
		t.Errorf("reconciler %+v", r)
	}
	if p, err := tm.ListenerPort(Worker); p != 8080 || err != nil {
		t.Errorf("ListenerPort(worker) = %d, %v", p, err)
	}
	if _, err := tm.ListenerPort(Reconciler); err == nil {
		t.Error("ListenerPort(reconciler): no error, but it listens on nothing")
	}
	// Two inline egress rules, one ingress and one egress resource.
	var got []string
	for _, r := range tm.Rules {
		got = append(got, r.String())
	}
	want := []string{
		"egress of " + reconcilerSG + ": tcp 443 to 0.0.0.0/0 (" + reconcilerSG + ".SecurityGroupEgress[0])",
		"egress of " + reconcilerSG + ": tcp 8080 to " + workerSG + " (" + wakeupOut + ")",
		"egress of " + workerSG + ": all traffic to 0.0.0.0/0 (" + workerSG + ".SecurityGroupEgress[0])",
		"ingress of " + workerSG + ": tcp 8080 from " + reconcilerSG + " (" + wakeupIn + ")",
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("rules:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if in := tm.IngressOf(Worker); len(in) != 1 || in[0].Source != wakeupIn || in[0].Description != "wakeup calls" {
		t.Errorf("IngressOf(worker) = %v", in)
	}
	if ws := tm.WorkloadsIn(reconcilerSG); !slices.Equal(ws, []string{Reconciler}) {
		t.Errorf("WorkloadsIn(reconciler group) = %v", ws)
	}
	for _, tc := range []struct {
		r    Rule
		want []string
	}{
		{tm.IngressOf(Worker)[0], []string{Reconciler}},
		{Rule{CIDR: "0.0.0.0/0"}, []string{Reconciler, Worker}},
		{Rule{CIDR: "10.0.1.0/24"}, nil},
		{Rule{Peer: "sg-0123456789"}, nil},
	} {
		if got := tm.Peers(tc.r); !slices.Equal(got, tc.want) {
			t.Errorf("Peers(%s) = %v, want %v", tc.r, got, tc.want)
		}
	}
}

func TestDecide(t *testing.T) {
	tm := fixture(t)
	peer := Rule{Direction: Ingress, Group: workerSG, Peer: workerSG, Protocol: "tcp", FromPort: 8080, ToPort: 8080, Source: "WorkerToWorker"}
	withPeer := tm.With(peer)
	for _, tc := range []struct {
		name           string
		tm             *Template
		caller, callee string
		port           int
		egress, in     string // the sources of the admitting rules, or "" where one is missing
	}{
		{"wakeup", tm, reconcilerSG, workerSG, 8080, wakeupOut, wakeupIn},
		{"wakeup on another port", tm, reconcilerSG, workerSG, 8081, "", ""},
		{"handoff: workers may go out, not in", tm, workerSG, workerSG, 8080, workerSG + ".SecurityGroupEgress[0]", ""},
		{"handoff with the peer rule", withPeer, workerSG, workerSG, 8080, workerSG + ".SecurityGroupEgress[0]", "WorkerToWorker"},
		{"worker to reconciler", tm, workerSG, reconcilerSG, 8080, workerSG + ".SecurityGroupEgress[0]", ""},
		{"wakeup without its ingress", tm.Without(wakeupIn), reconcilerSG, workerSG, 8080, wakeupOut, ""},
		{"wakeup without its egress", tm.Without(wakeupOut), reconcilerSG, workerSG, 8080, "", wakeupIn},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := tc.tm.Decide(tc.caller, tc.callee, tc.port)
			src := func(r *Rule) string {
				if r == nil {
					return ""
				}
				return r.Source
			}
			if src(d.Egress) != tc.egress || src(d.Ingress) != tc.in {
				t.Errorf("egress %q, ingress %q; want %q, %q", src(d.Egress), src(d.Ingress), tc.egress, tc.in)
			}
			if d.Allowed != (tc.egress != "" && tc.in != "") {
				t.Errorf("Allowed = %v (%s)", d.Allowed, d)
			}
			for dir, want := range map[Direction]string{Egress: tc.egress, Ingress: tc.in} {
				if slices.Contains(d.Missing, dir) != (want == "") {
					t.Errorf("Missing %v: %s wrongly", d.Missing, dir)
				}
			}
			// The denial names the missing rule: its groups and port.
			if !d.Allowed {
				s := d.String()
				if !strings.Contains(s, tc.caller) || !strings.Contains(s, tc.callee) || !strings.Contains(s, fmt.Sprint(tc.port)) {
					t.Errorf("%q does not name the rule that is missing", s)
				}
			}
		})
	}
	// The originals are untouched by With and Without.
	if len(tm.Rules) != 4 || len(withPeer.Rules) != 5 {
		t.Errorf("rules: %d and %d, want 4 and 5", len(tm.Rules), len(withPeer.Rules))
	}
}

func TestDecideWorkloads(t *testing.T) {
	tm := fixture(t)
	d, err := tm.DecideWorkloads(Reconciler, Worker, 8080)
	if err != nil || !d.Allowed || d.Ingress.Source != wakeupIn {
		t.Errorf("reconciler -> worker: %v, %v", d, err)
	}
	d, err = tm.DecideWorkloads(Worker, Worker, 8080)
	if err != nil || d.Allowed || !slices.Equal(d.Missing, []Direction{Ingress}) || d.CallerGroup != workerSG || d.CalleeGroup != workerSG {
		t.Errorf("worker -> worker: %+v, %v", d, err)
	}
	if _, err := tm.DecideWorkloads("sweeper", Worker, 8080); err == nil {
		t.Error("an unknown workload: no error")
	}
	// A workload in two groups: one group's rule is enough.
	two := tm.With(Rule{Direction: Ingress, Group: reconcilerSG, Peer: workerSG, Protocol: "tcp", FromPort: 8080, ToPort: 8080, Source: "X"})
	w := two.Workloads[Worker]
	w.Groups = []string{workerSG, reconcilerSG}
	two.Workloads = map[string]Workload{Worker: w, Reconciler: two.Workloads[Reconciler]}
	if d, _ := two.DecideWorkloads(Worker, Worker, 8080); !d.Allowed || d.Ingress.Source != "X" || d.CalleeGroup != reconcilerSG {
		t.Errorf("worker in two groups -> itself: %v", d)
	}
	if len(tm.Workloads[Worker].Groups) != 1 {
		t.Error("the original's workloads changed")
	}
}

func TestRuleMatching(t *testing.T) {
	tm := fixture(t) // its VPC is 10.0.0.0/16
	for _, tc := range []struct {
		rule Rule
		port int
		want bool
	}{
		{Rule{Protocol: "tcp", FromPort: 8000, ToPort: 9000, Peer: reconcilerSG}, 8080, true},
		{Rule{Protocol: "tcp", FromPort: 8000, ToPort: 9000, Peer: reconcilerSG}, 9001, false},
		{Rule{Protocol: "6", FromPort: 8080, ToPort: 8080, Peer: reconcilerSG}, 8080, true},
		{Rule{Protocol: "udp", FromPort: 8080, ToPort: 8080, Peer: reconcilerSG}, 8080, false},
		{Rule{Protocol: "-1", FromPort: -1, ToPort: -1, Peer: reconcilerSG}, 8080, true},
		{Rule{Protocol: "tcp", FromPort: 8080, ToPort: 8080, Peer: "sg-0123456789"}, 8080, false},
		{Rule{Protocol: "tcp", FromPort: 8080, ToPort: 8080, CIDR: "0.0.0.0/0"}, 8080, true},
		{Rule{Protocol: "tcp", FromPort: 8080, ToPort: 8080, CIDR: "10.0.0.0/8"}, 8080, true},
		{Rule{Protocol: "tcp", FromPort: 8080, ToPort: 8080, CIDR: "10.0.0.0/16"}, 8080, true},
		{Rule{Protocol: "tcp", FromPort: 8080, ToPort: 8080, CIDR: "10.0.1.0/24"}, 8080, false}, // part of the VPC
		{Rule{Protocol: "tcp", FromPort: 8080, ToPort: 8080, CIDR: "192.168.0.0/16"}, 8080, false},
		{Rule{Protocol: "tcp", FromPort: 8080, ToPort: 8080, CIDR: "::/0"}, 8080, false},
		{Rule{Protocol: "tcp", FromPort: 8080, ToPort: 8080, PrefixList: "pl-123"}, 8080, false},
	} {
		r := tc.rule
		r.Direction, r.Group, r.Source = Ingress, workerSG, "test"
		one := &Template{Groups: tm.Groups, Workloads: tm.Workloads, vpcCIDR: tm.vpcCIDR, Rules: []Rule{r}}
		if got := one.match(Ingress, workerSG, reconcilerSG, tc.port) != nil; got != tc.want {
			t.Errorf("%s on port %d: admits = %v, want %v", r, tc.port, got, tc.want)
		}
	}
}

func TestParseErrors(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "sockfleet.template.json"))
	if err != nil {
		t.Fatal(err)
	}
	type doc = map[string]any
	res := func(d doc, id string) doc { return d["Resources"].(doc)[id].(doc) }
	props := func(d doc, id string) doc { return res(d, id)["Properties"].(doc) }
	for _, tc := range []struct {
		name   string
		change func(d doc)
		want   string
	}{
		{"no service", func(d doc) { res(d, "WorkerService99815FA9")["Type"] = "AWS::ECS::Thing" }, "want exactly one AWS::ECS::Service"},
		{"no VPC function", func(d doc) { delete(props(d, "Reconciler066B3B2B"), "VpcConfig") },
			"want exactly one AWS::Lambda::Function with a VpcConfig"},
		{"two VPC functions", func(d doc) {
			props(d, "CustomVpcRestrictDefaultSGCustomResourceProviderHandlerDC833E5E")["VpcConfig"] = props(d, "Reconciler066B3B2B")["VpcConfig"]
		}, "with a VpcConfig (the reconciler), found 2"},
		{"an imported group", func(d doc) { props(d, wakeupIn)["SourceSecurityGroupId"] = doc{"Fn::ImportValue": "x"} },
			"SourceSecurityGroupId: want Fn::GetAtt"},
		{"a rule of no group", func(d doc) { props(d, wakeupIn)["GroupId"] = doc{"Ref": "Nothing"} }, "Nothing, which is no security group"},
		{"no worker container", func(d doc) {
			props(d, "WorkerTaskCBB1FEE3")["ContainerDefinitions"].([]any)[0].(doc)["Name"] = "sidecar"
		}, `no container named "worker"`},
		{"a bad port", func(d doc) { props(d, wakeupIn)["FromPort"] = "eighty" }, `FromPort "eighty"`},
		{"no protocol", func(d doc) { delete(props(d, wakeupIn), "IpProtocol") }, "IpProtocol: missing"},
		{"no peer", func(d doc) { delete(props(d, wakeupIn), "SourceSecurityGroupId") }, "no peer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var d doc
			if err := json.Unmarshal(raw, &d); err != nil {
				t.Fatal(err)
			}
			tc.change(d)
			bad, err := json.Marshal(d)
			if err != nil {
				t.Fatal(err)
			}
			_, err = Parse(bad)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Parse: %v, want an error with %q", err, tc.want)
			}
		})
	}
	if _, err := Parse([]byte(`{}`)); err == nil {
		t.Error("an empty template: no error")
	}
	if _, err := Parse([]byte(`{`)); err == nil {
		t.Error("bad JSON: no error")
	}
}

// TestSynthesizedTemplate checks the template `make synth` wrote, when there is one:
// it parses, and it admits every call the fleet's processes make to each other on
// AWS. Each call is one the code makes; a missing rule here is a deploy whose
// wakeups or handoffs would time out.
func TestSynthesizedTemplate(t *testing.T) {
	path, err := cdkout.Find(".")
	if err != nil {
		t.Skipf("no synthesized template (%v)", err)
	}
	tm, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	port, err := tm.ListenerPort(Worker)
	if err != nil {
		t.Fatal(err)
	}
	if port != schema.DefaultWakeupPort {
		t.Errorf("the worker's container port is %d, the worker listens on %d", port, schema.DefaultWakeupPort)
	}
	for _, c := range []struct{ what, caller, callee string }{
		{"the reconciler's wakeups of workers", Reconciler, Worker},
		{"workers' handoffs (/v1/handoff) to each other", Worker, Worker},
	} {
		d, err := tm.DecideWorkloads(c.caller, c.callee, port)
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed {
			t.Errorf("%s: %s", c.what, d)
		} else {
			t.Logf("%s: %s", c.what, d)
		}
	}
}
