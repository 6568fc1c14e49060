// Package filtermatch matches DynamoDB stream records against Lambda event filter
// patterns, so the local stream poller passes the reconciler exactly the records the
// production event source mapping would. It never ships: on AWS, Lambda applies the
// patterns (shared/filters) itself.
//
// Guarantees: the operators sockfleet's patterns use (exact values, prefix, suffix,
// equals-ignore-case, anything-but, numeric, exists) match as Lambda documents them,
// and any other operator is refused at compile time. Not guaranteed: Lambda's
// behaviour on inputs its documentation leaves open; the tests pin the cases the
// patterns rely on (typed exists, numbers as strings).
package filtermatch

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/sockfleet/sockfleet/shared/filters"
)

// Set is a compiled list of patterns, OR-ed, matched with the semantics of Lambda's
// event filtering (the event-ruler rules):
//
//   - a pattern is an object; every field in it must match (AND);
//   - a nested object in the pattern descends into the same field of the event;
//   - a leaf is an array of conditions, any of which may match (OR): an exact string,
//     number, boolean or null, or one of the operators prefix, suffix,
//     equals-ignore-case, anything-but, numeric and exists;
//   - strings match exactly and only strings (DynamoDB numbers arrive as strings in
//     {"N": "5"}, so they match "5", never 5, and never a numeric range);
//   - an array in the event matches if any element does;
//   - exists looks at leaves only: a field whose value is an object is not a leaf, so
//     {"exists": false} matches it and {"exists": true} does not. That is why
//     attribute patterns name the type, as in {"N": [{"exists": false}]}.
//
// Operators that Lambda supports but sockfleet does not use (cidr, wildcard) are
// refused by Compile rather than silently mismatched.
type Set struct {
	patterns []compiled
}

type compiled []field

// field is one leaf of a pattern: a path into the event and its OR-ed conditions.
type field struct {
	path  string
	conds []cond
}

type condKind int

const (
	exact condKind = iota
	prefix
	suffix
	ignoreCase
	anythingBut
	anythingButPrefix
	anythingButSuffix
	numeric
	exists
)

type cond struct {
	kind   condKind
	value  leaf   // exact, prefix, suffix, ignoreCase, anythingBut*
	values []leaf // anythingBut with a list
	ranges []numCmp
	exists bool
}

type numCmp struct {
	op string
	n  float64
}

// leaf is a scalar of the event or the pattern.
type leaf struct {
	kind byte // 's' string, 'n' number, 'b' bool, 'z' null
	s    string
	n    float64
}

const sep = "\x1f"

// Compile checks and compiles patterns. It goes through JSON, so it sees exactly what
// Lambda is given (JSON renders the same data).
func Compile(ps []filters.Pattern) (*Set, error) {
	s := &Set{}
	for i, p := range ps {
		b, err := json.Marshal(p)
		if err != nil {
			return nil, fmt.Errorf("pattern %d: %w", i, err)
		}
		c, err := CompileJSON(b)
		if err != nil {
			return nil, fmt.Errorf("pattern %d: %w", i, err)
		}
		s.patterns = append(s.patterns, c.patterns...)
	}
	return s, nil
}

// CompileJSON compiles one pattern given as JSON.
func CompileJSON(b []byte) (*Set, error) {
	v, err := decode(b)
	if err != nil {
		return nil, err
	}
	obj, ok := v.(map[string]any)
	if !ok || len(obj) == 0 {
		return nil, errors.New("a pattern must be a non-empty object")
	}
	var c compiled
	if err := compileObject(obj, "", &c); err != nil {
		return nil, err
	}
	return &Set{patterns: []compiled{c}}, nil
}

// MustCompile is Compile for static data; it panics on a bad pattern.
func MustCompile(ps []filters.Pattern) *Set {
	s, err := Compile(ps)
	if err != nil {
		panic(err)
	}
	return s
}

func compileObject(obj map[string]any, path string, c *compiled) error {
	for k, v := range obj {
		p := k
		if path != "" {
			p = path + sep + k
		}
		switch v := v.(type) {
		case map[string]any:
			if len(v) == 0 {
				return fmt.Errorf("%s: empty object", dotted(p))
			}
			if err := compileObject(v, p, c); err != nil {
				return err
			}
		case []any:
			if len(v) == 0 {
				return fmt.Errorf("%s: empty array", dotted(p))
			}
			f := field{path: p}
			for _, e := range v {
				cd, err := compileCond(e)
				if err != nil {
					return fmt.Errorf("%s: %w", dotted(p), err)
				}
				f.conds = append(f.conds, cd)
			}
			*c = append(*c, f)
		default:
			return fmt.Errorf("%s: a leaf must be an array of conditions, got %T", dotted(p), v)
		}
	}
	return nil
}

func compileCond(e any) (cond, error) {
	if l, ok := toLeaf(e); ok {
		return cond{kind: exact, value: l}, nil
	}
	op, ok := e.(map[string]any)
	if !ok || len(op) != 1 {
		return cond{}, fmt.Errorf("condition %v: want a scalar or an object with one operator", e)
	}
	for name, arg := range op {
		switch name {
		case "prefix", "suffix", "equals-ignore-case":
			s, ok := arg.(string)
			if !ok {
				return cond{}, fmt.Errorf("%s wants a string", name)
			}
			kind := map[string]condKind{"prefix": prefix, "suffix": suffix, "equals-ignore-case": ignoreCase}[name]
			return cond{kind: kind, value: leaf{kind: 's', s: s}}, nil
		case "exists":
			b, ok := arg.(bool)
			if !ok {
				return cond{}, errors.New("exists wants true or false")
			}
			return cond{kind: exists, exists: b}, nil
		case "anything-but":
			return compileAnythingBut(arg)
		case "numeric":
			return compileNumeric(arg)
		default:
			return cond{}, fmt.Errorf("operator %q is not supported", name)
		}
	}
	panic("unreachable")
}

func compileAnythingBut(arg any) (cond, error) {
	if l, ok := toLeaf(arg); ok && (l.kind == 's' || l.kind == 'n') {
		return cond{kind: anythingBut, values: []leaf{l}}, nil
	}
	switch a := arg.(type) {
	case []any:
		c := cond{kind: anythingBut}
		for _, e := range a {
			l, ok := toLeaf(e)
			if !ok || (l.kind != 's' && l.kind != 'n') {
				return cond{}, errors.New("anything-but list wants strings or numbers")
			}
			c.values = append(c.values, l)
		}
		if len(c.values) == 0 {
			return cond{}, errors.New("anything-but list is empty")
		}
		return c, nil
	case map[string]any:
		if len(a) == 1 {
			if s, ok := a["prefix"].(string); ok {
				return cond{kind: anythingButPrefix, value: leaf{kind: 's', s: s}}, nil
			}
			if s, ok := a["suffix"].(string); ok {
				return cond{kind: anythingButSuffix, value: leaf{kind: 's', s: s}}, nil
			}
		}
	}
	return cond{}, fmt.Errorf("anything-but %v: unsupported form", arg)
}

func compileNumeric(arg any) (cond, error) {
	a, ok := arg.([]any)
	if !ok || len(a) == 0 || len(a) > 4 || len(a)%2 != 0 {
		return cond{}, errors.New("numeric wants [op, n] or [op, n, op, n]")
	}
	c := cond{kind: numeric}
	for i := 0; i < len(a); i += 2 {
		op, _ := a[i].(string)
		switch op {
		case "=", "<", "<=", ">", ">=":
		default:
			return cond{}, fmt.Errorf("numeric operator %v", a[i])
		}
		l, ok := toLeaf(a[i+1])
		if !ok || l.kind != 'n' {
			return cond{}, fmt.Errorf("numeric wants a number after %s", op)
		}
		c.ranges = append(c.ranges, numCmp{op: op, n: l.n})
	}
	return c, nil
}

// Match reports whether the event (decoded JSON: maps, slices, strings, numbers as
// float64 or json.Number, bools, nil) matches any pattern.
func (s *Set) Match(event any) bool {
	leaves := map[string][]leaf{}
	flatten(event, "", leaves)
	for _, p := range s.patterns {
		if p.match(leaves) {
			return true
		}
	}
	return false
}

// MatchJSON decodes event and matches it.
func (s *Set) MatchJSON(event []byte) (bool, error) {
	v, err := decode(event)
	if err != nil {
		return false, err
	}
	return s.Match(v), nil
}

func (p compiled) match(leaves map[string][]leaf) bool {
	for _, f := range p {
		vals := leaves[f.path]
		ok := false
		for _, c := range f.conds {
			if c.match(vals) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

func (c cond) match(vals []leaf) bool {
	switch c.kind {
	case exists:
		return (len(vals) > 0) == c.exists
	case anythingBut, anythingButPrefix, anythingButSuffix:
		for _, v := range vals {
			if c.butMatches(v) {
				return true
			}
		}
		return false
	}
	for _, v := range vals {
		if c.matches(v) {
			return true
		}
	}
	return false
}

func (c cond) butMatches(v leaf) bool {
	switch c.kind {
	case anythingButPrefix:
		return v.kind == 's' && !strings.HasPrefix(v.s, c.value.s)
	case anythingButSuffix:
		return v.kind == 's' && !strings.HasSuffix(v.s, c.value.s)
	}
	for _, x := range c.values {
		if x.equal(v) {
			return false
		}
	}
	return true
}

func (c cond) matches(v leaf) bool {
	switch c.kind {
	case exact:
		return c.value.equal(v)
	case prefix:
		return v.kind == 's' && strings.HasPrefix(v.s, c.value.s)
	case suffix:
		return v.kind == 's' && strings.HasSuffix(v.s, c.value.s)
	case ignoreCase:
		return v.kind == 's' && strings.EqualFold(v.s, c.value.s)
	case numeric:
		if v.kind != 'n' {
			return false
		}
		for _, r := range c.ranges {
			if !r.holds(v.n) {
				return false
			}
		}
		return true
	}
	return false
}

func (r numCmp) holds(n float64) bool {
	switch r.op {
	case "=":
		return n == r.n
	case "<":
		return n < r.n
	case "<=":
		return n <= r.n
	case ">":
		return n > r.n
	default:
		return n >= r.n
	}
}

func (l leaf) equal(o leaf) bool {
	if l.kind != o.kind {
		return false
	}
	switch l.kind {
	case 's':
		return l.s == o.s
	case 'n':
		return l.n == o.n
	case 'b':
		return l.s == o.s
	}
	return true
}

func toLeaf(v any) (leaf, bool) {
	switch v := v.(type) {
	case string:
		return leaf{kind: 's', s: v}, true
	case json.Number:
		f, err := v.Float64()
		if err != nil || math.IsInf(f, 0) {
			return leaf{}, false
		}
		return leaf{kind: 'n', n: f}, true
	case float64:
		return leaf{kind: 'n', n: v}, true
	case bool:
		if v {
			return leaf{kind: 'b', s: "true"}, true
		}
		return leaf{kind: 'b', s: "false"}, true
	case nil:
		return leaf{kind: 'z'}, true
	}
	return leaf{}, false
}

// flatten collects the event's leaves by path. Arrays put each element at the path of
// the array itself.
func flatten(v any, path string, out map[string][]leaf) {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			p := k
			if path != "" {
				p = path + sep + k
			}
			flatten(e, p, out)
		}
	case []any:
		for _, e := range v {
			flatten(e, path, out)
		}
	default:
		if l, ok := toLeaf(v); ok && path != "" {
			out[path] = append(out[path], l)
		}
	}
}

func decode(b []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, fmt.Errorf("decode JSON: %w", err)
	}
	if d.More() {
		return nil, errors.New("decode JSON: trailing data")
	}
	return v, nil
}

func dotted(p string) string { return strings.ReplaceAll(p, sep, ".") }
