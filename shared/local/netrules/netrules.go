// Package netrules reads the network rules of the synthesized CloudFormation template
// (cdk.out/<Stack>.template.json, what `cdk deploy` would deploy) so the local fleet
// can enforce them: which security groups exist, what each admits, and which group
// each of the fleet's workloads is in.
//
// It reads:
//   - AWS::EC2::SecurityGroup resources, with their inline SecurityGroupIngress and
//     SecurityGroupEgress rules;
//   - AWS::EC2::SecurityGroupIngress and AWS::EC2::SecurityGroupEgress resources;
//   - the workloads: the worker is the one AWS::ECS::Service (its groups from
//     NetworkConfiguration.AwsvpcConfiguration.SecurityGroups, its listener port from
//     the PortMappings of the container named schema.WorkerContainer in its task
//     definition); the reconciler is the one AWS::Lambda::Function with a VpcConfig
//     (its groups from VpcConfig.SecurityGroupIds).
//
// Decide answers as AWS would for a TCP call from one group to another inside the
// VPC: allowed only if an egress rule of the caller's group and an ingress rule of the
// callee's group both admit it, and it names the rules that did (or the one missing).
//
// Guarantees and non-guarantees:
//   - A rule names its peer by a group of this template, by a group id from outside it
//     (kept as written, matching no workload), or by an IPv4 CIDR. A CIDR rule admits
//     a workload's call only if it covers the whole CIDR block of the template's VPC
//     (0.0.0.0/0 always does): a task's address within the VPC is not known before it
//     runs, so a narrower block is taken as not admitting it. With no VPC in the
//     template (an imported one), only 0.0.0.0/0 does.
//   - IPv6 rules and prefix-list rules are read but never admit anything: the fleet's
//     calls are IPv4 between addresses of the VPC.
//   - Network ACLs, routes and the DynamoDB gateway endpoint are not modelled; only
//     security groups.
//   - A value given by an intrinsic function other than Ref or Fn::GetAtt of a group
//     (an Fn::ImportValue, a parameter) is an error rather than a guess.
package netrules

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/sockfleet/sockfleet/shared/local/cdkout"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/sockfleet/sockfleet/shared/schema"
)

// DefaultStack is the stack the CDK app defines (infra/main.go).
const DefaultStack = "Sockfleet"

// The workloads the fleet runs, by the names Workloads uses.
const (
	Worker     = "worker"     // the ECS service's tasks
	Reconciler = "reconciler" // the Lambda function in the VPC
)

// Direction is which way a rule admits traffic.
type Direction string

const (
	Ingress Direction = "ingress"
	Egress  Direction = "egress"
)

// Rule is one security group rule.
type Rule struct {
	Direction Direction
	// Group is the logical id of the security group the rule belongs to.
	Group string
	// Peer is the other side: the logical id of a group of this template, or a group
	// id from outside it; empty for a CIDR rule.
	Peer string
	CIDR string // IPv4 CIDR (CidrIp), or IPv6 (CidrIpv6); empty for a group rule
	// PrefixList is a DestinationPrefixListId or SourcePrefixListId.
	PrefixList string
	Protocol   string // as written: "tcp", "6", "-1", …
	// FromPort and ToPort bound the ports; both -1 (or absent) with protocol -1.
	FromPort, ToPort int
	// Source says where the rule is written: the logical id of an
	// AWS::EC2::SecurityGroupIngress/Egress resource, or Group.SecurityGroupIngress[i].
	Source      string
	Description string
}

// String renders the rule as a person reads it, e.g.
// "ingress to WorkerSecurityGroup1F6ED7AB tcp 8080 from ReconcilerSecurityGroup… (resource X)".
func (r Rule) String() string {
	peer := r.Peer
	switch {
	case r.CIDR != "":
		peer = r.CIDR
	case r.PrefixList != "":
		peer = "prefix list " + r.PrefixList
	}
	dir := "from"
	if r.Direction == Egress {
		dir = "to"
	}
	return fmt.Sprintf("%s of %s: %s %s %s (%s)", r.Direction, r.Group, r.ports(), dir, peer, r.Source)
}

func (r Rule) ports() string {
	if r.allProtocols() {
		return "all traffic"
	}
	if r.FromPort == r.ToPort {
		return fmt.Sprintf("%s %d", r.Protocol, r.FromPort)
	}
	return fmt.Sprintf("%s %d-%d", r.Protocol, r.FromPort, r.ToPort)
}

func (r Rule) allProtocols() bool { return r.Protocol == "-1" || strings.EqualFold(r.Protocol, "all") }

// AdmitsTCP reports whether the rule's protocol and ports cover TCP port.
func (r Rule) AdmitsTCP(port int) bool {
	if r.allProtocols() {
		return true
	}
	if !strings.EqualFold(r.Protocol, "tcp") && r.Protocol != "6" {
		return false
	}
	return r.FromPort <= port && port <= r.ToPort
}

// Group is one security group of the template.
type Group struct {
	ID          string // logical id
	Description string
}

// Workload is one of the fleet's workloads as the template deploys it.
type Workload struct {
	Name     string   // Worker or Reconciler
	Resource string   // the logical id of the ECS service or Lambda function
	Groups   []string // the security groups it is in
	// Ports are the ports it listens on (the worker's container port mappings); the
	// reconciler listens on none.
	Ports []int
}

// Template is the network part of a synthesized template.
type Template struct {
	Path      string // where it was read from; empty if parsed from bytes
	Groups    map[string]Group
	Rules     []Rule
	Workloads map[string]Workload
	vpcCIDR   netip.Prefix // the template's VPC's block; invalid if none
}

// Load reads and parses the template at path.
func Load(path string) (*Template, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read the template: %w", err)
	}
	t, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("template %s: %w", path, err)
	}
	t.Path = path
	return t, nil
}

// LoadDefault finds (cdkout.Find, from the working folder up) and loads the
// synthesized template.
func LoadDefault() (*Template, error) {
	p, err := cdkout.Find(".")
	if err != nil {
		return nil, err
	}
	return Load(p)
}

type resource struct {
	Type       string                     `json:"Type"`
	Properties map[string]json.RawMessage `json:"Properties"`
}

// Parse reads the network rules and workloads out of a template.
func Parse(data []byte) (*Template, error) {
	var doc struct {
		Resources map[string]resource `json:"Resources"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("parse: %w", err)
	}
	if len(doc.Resources) == 0 {
		return nil, errors.New("no Resources")
	}
	t := &Template{Groups: map[string]Group{}, Workloads: map[string]Workload{}}
	ids := make([]string, 0, len(doc.Resources))
	for id := range doc.Resources {
		ids = append(ids, id)
	}
	sort.Strings(ids) // rules and errors in a stable order
	var errs []error
	for _, id := range ids {
		r := doc.Resources[id]
		switch r.Type {
		case "AWS::EC2::SecurityGroup":
			errs = append(errs, t.addGroup(id, r.Properties))
		case "AWS::EC2::SecurityGroupIngress":
			errs = append(errs, t.addRule(Ingress, "", id, r.Properties))
		case "AWS::EC2::SecurityGroupEgress":
			errs = append(errs, t.addRule(Egress, "", id, r.Properties))
		case "AWS::EC2::VPC":
			var cidr string
			if raw, ok := r.Properties["CidrBlock"]; ok && json.Unmarshal(raw, &cidr) == nil {
				if p, err := netip.ParsePrefix(cidr); err == nil {
					t.vpcCIDR = p
				}
			}
		}
	}
	errs = append(errs, t.findWorkloads(doc.Resources, ids))
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	for _, r := range t.Rules {
		if _, ok := t.Groups[r.Group]; !ok && !strings.HasPrefix(r.Group, "sg-") {
			return nil, fmt.Errorf("%s: rule of %s, which is no security group of the template", r.Source, r.Group)
		}
	}
	return t, nil
}

func (t *Template) addGroup(id string, props map[string]json.RawMessage) error {
	var desc string
	if raw, ok := props["GroupDescription"]; ok {
		_ = json.Unmarshal(raw, &desc) // a token instead of a string: no description
	}
	t.Groups[id] = Group{ID: id, Description: desc}
	var errs []error
	for _, d := range []struct {
		key string
		dir Direction
	}{{"SecurityGroupIngress", Ingress}, {"SecurityGroupEgress", Egress}} {
		raw, ok := props[d.key]
		if !ok {
			continue
		}
		var inline []map[string]json.RawMessage
		if err := json.Unmarshal(raw, &inline); err != nil {
			errs = append(errs, fmt.Errorf("%s: %s: %w", id, d.key, err))
			continue
		}
		for i, p := range inline {
			errs = append(errs, t.addRule(d.dir, id, fmt.Sprintf("%s.%s[%d]", id, d.key, i), p))
		}
	}
	return errors.Join(errs...)
}

// addRule adds a rule written inline in group (source names it), or as a resource of
// its own (group is empty: the GroupId property names it).
func (t *Template) addRule(dir Direction, group, source string, p map[string]json.RawMessage) error {
	r := Rule{Direction: dir, Group: group, Source: source, FromPort: -1, ToPort: -1}
	fail := func(err error) error { return fmt.Errorf("%s: %w", source, err) }
	var err error
	if group == "" {
		if r.Group, err = groupRef(p["GroupId"]); err != nil {
			return fail(fmt.Errorf("GroupId: %w", err))
		}
	}
	if r.Protocol, err = scalar(p["IpProtocol"]); err != nil || r.Protocol == "" {
		return fail(fmt.Errorf("IpProtocol: %v", cmpErr(err, "missing")))
	}
	for _, f := range []struct {
		key string
		to  *int
	}{{"FromPort", &r.FromPort}, {"ToPort", &r.ToPort}} {
		if _, ok := p[f.key]; !ok {
			continue
		}
		s, err := scalar(p[f.key])
		if err != nil {
			return fail(fmt.Errorf("%s: %w", f.key, err))
		}
		if *f.to, err = strconv.Atoi(s); err != nil {
			return fail(fmt.Errorf("%s %q: %w", f.key, s, err))
		}
	}
	if !r.allProtocols() && (r.FromPort < 0 || r.ToPort < r.FromPort) {
		if r.FromPort == -1 && r.ToPort == -1 {
			r.FromPort, r.ToPort = 0, 65535 // tcp or udp with -1: every port
		} else {
			return fail(fmt.Errorf("ports %d-%d", r.FromPort, r.ToPort))
		}
	}
	if raw, ok := p["Description"]; ok {
		_ = json.Unmarshal(raw, &r.Description)
	}
	peerKey, cidrKeys, plKey := "SourceSecurityGroupId", []string{"CidrIp", "CidrIpv6"}, "SourcePrefixListId"
	if dir == Egress {
		peerKey, cidrKeys, plKey = "DestinationSecurityGroupId", []string{"CidrIp", "CidrIpv6"}, "DestinationPrefixListId"
	}
	switch {
	case p[peerKey] != nil:
		if r.Peer, err = groupRef(p[peerKey]); err != nil {
			return fail(fmt.Errorf("%s: %w", peerKey, err))
		}
	case p[cidrKeys[0]] != nil || p[cidrKeys[1]] != nil:
		key := cidrKeys[0]
		if p[key] == nil {
			key = cidrKeys[1]
		}
		if r.CIDR, err = scalar(p[key]); err != nil {
			return fail(fmt.Errorf("%s: %w", key, err))
		}
		if _, err := netip.ParsePrefix(r.CIDR); err != nil {
			return fail(fmt.Errorf("%s: %w", key, err))
		}
	case p[plKey] != nil:
		if r.PrefixList, err = scalar(p[plKey]); err != nil {
			r.PrefixList = string(p[plKey]) // a token: kept as written, it admits nothing anyway
		}
	case p["SourceSecurityGroupName"] != nil:
		return fail(errors.New("SourceSecurityGroupName (EC2-Classic or default VPC) is not supported"))
	default:
		return fail(errors.New("no peer: want a security group, a CIDR or a prefix list"))
	}
	t.Rules = append(t.Rules, r)
	return nil
}

func cmpErr(err error, msg string) string {
	if err != nil {
		return err.Error()
	}
	return msg
}

// scalar reads a string or a number.
func scalar(raw json.RawMessage) (string, error) {
	if raw == nil {
		return "", errors.New("missing")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var n json.Number
	if json.Unmarshal(raw, &n) == nil {
		return n.String(), nil
	}
	return "", fmt.Errorf("want a string or a number, not %.100s", raw)
}

// groupRef reads a reference to a security group: {"Fn::GetAtt": [id, "GroupId"]},
// {"Ref": id}, or a literal group id.
func groupRef(raw json.RawMessage) (string, error) {
	if raw == nil {
		return "", errors.New("missing")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var fn struct {
		GetAtt []string `json:"Fn::GetAtt"`
		Ref    string   `json:"Ref"`
	}
	if err := json.Unmarshal(raw, &fn); err != nil {
		return "", fmt.Errorf("want a group reference, not %.100s", raw)
	}
	switch {
	case len(fn.GetAtt) == 2 && fn.GetAtt[1] == "GroupId":
		return fn.GetAtt[0], nil
	case fn.Ref != "":
		return fn.Ref, nil
	}
	return "", fmt.Errorf("want Fn::GetAtt [group, GroupId] or Ref, not %.100s", raw)
}

func groupRefs(raw json.RawMessage) ([]string, error) {
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, fmt.Errorf("want a list of groups, not %.100s", raw)
	}
	var out []string
	for _, r := range list {
		g, err := groupRef(r)
		if err != nil {
			return nil, err
		}
		out = append(out, g)
	}
	if len(out) == 0 {
		return nil, errors.New("no security groups")
	}
	return out, nil
}

// findWorkloads finds the worker service and the reconciler function.
func (t *Template) findWorkloads(res map[string]resource, ids []string) error {
	var services, functions []string
	for _, id := range ids {
		switch r := res[id]; r.Type {
		case "AWS::ECS::Service":
			services = append(services, id)
		case "AWS::Lambda::Function":
			if r.Properties["VpcConfig"] != nil {
				functions = append(functions, id)
			}
		}
	}
	var errs []error
	if len(services) != 1 {
		errs = append(errs, fmt.Errorf("want exactly one AWS::ECS::Service (the workers), found %d: %v", len(services), services))
	} else if w, err := workerWorkload(res, services[0]); err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", services[0], err))
	} else {
		t.Workloads[Worker] = w
	}
	if len(functions) != 1 {
		errs = append(errs, fmt.Errorf("want exactly one AWS::Lambda::Function with a VpcConfig (the reconciler), found %d: %v", len(functions), functions))
	} else {
		var vpc struct {
			SecurityGroupIds json.RawMessage `json:"SecurityGroupIds"`
		}
		if err := json.Unmarshal(res[functions[0]].Properties["VpcConfig"], &vpc); err != nil {
			errs = append(errs, fmt.Errorf("%s: VpcConfig: %w", functions[0], err))
		} else if gs, err := groupRefs(vpc.SecurityGroupIds); err != nil {
			errs = append(errs, fmt.Errorf("%s: VpcConfig.SecurityGroupIds: %w", functions[0], err))
		} else {
			t.Workloads[Reconciler] = Workload{Name: Reconciler, Resource: functions[0], Groups: gs}
		}
	}
	return errors.Join(errs...)
}

func workerWorkload(res map[string]resource, id string) (Workload, error) {
	w := Workload{Name: Worker, Resource: id}
	var nc struct {
		Awsvpc struct {
			SecurityGroups json.RawMessage `json:"SecurityGroups"`
		} `json:"AwsvpcConfiguration"`
	}
	props := res[id].Properties
	if err := json.Unmarshal(props["NetworkConfiguration"], &nc); err != nil || nc.Awsvpc.SecurityGroups == nil {
		return w, errors.New("no NetworkConfiguration.AwsvpcConfiguration.SecurityGroups")
	}
	var err error
	if w.Groups, err = groupRefs(nc.Awsvpc.SecurityGroups); err != nil {
		return w, fmt.Errorf("NetworkConfiguration.AwsvpcConfiguration.SecurityGroups: %w", err)
	}
	task, err := groupRef(props["TaskDefinition"]) // a Ref, as a group's is
	if err != nil {
		return w, fmt.Errorf("TaskDefinition: %w", err)
	}
	td, ok := res[task]
	if !ok || td.Type != "AWS::ECS::TaskDefinition" {
		return w, fmt.Errorf("TaskDefinition %s: no such AWS::ECS::TaskDefinition", task)
	}
	var containers []struct {
		Name         string `json:"Name"`
		PortMappings []struct {
			ContainerPort json.RawMessage `json:"ContainerPort"`
			Protocol      string          `json:"Protocol"`
		} `json:"PortMappings"`
	}
	if err := json.Unmarshal(td.Properties["ContainerDefinitions"], &containers); err != nil {
		return w, fmt.Errorf("%s: ContainerDefinitions: %w", task, err)
	}
	for _, c := range containers {
		if c.Name != schema.WorkerContainer {
			continue
		}
		for _, pm := range c.PortMappings {
			if pm.Protocol != "" && !strings.EqualFold(pm.Protocol, "tcp") {
				continue
			}
			s, err := scalar(pm.ContainerPort)
			if err != nil {
				return w, fmt.Errorf("%s: container %s: ContainerPort: %w", task, c.Name, err)
			}
			p, err := strconv.Atoi(s)
			if err != nil {
				return w, fmt.Errorf("%s: container %s: ContainerPort %q: %w", task, c.Name, s, err)
			}
			w.Ports = append(w.Ports, p)
		}
		return w, nil
	}
	return w, fmt.Errorf("%s: no container named %q", task, schema.WorkerContainer)
}

// ListenerPort is the one TCP port workload listens on, as the template maps it.
func (t *Template) ListenerPort(workload string) (int, error) {
	w, ok := t.Workloads[workload]
	if !ok {
		return 0, fmt.Errorf("no workload %q in the template", workload)
	}
	if len(w.Ports) != 1 {
		return 0, fmt.Errorf("%s (%s): want one TCP port mapping, found %v", workload, w.Resource, w.Ports)
	}
	return w.Ports[0], nil
}

// Decision is the answer for one call.
type Decision struct {
	Allowed bool
	// Egress and Ingress are the rules that admitted the call, when they did.
	Egress, Ingress *Rule
	// Missing says what no rule admits, when the call is denied: "egress", "ingress"
	// or both. With Missing, CallerGroup, CalleeGroup and Port describe the rule that
	// would admit it.
	Missing                  []Direction
	CallerGroup, CalleeGroup string
	Port                     int
}

// String explains the decision, naming the rules that admitted the call or the rule
// that is missing.
func (d Decision) String() string {
	if d.Allowed {
		return fmt.Sprintf("allowed by %s and %s", d.Egress, d.Ingress)
	}
	var parts []string
	for _, m := range d.Missing {
		switch m {
		case Ingress:
			parts = append(parts, fmt.Sprintf("no ingress rule of %s admits tcp %d from %s", d.CalleeGroup, d.Port, d.CallerGroup))
		case Egress:
			parts = append(parts, fmt.Sprintf("no egress rule of %s admits tcp %d to %s", d.CallerGroup, d.Port, d.CalleeGroup))
		}
	}
	return "denied: " + strings.Join(parts, "; ")
}

// Decide says whether a TCP call from a member of callerGroup to a member of
// calleeGroup on port is admitted: an egress rule of callerGroup and an ingress rule
// of calleeGroup must both admit it.
func (t *Template) Decide(callerGroup, calleeGroup string, port int) Decision {
	d := Decision{CallerGroup: callerGroup, CalleeGroup: calleeGroup, Port: port}
	d.Egress = t.match(Egress, callerGroup, calleeGroup, port)
	d.Ingress = t.match(Ingress, calleeGroup, callerGroup, port)
	if d.Egress == nil {
		d.Missing = append(d.Missing, Egress)
	}
	if d.Ingress == nil {
		d.Missing = append(d.Missing, Ingress)
	}
	d.Allowed = len(d.Missing) == 0
	return d
}

// DecideWorkloads is Decide between two workloads, each possibly in several groups:
// as on AWS, the call is admitted if one of the caller's groups lets it out and one
// of the callee's lets it in. A denial names the groups the template lists first.
func (t *Template) DecideWorkloads(caller, callee string, port int) (Decision, error) {
	from, ok := t.Workloads[caller]
	if !ok {
		return Decision{}, fmt.Errorf("no workload %q in the template", caller)
	}
	to, ok := t.Workloads[callee]
	if !ok {
		return Decision{}, fmt.Errorf("no workload %q in the template", callee)
	}
	// Egress and ingress are judged separately: any of the caller's groups may let
	// the call out, and any of the callee's may let it in.
	d := Decision{CallerGroup: from.Groups[0], CalleeGroup: to.Groups[0], Port: port}
	for _, g := range from.Groups {
		for _, h := range to.Groups {
			if d.Egress == nil {
				if r := t.match(Egress, g, h, port); r != nil {
					d.Egress, d.CallerGroup = r, g
				}
			}
			if d.Ingress == nil {
				if r := t.match(Ingress, h, g, port); r != nil {
					d.Ingress, d.CalleeGroup = r, h
				}
			}
		}
	}
	if d.Egress == nil {
		d.Missing = append(d.Missing, Egress)
	}
	if d.Ingress == nil {
		d.Missing = append(d.Missing, Ingress)
	}
	d.Allowed = len(d.Missing) == 0
	return d, nil
}

// match finds a rule of direction on group admitting TCP port with peer.
func (t *Template) match(dir Direction, group, peer string, port int) *Rule {
	for i := range t.Rules {
		r := &t.Rules[i]
		if r.Direction != dir || r.Group != group || !r.AdmitsTCP(port) {
			continue
		}
		switch {
		case r.Peer != "":
			if r.Peer == peer {
				return r
			}
		case r.CIDR != "":
			if t.coversVPC(r.CIDR) {
				return r
			}
		}
	}
	return nil
}

// coversVPC reports whether an IPv4 CIDR covers every address the VPC may give.
func (t *Template) coversVPC(cidr string) bool {
	p, err := netip.ParsePrefix(cidr)
	if err != nil || !p.Addr().Is4() {
		return false
	}
	if p.Bits() == 0 {
		return true
	}
	return t.vpcCIDR.IsValid() && p.Bits() <= t.vpcCIDR.Bits() && p.Contains(t.vpcCIDR.Addr())
}

// IngressOf lists the ingress rules of the workload's groups.
func (t *Template) IngressOf(workload string) []Rule {
	w := t.Workloads[workload]
	var out []Rule
	for _, r := range t.Rules {
		if r.Direction == Ingress && slices.Contains(w.Groups, r.Group) {
			out = append(out, r)
		}
	}
	return out
}

// WorkloadsIn lists the workloads in group, by name.
func (t *Template) WorkloadsIn(group string) []string {
	var out []string
	for name, w := range t.Workloads {
		if slices.Contains(w.Groups, group) {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// Peers lists the workloads on the other side of r (the callers an ingress rule may
// admit, the callees an egress rule may), by name.
func (t *Template) Peers(r Rule) []string {
	if r.Peer != "" {
		return t.WorkloadsIn(r.Peer)
	}
	var out []string
	if r.CIDR != "" && t.coversVPC(r.CIDR) {
		for name := range t.Workloads {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// Without returns a copy of t without the rule written at source (see Rule.Source).
func (t *Template) Without(source string) *Template {
	c := *t
	c.Rules = slices.DeleteFunc(slices.Clone(t.Rules), func(r Rule) bool { return r.Source == source })
	return &c
}

// With returns a copy of t with r added.
func (t *Template) With(r Rule) *Template {
	c := *t
	c.Rules = append(slices.Clone(t.Rules), r)
	return &c
}
