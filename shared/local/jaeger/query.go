package jaeger

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Client reads traces from Jaeger's query API (the HTTP JSON API its UI uses).
type Client struct {
	Base string       // e.g. http://127.0.0.1:16686
	HTTP *http.Client // nil: a client with a 10 s timeout
}

// Trace is one trace as the query API returns it.
type Trace struct {
	TraceID   string             `json:"traceID"`
	Spans     []Span             `json:"spans"`
	Processes map[string]Process `json:"processes"`
}

// Span is one span of a Trace. Times are in microseconds since the epoch.
type Span struct {
	TraceID       string      `json:"traceID"`
	SpanID        string      `json:"spanID"`
	OperationName string      `json:"operationName"`
	References    []Reference `json:"references"`
	StartTime     int64       `json:"startTime"`
	Duration      int64       `json:"duration"`
	Tags          []KeyValue  `json:"tags"`
	Logs          []Log       `json:"logs"`
	ProcessID     string      `json:"processID"`
}

// Reference ties a span to another: CHILD_OF for its parent, FOLLOWS_FROM for a
// span link.
type Reference struct {
	RefType string `json:"refType"`
	TraceID string `json:"traceID"`
	SpanID  string `json:"spanID"`
}

// KeyValue is an attribute; Value keeps its JSON type (string, number, bool).
type KeyValue struct {
	Key   string `json:"key"`
	Type  string `json:"type"`
	Value any    `json:"value"`
}

// Log is a span event.
type Log struct {
	Timestamp int64      `json:"timestamp"`
	Fields    []KeyValue `json:"fields"`
}

// Process is the resource a span came from.
type Process struct {
	ServiceName string     `json:"serviceName"`
	Tags        []KeyValue `json:"tags"`
}

// Tag returns the span's attribute key, formatted as text, and whether it is set.
func (s Span) Tag(key string) (string, bool) {
	for _, kv := range s.Tags {
		if kv.Key == key {
			return fmt.Sprint(kv.Value), true
		}
	}
	return "", false
}

// Start is when the span started.
func (s Span) Start() time.Time { return time.UnixMicro(s.StartTime) }

// Event reports whether the span has an event (a log) with this name.
func (s Span) Event(name string) bool {
	for _, l := range s.Logs {
		for _, f := range l.Fields {
			if f.Key == "event" && fmt.Sprint(f.Value) == name {
				return true
			}
		}
	}
	return false
}

// Service is the service.name of the process that sent span s of t.
func (t Trace) Service(s Span) string { return t.Processes[s.ProcessID].ServiceName }

// Query selects traces: those with a span of Service that has every one of Tags.
type Query struct {
	Service   string
	Operation string            // optional
	Tags      map[string]string // optional
	Since     time.Time         // zero: the last hour
	Limit     int               // zero: 100
}

// Traces returns the traces that match q, most recent first, as the query API
// orders them.
func (c *Client) Traces(ctx context.Context, q Query) ([]Trace, error) {
	if q.Service == "" {
		return nil, fmt.Errorf("jaeger query: a service is required")
	}
	v := url.Values{"service": {q.Service}}
	if q.Operation != "" {
		v.Set("operation", q.Operation)
	}
	if len(q.Tags) > 0 {
		tags, err := json.Marshal(q.Tags)
		if err != nil {
			return nil, err
		}
		v.Set("tags", string(tags))
	}
	since := q.Since
	if since.IsZero() {
		since = time.Now().Add(-time.Hour)
	}
	v.Set("start", strconv.FormatInt(since.UnixMicro(), 10))
	v.Set("end", strconv.FormatInt(time.Now().Add(time.Minute).UnixMicro(), 10))
	limit := q.Limit
	if limit == 0 {
		limit = 100
	}
	v.Set("limit", strconv.Itoa(limit))
	var out struct {
		Data   []Trace `json:"data"`
		Errors []struct {
			Code int    `json:"code"`
			Msg  string `json:"msg"`
		} `json:"errors"`
	}
	if err := c.get(ctx, "/api/traces?"+v.Encode(), &out); err != nil {
		return nil, err
	}
	if len(out.Errors) > 0 {
		return out.Data, fmt.Errorf("jaeger query: %d: %s", out.Errors[0].Code, out.Errors[0].Msg)
	}
	return out.Data, nil
}

// Trace returns one trace by id.
func (c *Client) Trace(ctx context.Context, id string) (Trace, error) {
	var out struct {
		Data []Trace `json:"data"`
	}
	if err := c.get(ctx, "/api/traces/"+url.PathEscape(id), &out); err != nil {
		return Trace{}, err
	}
	if len(out.Data) != 1 {
		return Trace{}, fmt.Errorf("jaeger query: trace %s: got %d traces", id, len(out.Data))
	}
	return out.Data[0], nil
}

func (c *Client) get(ctx context.Context, path string, dst any) error {
	client := c.HTTP
	if client == nil {
		client = &http.Client{Timeout: 10 * time.Second}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.Base+path, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("jaeger query: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("jaeger query: %w", err)
	}
	// A trace id that is not stored is a 404 with a JSON error body.
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("jaeger query %s: %s: %.300s", path, resp.Status, body)
	}
	if err := json.Unmarshal(body, dst); err != nil {
		return fmt.Errorf("jaeger query %s: %w", path, err)
	}
	return nil
}

// SearchURL is the Jaeger UI page that lists the traces with a span of service
// carrying every one of tags, most recent first: from a connection id to its
// ownership traces in one click.
func SearchURL(ui, service string, tags map[string]string) string {
	v := url.Values{"service": {service}, "lookback": {"2d"}, "limit": {"20"}}
	if len(tags) > 0 {
		b, _ := json.Marshal(tags) // a map of strings always encodes
		v.Set("tags", string(b))
	}
	return ui + "/search?" + v.Encode()
}

// QueryURL is the query API's answer to the same search as SearchURL: the traces
// as JSON, most recent first, which a browser shows as it is.
func QueryURL(ui, service string, tags map[string]string) string {
	v := url.Values{"service": {service}, "limit": {"20"}} // over Jaeger's default lookback, 2 days
	if len(tags) > 0 {
		b, _ := json.Marshal(tags) // a map of strings always encodes
		v.Set("tags", string(b))
	}
	return ui + "/api/traces?" + v.Encode()
}

// TraceURL is the Jaeger UI page of one trace.
func TraceURL(ui, traceID string) string { return ui + "/trace/" + url.PathEscape(traceID) }
