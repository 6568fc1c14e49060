// Package tracing is sockfleet's OpenTelemetry setup and the few helpers every part
// uses to carry one ownership trace from its cause to its effect (docs/TRACING.md):
// W3C trace context in the signed wakeup and handoff calls, in the trace_parent
// attribute of the writes that cause a stream record, and the trace id in log lines.
//
// Guarantees: tracing is off — a no-op provider, nothing recorded or exported, no
// trace started — unless OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
// is set, and OTEL_SDK_DISABLED=true turns it off even then. Spans are exported over
// OTLP/HTTP in batches, off the caller's goroutine. The default sampler keeps every
// trace (parentbased_always_on: ownership changes are rare); OTEL_TRACES_SAMPLER
// and OTEL_TRACES_SAMPLER_ARG change it, and the other OTEL_* variables the SDK and
// the OTLP exporter read (headers, timeouts, resource attributes) apply as usual.
//
// Non-guarantees: a span is lost if the process dies before its batch is exported,
// or if the collector is unreachable (the exporter drops, never blocks the caller).
// Trace context is a hint for operators: nothing sockfleet decides depends on it.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
)

// Service names (service.name).
const (
	ServiceReconciler = "sockfleet-reconciler"
	ServiceWorker     = "sockfleet-worker"
)

// Attribute keys (docs/TRACING.md).
const (
	AttrConn            = "sockfleet.conn"
	AttrWorker          = "sockfleet.worker"
	AttrVersion         = "sockfleet.version" // the lease_version (fencing token)
	AttrWakeupAction    = "sockfleet.wakeup.action"
	AttrWakeupResult    = "sockfleet.wakeup.result"
	AttrHandoffPhase    = "sockfleet.handoff.phase"
	AttrHandoffFallback = "sockfleet.handoff.fallback"
	AttrDecision        = "sockfleet.decision"
	AttrCause           = "sockfleet.cause"
)

// Conn, Worker and Version are the attributes every ownership span carries.
func Conn(id string) attribute.KeyValue    { return attribute.String(AttrConn, id) }
func Worker(id string) attribute.KeyValue  { return attribute.String(AttrWorker, id) }
func Version(v int64) attribute.KeyValue   { return attribute.Int64(AttrVersion, v) }
func Cause(why string) attribute.KeyValue  { return attribute.String(AttrCause, why) }
func Decision(d string) attribute.KeyValue { return attribute.String(AttrDecision, d) }
func Phase(p string) attribute.KeyValue    { return attribute.String(AttrHandoffPhase, p) }
func Action(a string) attribute.KeyValue   { return attribute.String(AttrWakeupAction, a) }
func Result(r string) attribute.KeyValue   { return attribute.String(AttrWakeupResult, r) }
func Fallback(on bool) attribute.KeyValue  { return attribute.Bool(AttrHandoffFallback, on) }

// Tracer returns the tracer of package pkg (its path under the module, such as
// "worker/internal/owner"). It asks the global provider at each span's start, so a
// package may keep it in a variable taken before Setup (or a test) sets the provider.
func Tracer(pkg string) trace.Tracer {
	return global{name: "github.com/sockfleet/sockfleet/" + pkg}
}

type global struct {
	embedded.Tracer
	name string
}

func (g global) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	return otel.GetTracerProvider().Tracer(g.name).Start(ctx, name, opts...)
}

// Propagator is the one propagator sockfleet uses: W3C trace context.
var Propagator propagation.TextMapPropagator = propagation.TraceContext{}

// Environment variables Setup reads itself (the SDK and the exporter read the rest).
const (
	EnvEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	EnvDisabled       = "OTEL_SDK_DISABLED"
)

// Enabled reports whether Setup turns tracing on in an environment read by getenv.
func Enabled(getenv func(string) string) bool {
	if strings.EqualFold(strings.TrimSpace(getenv(EnvDisabled)), "true") {
		return false
	}
	return getenv(EnvEndpoint) != "" || getenv(EnvTracesEndpoint) != ""
}

// Setup installs the global tracer provider and propagator for service (one of the
// Service* names) from the standard OTEL_* variables, and returns the shutdown that
// flushes and stops it (call it on a fresh, bounded context at exit). Off (see the
// package doc): a no-op shutdown and no provider. Call from main only.
func Setup(ctx context.Context, service string) (shutdown func(context.Context) error, err error) {
	otel.SetTextMapPropagator(Propagator)
	if !Enabled(os.Getenv) {
		return func(context.Context) error { return nil }, nil
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	// WithFromEnv after the default: OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win.
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", service)),
		resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	// The SDK's default sampler is parentbased_always_on unless OTEL_TRACES_SAMPLER says otherwise.
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	return tp.Shutdown, nil
}

// Flush exports every span ended so far, if tracing is on: the reconciler calls it
// at the end of each invocation, as a Lambda may be frozen until the next.
func Flush(ctx context.Context) error {
	if f, ok := otel.GetTracerProvider().(interface{ ForceFlush(context.Context) error }); ok {
		return f.ForceFlush(ctx)
	}
	return nil
}
