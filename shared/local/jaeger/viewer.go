package jaeger

import (
	"cmp"
	"fmt"
	"html/template"
	"net/http"
	"slices"
	"strings"
	"time"
)

// Viewer serves a connection's ownership traces as plain HTML pages, read from the
// query API: GET /conn/{id} shows the most recent trace with a span about connection
// id (attribute sockfleet.conn) and lists the earlier ones; GET /trace/{traceID}
// shows one. The Jaeger built from the Go module proxy has no UI assets (its UI is a
// separate JavaScript build), so this is the page a click on a connection id opens.
type Viewer struct {
	Client   *Client
	Services []string // where to look for a connection's spans
}

// Handler returns the viewer's routes.
func (v *Viewer) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /conn/{id}", v.conn)
	mux.HandleFunc("GET /trace/{id}", v.trace)
	return mux
}

// ConnURL is the viewer page of connection id, for a viewer at base.
func ConnURL(base, id string) string { return base + "/conn/" + id }

func (v *Viewer) conn(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	seen := map[string]Trace{}
	for _, svc := range v.Services {
		trs, err := v.Client.Traces(r.Context(), Query{Service: svc, Tags: map[string]string{"sockfleet.conn": id}, Limit: 50})
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		for _, t := range trs {
			seen[t.TraceID] = t
		}
	}
	var traces []Trace
	for _, t := range seen {
		traces = append(traces, t)
	}
	if len(traces) == 0 {
		http.Error(w, fmt.Sprintf("no trace has a span about connection %q (yet: spans reach Jaeger within seconds)", id), http.StatusNotFound)
		return
	}
	// Most recent first, by the trace's first span.
	slices.SortFunc(traces, func(a, b Trace) int { return cmp.Compare(first(b), first(a)) })
	v.render(w, fmt.Sprintf("connection %s: its most recent ownership trace", id), traces[0], traces[1:])
}

func (v *Viewer) trace(w http.ResponseWriter, r *http.Request) {
	t, err := v.Client.Trace(r.Context(), r.PathValue("id"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	v.render(w, "trace "+t.TraceID, t, nil)
}

func first(t Trace) int64 {
	m := int64(0)
	for i, s := range t.Spans {
		if i == 0 || s.StartTime < m {
			m = s.StartTime
		}
	}
	return m
}

// row is one span of the page.
type row struct {
	Offset, Duration     string
	Depth                int
	Service, Name, Attrs string
	Events, SpanID       string
	Follow               []string // the traces of the spans it links to
}

type earlier struct{ ID, When, Root string }

func (v *Viewer) render(w http.ResponseWriter, title string, t Trace, others []Trace) {
	spans := slices.Clone(t.Spans)
	slices.SortFunc(spans, func(a, b Span) int { return cmp.Compare(a.StartTime, b.StartTime) })
	parent := map[string]string{}
	for _, s := range spans {
		for _, r := range s.References {
			if r.RefType == "CHILD_OF" {
				parent[s.SpanID] = r.SpanID
			}
		}
	}
	depth := func(id string) int {
		d := 0
		for p, ok := parent[id]; ok && d < 50; p, ok = parent[p] {
			d++
		}
		return d
	}
	t0 := first(t)
	var rows []row
	for _, s := range spans {
		var attrs, events, follows []string
		for _, kv := range s.Tags {
			if strings.HasPrefix(kv.Key, "sockfleet.") || kv.Key == "error" {
				attrs = append(attrs, fmt.Sprintf("%s=%v", kv.Key, kv.Value))
			}
		}
		for _, l := range s.Logs {
			for _, f := range l.Fields {
				if f.Key == "event" {
					events = append(events, fmt.Sprint(f.Value))
				}
			}
		}
		for _, r := range s.References {
			if r.RefType == "FOLLOWS_FROM" {
				follows = append(follows, r.TraceID)
			}
		}
		rows = append(rows, row{
			Offset:   time.Duration((s.StartTime - t0) * int64(time.Microsecond)).String(),
			Duration: time.Duration(s.Duration * int64(time.Microsecond)).String(),
			Depth:    depth(s.SpanID) * 16, Service: t.Service(s), Name: s.OperationName,
			Attrs: strings.Join(attrs, " "), Events: strings.Join(events, ", "), SpanID: s.SpanID,
			Follow: follows,
		})
	}
	var prev []earlier
	for _, o := range others {
		root := ""
		for _, s := range o.Spans {
			if len(s.References) == 0 || s.StartTime == first(o) {
				root = s.OperationName
				break
			}
		}
		prev = append(prev, earlier{ID: o.TraceID, When: time.UnixMicro(first(o)).UTC().Format(time.RFC3339Nano), Root: root})
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_ = page.Execute(w, map[string]any{
		"Title": title, "TraceID": t.TraceID, "Start": time.UnixMicro(t0).UTC().Format(time.RFC3339Nano),
		"Rows": rows, "Earlier": prev,
	})
}

var page = template.Must(template.New("trace").Parse(`<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{{.Title}}</title>
<style>body{font-family:sans-serif;margin:2em}td,th{padding:2px 8px;text-align:left;vertical-align:top}
tr:nth-child(even){background:#f4f4f4}code{font-size:90%}</style></head><body>
<h2>{{.Title}}</h2>
<p>trace <code>{{.TraceID}}</code>, started {{.Start}}</p>
<table><tr><th>+</th><th>took</th><th>service</th><th>span</th><th>attributes</th><th>events</th><th>linked from trace</th></tr>
{{range .Rows}}<tr><td>{{.Offset}}</td><td>{{.Duration}}</td><td>{{.Service}}</td>
<td style="padding-left:{{.Depth}}px"><code>{{.Name}}</code></td><td><code>{{.Attrs}}</code></td><td>{{.Events}}</td>
<td>{{range .Follow}}<a href="/trace/{{.}}">{{.}}</a> {{end}}</td></tr>
{{end}}</table>
{{if .Earlier}}<h3>earlier traces of this connection</h3><ul>
{{range .Earlier}}<li><a href="/trace/{{.ID}}">{{.When}}</a> {{.Root}}</li>{{end}}</ul>{{end}}
</body></html>
`))
