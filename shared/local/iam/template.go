// Package iam enforces, on one machine, the IAM policies the CDK stack declares. It
// reads them from the synthesized CloudFormation template (cdk.out), never from a
// copy kept by hand, resolves the intrinsics in their Resource elements into local
// ARNs, and evaluates requests as AWS does: an explicit Deny wins, and an Allow needs
// a statement whose action, resource and condition all match. Proxy puts that in
// front of a local engine, so a process running as a role is refused what the role
// would be refused in AWS.
//
// Guarantees: a statement this package cannot read (an unknown intrinsic, a
// condition operator or key it does not implement) is an error when the policy is
// built, never a silent allow; a role with no statement allowing a call is denied.
//
// Non-guarantees: only identity-based policies attached to roles in the template
// are evaluated (no managed policies, resource policies, permission boundaries or
// SCPs: AWS-managed policies such as AWSLambdaBasicExecutionRole grant nothing the
// local engines serve); NotPrincipal and policy variables are not supported.
package iam

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
)

// Template is the part of a synthesized CloudFormation template this package reads.
type Template struct {
	Resources map[string]Resource
}

// Resource is one template resource.
type Resource struct {
	Type       string
	Properties map[string]any
}

// ParseTemplate decodes a template.
func ParseTemplate(data []byte) (*Template, error) {
	var t Template
	if err := json.Unmarshal(data, &t); err != nil {
		return nil, fmt.Errorf("parse template: %w", err)
	}
	if len(t.Resources) == 0 {
		return nil, errors.New("parse template: no Resources")
	}
	return &t, nil
}

// LoadTemplate reads and decodes the template at path.
func LoadTemplate(path string) (*Template, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load template: %w", err)
	}
	t, err := ParseTemplate(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// Roles lists the logical ids of the template's AWS::IAM::Role resources, sorted.
func (t *Template) Roles() []string {
	var ids []string
	for id, r := range t.Resources {
		if r.Type == "AWS::IAM::Role" {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// ofType lists the logical ids of resources of type typ, sorted.
func (t *Template) ofType(types ...string) []string {
	var ids []string
	for id, r := range t.Resources {
		if slices.Contains(types, r.Type) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// RawStatement is one statement of a role's policies as the template writes it,
// intrinsics unresolved.
type RawStatement struct {
	// Source names where it comes from: the policy's logical id (or the role's and
	// the inline policy's name) and the statement's index, e.g.
	// "WorkerTaskTaskRoleDefaultPolicy242C79D9#0".
	Source string
	Body   map[string]any
}

// Statements returns every statement that applies to the role with this logical
// id: those of AWS::IAM::Policy resources whose Roles name it, and its inline
// Policies, in a stable order.
func (t *Template) Statements(role string) ([]RawStatement, error) {
	r, ok := t.Resources[role]
	if !ok || r.Type != "AWS::IAM::Role" {
		return nil, fmt.Errorf("statements: %s is not an AWS::IAM::Role of the template", role)
	}
	var out []RawStatement
	add := func(source string, doc any) error {
		d, ok := doc.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: PolicyDocument is not an object", source)
		}
		sts := d["Statement"]
		if one, ok := sts.(map[string]any); ok {
			sts = []any{one}
		}
		list, ok := sts.([]any)
		if !ok {
			return fmt.Errorf("%s: Statement is not a list", source)
		}
		for i, s := range list {
			m, ok := s.(map[string]any)
			if !ok {
				return fmt.Errorf("%s#%d: statement is not an object", source, i)
			}
			out = append(out, RawStatement{Source: fmt.Sprintf("%s#%d", source, i), Body: m})
		}
		return nil
	}
	if inline, ok := r.Properties["Policies"].([]any); ok {
		for i, p := range inline {
			m, _ := p.(map[string]any)
			name, _ := m["PolicyName"].(string)
			if name == "" {
				name = fmt.Sprint(i)
			}
			if err := add(role+"/"+name, m["PolicyDocument"]); err != nil {
				return nil, err
			}
		}
	}
	for _, id := range t.ofType("AWS::IAM::Policy") {
		p := t.Resources[id].Properties
		roles, _ := p["Roles"].([]any)
		attached := false
		for _, x := range roles {
			if ref, ok := x.(map[string]any); ok && ref["Ref"] == role {
				attached = true
			}
		}
		if attached {
			if err := add(id, p["PolicyDocument"]); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// Without returns a copy of the template with the statement named source (as in
// RawStatement.Source) removed from its policy: what the stack would be without it.
func (t *Template) Without(source string) (*Template, error) {
	id, idx, ok := strings.Cut(source, "#")
	var n int
	if _, err := fmt.Sscan(idx, &n); !ok || err != nil {
		return nil, fmt.Errorf("without %q: want POLICY#INDEX", source)
	}
	data, err := json.Marshal(t)
	if err != nil {
		return nil, err
	}
	c, err := ParseTemplate(data)
	if err != nil {
		return nil, err
	}
	var doc map[string]any
	if roleID, name, inline := strings.Cut(id, "/"); inline {
		r, ok := c.Resources[roleID]
		if !ok {
			return nil, fmt.Errorf("without %q: no role %s", source, roleID)
		}
		pols, _ := r.Properties["Policies"].([]any)
		for _, p := range pols {
			if m, _ := p.(map[string]any); m["PolicyName"] == name {
				doc, _ = m["PolicyDocument"].(map[string]any)
			}
		}
	} else if r, ok := c.Resources[id]; ok && r.Type == "AWS::IAM::Policy" {
		doc, _ = r.Properties["PolicyDocument"].(map[string]any)
	}
	if doc == nil {
		return nil, fmt.Errorf("without %q: no such policy", source)
	}
	sts := doc["Statement"]
	if one, ok := sts.(map[string]any); ok {
		sts = []any{one}
	}
	list, _ := sts.([]any)
	if n < 0 || n >= len(list) {
		return nil, fmt.Errorf("without %q: the policy has %d statements", source, len(list))
	}
	doc["Statement"] = slices.Delete(slices.Clone(list), n, n+1)
	return c, nil
}

// Env says what the template's references mean locally.
type Env struct {
	Partition, Account, Region string
	// Names maps a resource's logical id to its local physical name (a table's or a
	// Kinesis stream's name). An unnamed resource is named by its logical id.
	Names map[string]string
	// StreamARNs maps a table's logical id to the ARN of its local stream (GetAtt
	// StreamArn). Unset: the table's ARN + "/stream/*", any stream of the table.
	StreamARNs map[string]string
}

// LocalEnv is the local account and region (as the fleet uses them), with names.
func LocalEnv(names map[string]string) Env {
	return Env{Partition: "aws", Account: "000000000000", Region: "us-east-1", Names: names}
}

func (e Env) name(id string) string {
	if n, ok := e.Names[id]; ok {
		return n
	}
	return id
}

func (e Env) arn(service, resource string) string {
	return "arn:" + e.Partition + ":" + service + ":" + e.Region + ":" + e.Account + ":" + resource
}

// resolve turns a template value into a string, resolving the intrinsics a
// template's policies use: Ref (resources and pseudo parameters), Fn::GetAtt (Arn,
// StreamArn), Fn::Join and Fn::Sub. Anything else is an error.
func (t *Template) resolve(v any, env Env) (string, error) {
	switch x := v.(type) {
	case string:
		return x, nil
	case map[string]any:
		if len(x) != 1 {
			return "", fmt.Errorf("unsupported value %v", x)
		}
		for fn, arg := range x {
			switch fn {
			case "Ref":
				name, _ := arg.(string)
				return t.ref(name, env)
			case "Fn::GetAtt":
				parts, _ := arg.([]any)
				if s, ok := arg.(string); ok {
					id, attr, _ := strings.Cut(s, ".")
					parts = []any{id, attr}
				}
				if len(parts) != 2 {
					return "", fmt.Errorf("Fn::GetAtt %v: want [id, attribute]", arg)
				}
				id, _ := parts[0].(string)
				attr, _ := parts[1].(string)
				return t.getAtt(id, attr, env)
			case "Fn::Join":
				parts, _ := arg.([]any)
				if len(parts) != 2 {
					return "", fmt.Errorf("Fn::Join %v: want [delimiter, list]", arg)
				}
				sep, _ := parts[0].(string)
				list, ok := parts[1].([]any)
				if !ok {
					return "", fmt.Errorf("Fn::Join %v: the list is not a list", arg)
				}
				var out []string
				for _, p := range list {
					s, err := t.resolve(p, env)
					if err != nil {
						return "", err
					}
					out = append(out, s)
				}
				return strings.Join(out, sep), nil
			case "Fn::Sub":
				s, ok := arg.(string)
				if !ok {
					return "", fmt.Errorf("Fn::Sub %v: only the string form is supported", arg)
				}
				return t.sub(s, env)
			default:
				return "", fmt.Errorf("unsupported intrinsic %s", fn)
			}
		}
	}
	return "", fmt.Errorf("unsupported value %v (%T)", v, v)
}

func (t *Template) sub(s string, env Env) (string, error) {
	var b strings.Builder
	for {
		i := strings.Index(s, "${")
		if i < 0 {
			b.WriteString(s)
			return b.String(), nil
		}
		j := strings.IndexByte(s[i:], '}')
		if j < 0 {
			return "", fmt.Errorf("Fn::Sub %q: unclosed ${", s)
		}
		b.WriteString(s[:i])
		name := s[i+2 : i+j]
		var v string
		var err error
		if strings.HasPrefix(name, "!") {
			v = "${" + name[1:] + "}"
		} else if id, attr, ok := strings.Cut(name, "."); ok && !strings.HasPrefix(name, "AWS::") {
			v, err = t.getAtt(id, attr, env)
		} else {
			v, err = t.ref(name, env)
		}
		if err != nil {
			return "", fmt.Errorf("Fn::Sub %q: %w", s, err)
		}
		b.WriteString(v)
		s = s[i+j+1:]
	}
}

func (t *Template) ref(name string, env Env) (string, error) {
	switch name {
	case "AWS::Partition":
		return env.Partition, nil
	case "AWS::Region":
		return env.Region, nil
	case "AWS::AccountId":
		return env.Account, nil
	case "AWS::URLSuffix":
		return "amazonaws.com", nil
	case "AWS::StackName":
		return "local", nil
	}
	r, ok := t.Resources[name]
	if !ok {
		return "", fmt.Errorf("Ref %s: no such resource or pseudo parameter", name)
	}
	n := env.name(name)
	switch r.Type {
	case "AWS::SNS::Topic":
		return env.arn("sns", n), nil
	case "AWS::SecretsManager::Secret":
		return env.arn("secretsmanager", "secret:"+n), nil
	case "AWS::IAM::Role":
		return n, nil
	case "AWS::DynamoDB::GlobalTable", "AWS::DynamoDB::Table", "AWS::Kinesis::Stream",
		"AWS::Logs::LogGroup", "AWS::ECS::Cluster", "AWS::Lambda::Function", "AWS::SQS::Queue":
		if r.Type == "AWS::SQS::Queue" {
			return "https://sqs." + env.Region + ".amazonaws.com/" + env.Account + "/" + n, nil
		}
		return n, nil
	}
	return "", fmt.Errorf("Ref %s: resource type %s is not supported", name, r.Type)
}

func (t *Template) getAtt(id, attr string, env Env) (string, error) {
	r, ok := t.Resources[id]
	if !ok {
		return "", fmt.Errorf("Fn::GetAtt %s.%s: no such resource", id, attr)
	}
	n := env.name(id)
	switch r.Type + "." + attr {
	case "AWS::DynamoDB::GlobalTable.Arn", "AWS::DynamoDB::Table.Arn":
		return env.arn("dynamodb", "table/"+n), nil
	case "AWS::DynamoDB::GlobalTable.StreamArn", "AWS::DynamoDB::Table.StreamArn":
		if a, ok := env.StreamARNs[id]; ok {
			return a, nil
		}
		return env.arn("dynamodb", "table/"+n+"/stream/*"), nil
	case "AWS::Kinesis::Stream.Arn":
		return env.arn("kinesis", "stream/"+n), nil
	case "AWS::Logs::LogGroup.Arn":
		return env.arn("logs", "log-group:"+n+":*"), nil
	case "AWS::SNS::Topic.TopicArn":
		return env.arn("sns", n), nil
	case "AWS::IAM::Role.Arn":
		return "arn:" + env.Partition + ":iam::" + env.Account + ":role/" + n, nil
	case "AWS::Lambda::Function.Arn":
		return env.arn("lambda", "function:"+n), nil
	case "AWS::ECS::Cluster.Arn":
		return env.arn("ecs", "cluster/"+n), nil
	}
	return "", fmt.Errorf("Fn::GetAtt %s.%s: attribute of %s not supported", id, attr, r.Type)
}
