package jaeger_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sockfleet/sockfleet/shared/local/jaeger"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

func start(t *testing.T) *jaeger.Proc {
	t.Helper()
	j, err := jaeger.Start(jaeger.Options{Log: t.Output()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(j.Stop)
	return j
}

// Spans sent with the OpenTelemetry SDK's OTLP/HTTP exporter, as the workers and the
// reconciler send theirs, come back from the query API: found by service and
// attribute, with their parent and link as references, their attributes and events,
// and the service each came from.
func TestSpansRoundTrip(t *testing.T) {
	j := start(t)
	ctx := context.Background()
	send := func(service string, spans func(trace.Tracer)) {
		exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(j.OTLPEndpoint+"/v1/traces"))
		if err != nil {
			t.Fatal(err)
		}
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp),
			sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", service))))
		spans(tp.Tracer("test"))
		if err := tp.Shutdown(ctx); err != nil { // flushes
			t.Fatal(err)
		}
	}
	var parent, linked trace.SpanContext
	send("test-reconciler", func(tr trace.Tracer) {
		_, s := tr.Start(ctx, "reaper.release", trace.WithAttributes(attribute.String("sockfleet.cause", "task_stopped")))
		linked = s.SpanContext()
		s.End()
		_, s = tr.Start(ctx, "wakeup.send", trace.WithAttributes(attribute.String("sockfleet.conn", "c-1")))
		parent = s.SpanContext()
		s.End()
	})
	send("test-worker", func(tr trace.Tracer) {
		pctx := trace.ContextWithRemoteSpanContext(ctx, parent)
		_, s := tr.Start(pctx, "wakeup.handle", trace.WithLinks(trace.Link{SpanContext: linked}),
			trace.WithAttributes(attribute.String("sockfleet.conn", "c-1"), attribute.Int("sockfleet.version", 7)))
		s.AddEvent("first_delivery")
		s.End()
	})

	c := j.Client()
	var got []jaeger.Trace
	deadline := time.Now().Add(10 * time.Second)
	for {
		var err error
		got, err = c.Traces(ctx, jaeger.Query{Service: "test-worker", Tags: map[string]string{"sockfleet.conn": "c-1"}})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) > 0 && len(got[0].Spans) == 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(got) != 1 {
		t.Fatalf("got %d traces for sockfleet.conn=c-1, want 1", len(got))
	}
	tr := got[0]
	if tr.TraceID != parent.TraceID().String() {
		t.Errorf("trace %s, want the wakeup's %s", tr.TraceID, parent.TraceID())
	}
	byName := map[string]jaeger.Span{}
	for _, s := range tr.Spans {
		byName[s.OperationName] = s
	}
	h, ok := byName["wakeup.handle"]
	if !ok || len(tr.Spans) != 2 {
		t.Fatalf("spans %v, want wakeup.send and wakeup.handle", tr.Spans)
	}
	if got := tr.Service(h); got != "test-worker" {
		t.Errorf("wakeup.handle from %q, want test-worker", got)
	}
	if got := tr.Service(byName["wakeup.send"]); got != "test-reconciler" {
		t.Errorf("wakeup.send from %q, want test-reconciler", got)
	}
	refs := map[string]string{}
	for _, r := range h.References {
		refs[r.RefType] = r.SpanID
	}
	if refs["CHILD_OF"] != parent.SpanID().String() || refs["FOLLOWS_FROM"] != linked.SpanID().String() {
		t.Errorf("references %+v, want CHILD_OF %s and FOLLOWS_FROM %s", h.References, parent.SpanID(), linked.SpanID())
	}
	if v, _ := h.Tag("sockfleet.version"); v != "7" {
		t.Errorf("sockfleet.version = %q, want 7", v)
	}
	if !h.Event("first_delivery") || h.Event("rotation") {
		t.Errorf("events %+v, want first_delivery only", h.Logs)
	}
	if _, err := c.Trace(ctx, tr.TraceID); err != nil {
		t.Error(err)
	}
	if _, err := c.Trace(ctx, strings.Repeat("ab", 16)); err == nil {
		t.Error("a trace id never sent was found")
	}
	// The viewer: a connection's page shows its trace, both services' spans, with
	// attributes and events; an unknown connection is a 404.
	srv := httptest.NewServer((&jaeger.Viewer{Client: c, Services: []string{"test-reconciler", "test-worker"}}).Handler())
	defer srv.Close()
	body := get(t, jaeger.ConnURL(srv.URL, "c-1"), http.StatusOK)
	for _, want := range []string{tr.TraceID, "wakeup.send", "wakeup.handle", "test-reconciler", "sockfleet.version=7", "first_delivery",
		`href="/trace/` + linked.TraceID().String()} {
		if !strings.Contains(body, want) {
			t.Errorf("the page of c-1 lacks %q:\n%s", want, body)
		}
	}
	if body := get(t, srv.URL+"/trace/"+tr.TraceID, http.StatusOK); !strings.Contains(body, "wakeup.handle") {
		t.Errorf("the trace page lacks its spans:\n%s", body)
	}
	get(t, jaeger.ConnURL(srv.URL, "nope"), http.StatusNotFound)
	// Another service's spans do not match.
	none, err := c.Traces(ctx, jaeger.Query{Service: "test-worker", Tags: map[string]string{"sockfleet.conn": "c-2"}})
	if err != nil || len(none) != 0 {
		t.Errorf("sockfleet.conn=c-2: %d traces, %v; want none", len(none), err)
	}
}

func get(t *testing.T, url string, status int) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != status {
		t.Errorf("GET %s: %s, want %d: %s", url, resp.Status, status, b)
	}
	return string(b)
}

func TestQueryNeedsAService(t *testing.T) {
	c := &jaeger.Client{Base: "http://127.0.0.1:1"}
	if _, err := c.Traces(context.Background(), jaeger.Query{}); err == nil || !strings.Contains(err.Error(), "service") {
		t.Errorf("err = %v, want one naming the missing service", err)
	}
}

// The UI link carries the service and the attribute as the UI's search form does.
func TestSearchURL(t *testing.T) {
	u, err := url.Parse(jaeger.SearchURL("http://127.0.0.1:16686", "sockfleet-worker", map[string]string{"sockfleet.conn": `a"b`}))
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	var tags map[string]string
	if err := json.Unmarshal([]byte(q.Get("tags")), &tags); err != nil || tags["sockfleet.conn"] != `a"b` {
		t.Errorf("tags %q (%v), want the connection id as JSON", q.Get("tags"), err)
	}
	if u.Path != "/search" || q.Get("service") != "sockfleet-worker" {
		t.Errorf("url %s", u)
	}
}

func TestStartRefusesBadOptions(t *testing.T) {
	if _, err := jaeger.Start(jaeger.Options{Bin: "/bin/true", OTLPPort: -1}); err == nil {
		t.Error("a negative port was accepted")
	}
	if _, err := jaeger.Start(jaeger.Options{Bin: "/nonexistent/jaeger"}); err == nil {
		t.Error("a missing binary started")
	}
}

// Without the binary, the error says how to build it.
func TestMissingBinaryNamesMakeLocalTools(t *testing.T) {
	t.Chdir(t.TempDir())
	t.Setenv(jaeger.BinEnv, "")
	os.Unsetenv(jaeger.BinEnv)
	if _, err := jaeger.FindBin(); err == nil || !strings.Contains(err.Error(), "make local-tools") {
		t.Errorf("err = %v, want one naming make local-tools", err)
	}
}

// Two instances on free ports run side by side, and a fixed port in use is an error.
func TestSideBySideAndPortInUse(t *testing.T) {
	a, b := start(t), start(t)
	if a.UI == b.UI || a.OTLPEndpoint == b.OTLPEndpoint {
		t.Fatalf("same ports: %s %s", a.UI, b.UI)
	}
	port := func(u string) int {
		p, _ := url.Parse(u)
		var n int
		for _, r := range p.Port() {
			n = n*10 + int(r-'0')
		}
		return n
	}
	if _, err := jaeger.Start(jaeger.Options{QueryPort: port(a.UI), OTLPPort: port(a.OTLPEndpoint), Ready: 5 * time.Second}); err == nil {
		t.Error("started on ports in use")
	}
}

// Jaeger traces nothing of its own: with an OTLP endpoint in its environment, as a
// developer's shell may have, it never dials it (its query API would otherwise
// export its own spans there over gRPC, and log each failed dial).
func TestJaegerExportsNoTelemetryOfItsOwn(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dialed := make(chan struct{}, 1)
	go func() {
		if c, err := l.Accept(); err == nil {
			c.Close()
			dialed <- struct{}{}
		}
	}()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+l.Addr().String())
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
	j := start(t)
	for range 5 { // query calls, which a tracing query API makes spans of
		if _, err := j.Client().Traces(context.Background(), jaeger.Query{Service: "nobody"}); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-dialed:
		t.Error("Jaeger dialed the OTLP endpoint of its environment: it exports telemetry of its own")
	case <-time.After(2 * time.Second):
	}
}
