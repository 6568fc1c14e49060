package stream

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/sockfleet/sockfleet/shared/schema"
)

// Resume says how the resume point is passed upstream when dialing. Its spec is
//
//	query:NAME=TEMPLATE   add a query parameter, e.g. query:from={seq} (the default)
//	header:NAME=TEMPLATE  add a header, e.g. header:Last-Event-ID={seq}
//	none                  pass nothing
//
// where TEMPLATE may use {seq} (the last acknowledged sequence) and {next} ({seq}+1).
type Resume struct {
	Kind     string // "query", "header" or "none"
	Name     string
	Template string
}

// DefaultResume is the resume spec the demo upstream understands.
const DefaultResume = "query:from={seq}"

// ParseResume parses a resume spec.
func ParseResume(spec string) (Resume, error) {
	if spec == "" {
		spec = DefaultResume
	}
	if spec == "none" {
		return Resume{Kind: "none"}, nil
	}
	kind, rest, ok := strings.Cut(spec, ":")
	if !ok || (kind != "query" && kind != "header") {
		return Resume{}, fmt.Errorf("resume %q: want query:NAME=TEMPLATE, header:NAME=TEMPLATE or none", spec)
	}
	name, tmpl, ok := strings.Cut(rest, "=")
	if !ok || name == "" || tmpl == "" {
		return Resume{}, fmt.Errorf("resume %q: want %s:NAME=TEMPLATE", spec, kind)
	}
	if kind == "header" && http.CanonicalHeaderKey(name) == "" {
		return Resume{}, fmt.Errorf("resume %q: bad header name", spec)
	}
	return Resume{Kind: kind, Name: name, Template: tmpl}, nil
}

// Apply returns the URL to dial and the headers to send to resume after seq.
func (r Resume) Apply(rawURL string, seq int64) (string, http.Header, error) {
	if r.Kind == "" || r.Kind == "none" {
		return rawURL, nil, nil
	}
	v := strings.NewReplacer("{seq}", strconv.FormatInt(seq, 10), "{next}", strconv.FormatInt(seq+1, 10)).Replace(r.Template)
	if r.Kind == "header" {
		h := http.Header{}
		h.Set(r.Name, v)
		return rawURL, h, nil
	}
	if _, err := url.Parse(rawURL); err != nil {
		return "", nil, fmt.Errorf("resume: %w", schema.URLParseError(err))
	}
	return setQueryParam(rawURL, r.Name, v), nil, nil
}

// setQueryParam sets one query parameter in rawURL, leaving every other byte as
// it was (signed URLs break if other parameters are re-escaped or reordered).
// The first NAME=... pair is replaced in place, later ones dropped; with none,
// the pair is appended.
func setQueryParam(rawURL, name, value string) string {
	base, frag, hasFrag := strings.Cut(rawURL, "#")
	path, query, _ := strings.Cut(base, "?")
	pair := url.QueryEscape(name) + "=" + url.QueryEscape(value)
	var out []string
	done := false
	if query != "" {
		for _, part := range strings.Split(query, "&") {
			k, _, _ := strings.Cut(part, "=")
			if uk, err := url.QueryUnescape(k); err == nil && uk == name {
				if !done {
					out = append(out, pair)
					done = true
				}
				continue
			}
			out = append(out, part)
		}
	}
	if !done {
		out = append(out, pair)
	}
	s := path + "?" + strings.Join(out, "&")
	if hasFrag {
		s += "#" + frag
	}
	return s
}

// SeqPath finds a message's sequence number: a dot-separated path of JSON object
// fields ("seq", "meta.offset"). An empty path means "count messages instead".
type SeqPath []string

// ParseSeqPath parses a dot-separated path; "" gives the counter.
func ParseSeqPath(s string) (SeqPath, error) {
	if s == "" {
		return nil, nil
	}
	p := strings.Split(s, ".")
	for _, f := range p {
		if f == "" {
			return nil, fmt.Errorf("sequence path %q: empty field", s)
		}
	}
	return p, nil
}

// Counter reports whether messages are counted rather than parsed.
func (p SeqPath) Counter() bool { return len(p) == 0 }

// Extract returns the integer at the path in a JSON object, and false if the data is
// not JSON, the path is missing, or the value is not a non-negative integer (a JSON
// number or a string of digits).
func (p SeqPath) Extract(data []byte) (int64, bool) {
	cur, ok := p.field(data)
	if !ok {
		return 0, false
	}
	cur = bytes.TrimSpace(cur)
	if len(cur) >= 2 && cur[0] == '"' {
		cur = cur[1 : len(cur)-1]
	}
	n, err := strconv.ParseInt(string(cur), 10, 64)
	if err != nil || n < 0 {
		return 0, false
	}
	return n, true
}

// field returns the raw JSON value at the path.
func (p SeqPath) field(data []byte) (json.RawMessage, bool) {
	cur := json.RawMessage(data)
	for _, field := range p {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(cur, &obj); err != nil {
			return nil, false
		}
		v, ok := obj[field]
		if !ok {
			return nil, false
		}
		cur = v
	}
	return cur, true
}

// BadPolicy says what happens to a message whose sequence cannot be parsed (or a
// binary frame when a sequence path is set).
type BadPolicy string

// Policies. Every bad message is counted in the metrics whatever the policy.
const (
	BadCount BadPolicy = "count" // drop it; log the first per session (default)
	BadSkip  BadPolicy = "skip"  // drop it silently
	BadPass  BadPolicy = "pass"  // hand it to the sink flagged bad, without moving last_seq
)

// ParseBadPolicy parses count, skip or pass ("" gives count).
func ParseBadPolicy(s string) (BadPolicy, error) {
	switch BadPolicy(s) {
	case "":
		return BadCount, nil
	case BadCount, BadSkip, BadPass:
		return BadPolicy(s), nil
	}
	return "", fmt.Errorf("bad-message policy %q: want count, skip or pass", s)
}
