package fleet_test

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sockfleet/sockfleet/shared/local/jaeger"
)

// spanGraph is every span of a run's traces, with the references that carry
// causality: a span's parent (CHILD_OF) and its links (FOLLOWS_FROM), across traces.
type spanGraph struct {
	spans   map[string]jaeger.Span // by span id
	service map[string]string      // span id → service.name
	refs    map[string][]string    // span id → the span ids it follows
	parent  map[string]string      // span id → its parent's
}

func newSpanGraph(traces []jaeger.Trace) *spanGraph {
	g := &spanGraph{spans: map[string]jaeger.Span{}, service: map[string]string{}, refs: map[string][]string{}, parent: map[string]string{}}
	for _, tr := range traces {
		for _, s := range tr.Spans {
			g.spans[s.SpanID] = s
			g.service[s.SpanID] = tr.Service(s)
			for _, r := range s.References {
				g.refs[s.SpanID] = append(g.refs[s.SpanID], r.SpanID)
				if r.RefType == "CHILD_OF" {
					g.parent[s.SpanID] = r.SpanID
				}
			}
		}
	}
	return g
}

// follows reports whether span id was caused by span cause: cause is reached from
// id by following parents and links.
func (g *spanGraph) follows(id, cause string) bool {
	seen := map[string]bool{}
	todo := []string{id}
	for len(todo) > 0 {
		cur := todo[len(todo)-1]
		todo = todo[:len(todo)-1]
		if cur == cause {
			return true
		}
		if seen[cur] {
			continue
		}
		seen[cur] = true
		todo = append(todo, g.refs[cur]...)
	}
	return false
}

// step is one span a chain expects: its name, the service it comes from, and a
// check of its attributes (nil: any). Its span is caused by the previous step's
// (reached from it through parents and links), unless Sibling says that both come
// from an earlier step (a session's dial and its first delivery), when it need only
// follow the chain's first span. ChildOfPrev asks for the previous step's span as
// its parent: the hop whose context crosses a process boundary.
type step struct {
	Name, Service string
	Match         func(jaeger.Span) bool
	ChildOfPrev   bool
	Sibling       bool
}

// skew is how far a span may start before the one it follows: start times are
// microseconds from one clock (every process runs on this machine).
const skew = time.Millisecond

// chain finds spans s0, s1, … matching steps, each caused by the one before it
// (or, for a Sibling, by s0) and starting no earlier than the one before it, and returns them; or an error saying
// which step found no span and what the run had of that name.
func (g *spanGraph) chain(steps []step) ([]jaeger.Span, error) {
	var ids []string
	for id := range g.spans {
		ids = append(ids, id)
	}
	// Earliest first, so the chain reported is the first one that happened.
	slices.SortFunc(ids, func(a, b string) int { return int(g.spans[a].StartTime - g.spans[b].StartTime) })
	matches := func(st step, id string) bool {
		s := g.spans[id]
		return s.OperationName == st.Name && g.service[id] == st.Service && (st.Match == nil || st.Match(s))
	}
	deepest, path := 0, []string{}
	var try func(i int) bool
	try = func(i int) bool {
		if i > deepest {
			deepest = i
		}
		if i == len(steps) {
			return true
		}
		for _, id := range ids {
			if !matches(steps[i], id) {
				continue
			}
			if i > 0 {
				prev := g.spans[path[i-1]]
				cause := path[i-1]
				if steps[i].Sibling {
					cause = path[0]
				}
				if g.spans[id].Start().Before(prev.Start().Add(-skew)) || !g.follows(id, cause) {
					continue
				}
				if steps[i].ChildOfPrev && g.parent[id] != path[i-1] {
					continue
				}
			}
			path = append(path, id)
			if try(i + 1) {
				return true
			}
			path = path[:i]
		}
		return false
	}
	if try(0) {
		out := make([]jaeger.Span, len(path))
		for i, id := range path {
			out[i] = g.spans[id]
		}
		return out, nil
	}
	st := steps[deepest]
	n := 0
	for _, id := range ids {
		if matches(st, id) {
			n++
		}
	}
	return nil, fmt.Errorf("no %s span from %s after %s (the run has %d %s spans matching; spans seen: %s)",
		st.Name, st.Service, names(steps[:deepest]), n, st.Name, g.census())
}

func names(steps []step) string {
	if len(steps) == 0 {
		return "the start"
	}
	var n []string
	for _, s := range steps {
		n = append(n, s.Name)
	}
	return strings.Join(n, " → ")
}

// census counts the spans by service and name, for failure messages.
func (g *spanGraph) census() string {
	count := map[string]int{}
	for id, s := range g.spans {
		count[g.service[id]+"/"+s.OperationName]++
	}
	var out []string
	for k, n := range count {
		out = append(out, fmt.Sprintf("%s×%d", k, n))
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

// tagIs matches a span whose attribute key is value.
func tagIs(key, value string) func(jaeger.Span) bool {
	return func(s jaeger.Span) bool { v, ok := s.Tag(key); return ok && v == value }
}

// aboutConn matches a span about connection id: its sockfleet.conn attribute is id,
// or it has none and one of its wakeup.conn events names id. A wakeup call that
// carries several connections (wakeup.send, and wakeup.handle on the other side)
// names each in an event, not in an attribute, since it has one per id.
func aboutConn(id string) func(jaeger.Span) bool {
	return func(s jaeger.Span) bool {
		if v, ok := s.Tag("sockfleet.conn"); ok {
			return v == id
		}
		for _, l := range s.Logs {
			var event, conn string
			for _, f := range l.Fields {
				switch f.Key {
				case "event":
					event = fmt.Sprint(f.Value)
				case "sockfleet.conn":
					conn = fmt.Sprint(f.Value)
				}
			}
			if event == "wakeup.conn" && conn == id {
				return true
			}
		}
		return false
	}
}

// tagIfSet matches a span whose attribute key is value or unset: spans that need
// not say which connection they are about, but must not say another.
func tagIfSet(key, value string) func(jaeger.Span) bool {
	return func(s jaeger.Span) bool { v, ok := s.Tag(key); return !ok || v == value }
}

// startedBy matches a span that starts at or after t, and everything m matches.
func startedBy(t time.Time, m func(jaeger.Span) bool) func(jaeger.Span) bool {
	return func(s jaeger.Span) bool { return !s.Start().Before(t) && (m == nil || m(s)) }
}

func both(a, b func(jaeger.Span) bool) func(jaeger.Span) bool {
	return func(s jaeger.Span) bool { return a(s) && b(s) }
}
