package iam

import (
	"fmt"
	"slices"
	"strings"
)

// Statement is one policy statement with its resources resolved into local ARNs.
type Statement struct {
	Source                  string // as in RawStatement.Source
	Allow                   bool   // Effect Allow; false is Deny
	Actions, NotActions     []string
	Resources, NotResources []string
	Conditions              []Condition
}

// Condition is one operator/key test of a statement's Condition block.
type Condition struct {
	Operator string // as written, e.g. ForAllValues:StringLike
	Key      string // e.g. dynamodb:LeadingKeys
	Values   []string
}

// Policy is what a role is allowed: every statement attached to it.
type Policy struct {
	Role       string // the role's logical id
	Statements []Statement
}

// Keys are the condition keys Request can carry. A statement conditioned on
// another key cannot be evaluated, so building its policy fails.
var Keys = []string{"dynamodb:LeadingKeys"}

// Policy resolves the statements of role (a logical id) for env.
func (t *Template) Policy(role string, env Env) (*Policy, error) {
	raws, err := t.Statements(role)
	if err != nil {
		return nil, err
	}
	p := &Policy{Role: role}
	for _, r := range raws {
		s, err := t.statement(r, env)
		if err != nil {
			return nil, fmt.Errorf("role %s: %s: %w", role, r.Source, err)
		}
		p.Statements = append(p.Statements, s)
	}
	return p, nil
}

func (t *Template) statement(r RawStatement, env Env) (Statement, error) {
	s := Statement{Source: r.Source}
	switch r.Body["Effect"] {
	case "Allow":
		s.Allow = true
	case "Deny":
	default:
		return s, fmt.Errorf("Effect %v: want Allow or Deny", r.Body["Effect"])
	}
	for _, k := range []string{"Principal", "NotPrincipal"} {
		if _, ok := r.Body[k]; ok {
			return s, fmt.Errorf("%s in an identity-based policy is not supported", k)
		}
	}
	var err error
	list := func(key string, resolve bool) []string {
		v, ok := r.Body[key]
		if !ok || err != nil {
			return nil
		}
		items, isList := v.([]any)
		if !isList {
			items = []any{v}
		}
		var out []string
		for _, it := range items {
			var str string
			if resolve {
				str, err = t.resolve(it, env)
			} else if str, ok = it.(string); !ok {
				err = fmt.Errorf("%s: %v is not a string", key, it)
			}
			if err != nil {
				err = fmt.Errorf("%s: %w", key, err)
				return nil
			}
			if strings.Contains(str, "${") && resolve {
				err = fmt.Errorf("%s %q: policy variables are not supported", key, str)
				return nil
			}
			out = append(out, str)
		}
		return out
	}
	s.Actions, s.NotActions = list("Action", false), list("NotAction", false)
	s.Resources, s.NotResources = list("Resource", true), list("NotResource", true)
	if err != nil {
		return s, err
	}
	if (s.Actions == nil) == (s.NotActions == nil) {
		return s, fmt.Errorf("want exactly one of Action and NotAction")
	}
	if (s.Resources == nil) == (s.NotResources == nil) {
		return s, fmt.Errorf("want exactly one of Resource and NotResource")
	}
	if c, ok := r.Body["Condition"]; ok {
		block, ok := c.(map[string]any)
		if !ok {
			return s, fmt.Errorf("Condition is not an object")
		}
		for op, kv := range block {
			if _, err := operator(op); err != nil {
				return s, err
			}
			keys, ok := kv.(map[string]any)
			if !ok {
				return s, fmt.Errorf("Condition %s is not an object", op)
			}
			for key, vals := range keys {
				if !slices.ContainsFunc(Keys, func(k string) bool { return strings.EqualFold(k, key) }) {
					return s, fmt.Errorf("Condition %s: key %s is not one the local enforcement knows (%v)", op, key, Keys)
				}
				items, isList := vals.([]any)
				if !isList {
					items = []any{vals}
				}
				cond := Condition{Operator: op, Key: key}
				for _, it := range items {
					v, err := t.resolve(it, env)
					if err != nil {
						return s, fmt.Errorf("Condition %s %s: %w", op, key, err)
					}
					cond.Values = append(cond.Values, v)
				}
				s.Conditions = append(s.Conditions, cond)
			}
		}
		slices.SortFunc(s.Conditions, func(a, b Condition) int {
			return strings.Compare(a.Operator+a.Key, b.Operator+b.Key)
		})
	}
	return s, nil
}

// Request is one authorization question: may the role perform Action on every one
// of Resources, with this condition context?
type Request struct {
	Action    string              // service:Operation, e.g. dynamodb:PutItem
	Resources []string            // ARNs; one decision per resource, all must allow
	Context   map[string][]string // condition keys (lower case) and their values
	// Unknown lists condition keys (lower case) whose values the request mapping
	// could not determine: a statement conditioned on one cannot be decided, which
	// is an error rather than a guess.
	Unknown []string
}

// Decision is the outcome of Evaluate.
type Decision struct {
	Allowed bool
	// Resource is the first resource denied; ExplicitDeny says a Deny statement
	// (Statement) denied it, rather than no Allow matching.
	Resource     string
	ExplicitDeny bool
	Statement    string
}

// Evaluate decides r as AWS evaluates identity-based policies: for each resource,
// a matching Deny statement denies; otherwise a matching Allow statement allows;
// otherwise it is denied implicitly. r is allowed only if every resource is.
func (p *Policy) Evaluate(r Request) (Decision, error) {
	if len(r.Resources) == 0 {
		return Decision{}, fmt.Errorf("evaluate %s: no resource", r.Action)
	}
	for _, res := range r.Resources {
		allowed := false
		for _, s := range p.Statements {
			ok, err := s.matches(r.Action, res, r.Context, r.Unknown)
			if err != nil {
				return Decision{}, fmt.Errorf("evaluate %s on %s: %s: %w", r.Action, res, s.Source, err)
			}
			if !ok {
				continue
			}
			if !s.Allow {
				return Decision{Resource: res, ExplicitDeny: true, Statement: s.Source}, nil
			}
			allowed = true
		}
		if !allowed {
			return Decision{Resource: res}, nil
		}
	}
	return Decision{Allowed: true}, nil
}

func (s Statement) matches(action, resource string, ctx map[string][]string, unknown []string) (bool, error) {
	actionMatch := func(pats []string) bool {
		return slices.ContainsFunc(pats, func(p string) bool { return Glob(strings.ToLower(p), strings.ToLower(action)) })
	}
	resourceMatch := func(pats []string) bool {
		return slices.ContainsFunc(pats, func(p string) bool { return Glob(p, resource) })
	}
	if s.Actions != nil && !actionMatch(s.Actions) || s.NotActions != nil && actionMatch(s.NotActions) {
		return false, nil
	}
	if s.Resources != nil && !resourceMatch(s.Resources) || s.NotResources != nil && resourceMatch(s.NotResources) {
		return false, nil
	}
	for _, c := range s.Conditions {
		if slices.Contains(unknown, strings.ToLower(c.Key)) {
			return false, fmt.Errorf("%s: the request's value is not known locally", c.Key)
		}
		ok, err := c.holds(ctx)
		if err != nil || !ok {
			return false, err
		}
	}
	return true, nil
}

// opSpec is a parsed condition operator.
type opSpec struct {
	set      string // "", "ForAllValues" or "ForAnyValue"
	base     string // StringEquals, StringLike, ...
	ifExists bool
}

// operators are the base operators implemented: the string family, which is what
// the stack's conditions on request keys use.
var operators = []string{"StringEquals", "StringNotEquals", "StringEqualsIgnoreCase", "StringNotEqualsIgnoreCase", "StringLike", "StringNotLike"}

func operator(op string) (opSpec, error) {
	var o opSpec
	rest := op
	if set, base, ok := strings.Cut(op, ":"); ok {
		if set != "ForAllValues" && set != "ForAnyValue" {
			return o, fmt.Errorf("condition operator %s is not supported", op)
		}
		o.set, rest = set, base
	}
	if b, ok := strings.CutSuffix(rest, "IfExists"); ok {
		o.ifExists, rest = true, b
	}
	if !slices.Contains(operators, rest) {
		return o, fmt.Errorf("condition operator %s is not supported (supported: %v, with ForAllValues:/ForAnyValue: and IfExists)", op, operators)
	}
	o.base = rest
	return o, nil
}

// holds evaluates the condition against the request context. A missing key makes
// a single-valued test false (true with IfExists), ForAllValues true and
// ForAnyValue false, as in AWS.
func (c Condition) holds(ctx map[string][]string) (bool, error) {
	o, err := operator(c.Operator)
	if err != nil {
		return false, err
	}
	vals, present := ctx[strings.ToLower(c.Key)]
	negated := strings.Contains(o.base, "Not")
	one := func(v string) bool {
		match := slices.ContainsFunc(c.Values, func(p string) bool {
			switch o.base {
			case "StringEquals", "StringNotEquals":
				return p == v
			case "StringEqualsIgnoreCase", "StringNotEqualsIgnoreCase":
				return strings.EqualFold(p, v)
			default:
				return Glob(p, v)
			}
		})
		return match != negated
	}
	switch o.set {
	case "ForAllValues":
		if !present || len(vals) == 0 {
			return true, nil
		}
		return !slices.ContainsFunc(vals, func(v string) bool { return !one(v) }), nil
	case "ForAnyValue":
		return slices.ContainsFunc(vals, one), nil
	}
	if !present {
		return o.ifExists || negated, nil
	}
	if len(vals) != 1 {
		return false, fmt.Errorf("%s on %s: the key has %d values; use ForAllValues or ForAnyValue", c.Operator, c.Key, len(vals))
	}
	return one(vals[0]), nil
}

// Glob reports whether s matches pattern, where * matches any run of characters
// (none included) and ? exactly one, as in IAM's Action, Resource and StringLike.
func Glob(pattern, s string) bool {
	// Iterative matching with backtracking to the last *.
	p, i := 0, 0
	star, mark := -1, 0
	for i < len(s) {
		switch {
		case p < len(pattern) && (pattern[p] == '?' || pattern[p] == s[i]):
			p++
			i++
		case p < len(pattern) && pattern[p] == '*':
			star, mark = p, i
			p++
		case star >= 0:
			p = star + 1
			mark++
			i = mark
		default:
			return false
		}
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}
