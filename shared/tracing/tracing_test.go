package tracing_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sockfleet/sockfleet/shared/local/tracingtest"
	"github.com/sockfleet/sockfleet/shared/tracing"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

func TestEnabled(t *testing.T) {
	for _, c := range []struct {
		env  map[string]string
		want bool
	}{
		{nil, false},
		{map[string]string{tracing.EnvEndpoint: "http://127.0.0.1:4318"}, true},
		{map[string]string{tracing.EnvTracesEndpoint: "http://127.0.0.1:4318/v1/traces"}, true},
		{map[string]string{tracing.EnvEndpoint: "http://127.0.0.1:4318", tracing.EnvDisabled: "true"}, false},
		{map[string]string{tracing.EnvEndpoint: "http://127.0.0.1:4318", tracing.EnvDisabled: " TRUE "}, false},
		{map[string]string{tracing.EnvEndpoint: "http://127.0.0.1:4318", tracing.EnvDisabled: "false"}, true},
		{map[string]string{tracing.EnvDisabled: "false"}, false},
	} {
		if got := tracing.Enabled(func(k string) string { return c.env[k] }); got != c.want {
			t.Errorf("%v: enabled %v, want %v", c.env, got, c.want)
		}
	}
}

// Off: no provider is installed, spans are not recorded, nothing carries context.
func TestSetupOffInstallsNothing(t *testing.T) {
	t.Setenv(tracing.EnvEndpoint, "")
	t.Setenv(tracing.EnvTracesEndpoint, "")
	otel.SetTracerProvider(noop.NewTracerProvider())
	shutdown, err := tracing.Setup(context.Background(), tracing.ServiceWorker)
	if err != nil {
		t.Fatal(err)
	}
	ctx, span := tracing.Tracer("shared/tracing").Start(context.Background(), "x")
	if span.IsRecording() || tracing.TraceParent(ctx) != "" {
		t.Fatal("tracing off, yet a span records or a traceparent is produced")
	}
	if err := tracing.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// On: spans are exported over OTLP/HTTP to the endpoint, with the service name, at Flush.
func TestSetupExportsOverOTLPHTTP(t *testing.T) {
	var mu sync.Mutex
	var bodies [][]byte
	var types []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies, types = append(bodies, b), append(types, r.URL.Path+" "+r.Header.Get("Content-Type"))
		mu.Unlock()
	}))
	defer srv.Close()
	t.Setenv(tracing.EnvEndpoint, srv.URL)
	t.Setenv(tracing.EnvDisabled, "")
	t.Setenv("OTEL_SERVICE_NAME", "")
	t.Cleanup(func() { otel.SetTracerProvider(noop.NewTracerProvider()) })
	shutdown, err := tracing.Setup(context.Background(), tracing.ServiceReconciler)
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(context.Background())
	ctx, span := tracing.Tracer("shared/tracing").Start(context.Background(), "reconcile.batch")
	if !span.SpanContext().IsSampled() || tracing.TraceParent(ctx) == "" {
		t.Fatal("the default sampler did not sample a root span")
	}
	span.End()
	fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := tracing.Flush(fctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bodies) != 1 || types[0] != "/v1/traces application/x-protobuf" ||
		!bytes.Contains(bodies[0], []byte("reconcile.batch")) || !bytes.Contains(bodies[0], []byte(tracing.ServiceReconciler)) {
		t.Fatalf("exports %q: want one protobuf POST to /v1/traces naming the span and the service", types)
	}
}

func TestRemoteAndHeaders(t *testing.T) {
	tracingtest.Record(t)
	ctx, span := tracing.Tracer("shared/tracing").Start(context.Background(), "x")
	defer span.End()
	tp := tracing.TraceParent(ctx)
	sc, ok := tracing.Remote(tp)
	if !ok || sc.SpanID() != span.SpanContext().SpanID() || !sc.IsRemote() {
		t.Fatalf("Remote(%q) = %v, %v", tp, sc, ok)
	}
	h := http.Header{}
	tracing.Inject(ctx, h)
	if got := trace.SpanContextFromContext(tracing.Extract(context.Background(), h)); got.SpanID() != span.SpanContext().SpanID() {
		t.Fatalf("Extract after Inject: %v", got)
	}
	for _, bad := range []string{"", "junk", "00-00000000000000000000000000000000-b7ad6b7169203331-01",
		"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" + strings.Repeat("x", 100)} {
		if _, ok := tracing.Remote(bad); ok {
			t.Errorf("Remote(%q) accepted", bad)
		}
	}
}

// A log line written with a context carrying a span has its trace and span ids.
func TestLogHandlerAddsTraceIDs(t *testing.T) {
	tracingtest.Record(t)
	var buf bytes.Buffer
	log := slog.New(tracing.LogHandler(slog.NewJSONHandler(&buf, nil))).With("k", "v")
	ctx, span := tracing.Tracer("shared/tracing").Start(context.Background(), "x")
	defer span.End()
	log.InfoContext(ctx, "with")
	log.Info("without")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	var with, without map[string]any
	if len(lines) != 2 || json.Unmarshal([]byte(lines[0]), &with) != nil || json.Unmarshal([]byte(lines[1]), &without) != nil {
		t.Fatalf("log lines %q", lines)
	}
	if with[tracing.LogTraceID] != span.SpanContext().TraceID().String() || with[tracing.LogSpanID] != span.SpanContext().SpanID().String() || with["k"] != "v" {
		t.Fatalf("line with a span: %v", with)
	}
	if _, ok := without[tracing.LogTraceID]; ok {
		t.Fatalf("line without a span has a trace id: %v", without)
	}
}

// FirstDelivery marks the session span once it is called, and only under a recording span.
func TestFirstDelivery(t *testing.T) {
	sr := tracingtest.Record(t)
	tr := tracing.Tracer("shared/tracing")
	tracing.FirstDelivery(context.Background(), tr, time.Now(), "c1", 7, 3)
	if n := len(sr.Ended()); n != 0 {
		t.Fatalf("%d spans without a session span", n)
	}
	ctx, session := tr.Start(context.Background(), "connection.session")
	start := time.Now().Add(-time.Millisecond)
	tracing.FirstDelivery(ctx, tr, start, "c1", 7, 3)
	session.End()
	fd := tracingtest.Named(sr.Ended(), "sink.first_delivery")
	if len(fd) != 1 || fd[0].Parent().SpanID() != session.SpanContext().SpanID() || !fd[0].StartTime().Equal(start) {
		t.Fatalf("first delivery spans %v", fd)
	}
	if a := tracingtest.Attrs(fd[0].Attributes()); a[tracing.AttrConn] != "c1" || a[tracing.AttrVersion] != "7" {
		t.Fatalf("attributes %v", a)
	}
	ss := tracingtest.Named(sr.Ended(), "connection.session")
	if len(ss) != 1 || len(ss[0].Events()) != 1 || ss[0].Events()[0].Name != "first_delivery" {
		t.Fatalf("session events %v", ss)
	}
}

// Remote reads trace_parent from items an operator can edit: it never panics, and
// what it accepts is a valid remote span context with the ids written in it.
func FuzzRemote(f *testing.F) {
	for _, s := range []string{"", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "00-junk", "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sc, ok := tracing.Remote(s)
		if !ok {
			return
		}
		if !sc.IsValid() || !sc.IsRemote() {
			t.Fatalf("Remote(%q) accepted an invalid or local span context", s)
		}
		if l := strings.ToLower(s); !strings.Contains(l, sc.TraceID().String()) || !strings.Contains(l, sc.SpanID().String()) {
			t.Fatalf("Remote(%q) read ids %s %s that are not in it", s, sc.TraceID(), sc.SpanID())
		}
	})
}
