package lease_test

import (
	"context"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sockfleet/sockfleet/shared/lease"
	"github.com/sockfleet/sockfleet/shared/local/tracingtest"
	"github.com/sockfleet/sockfleet/shared/tracing"
	"go.opentelemetry.io/otel"
)

// The writes that cause a stream record the reconciler acts on (a release, a
// transfer, the crash path's release) carry the writer's traceparent as trace_parent,
// in the same write; acquires and checkpoints write none, and a write with no span
// in its context writes none.
func TestTraceParentFoldedIntoReleasesAndTransfers(t *testing.T) {
	tracingtest.Record(t)
	f := newFixture(t)
	s := f.store(nil, 0)
	tr := otel.Tracer("test")
	for _, id := range []string{"r", "t", "a", "u"} {
		f.put(started(id))
	}
	ctx, span := tr.Start(context.Background(), "op")
	defer span.End()
	want := tracing.TraceParent(ctx)

	l, err := s.Acquire(ctx, "r", "w1")
	if err != nil {
		t.Fatal(err)
	}
	if got := traceParent(f, "r"); got != "" {
		t.Fatalf("acquire wrote trace_parent %q", got)
	}
	if _, err := s.Checkpoint(ctx, l, lease.Progress{LastSeq: 4}); err != nil || traceParent(f, "r") != "" {
		t.Fatalf("checkpoint: %v, trace_parent %q", err, traceParent(f, "r"))
	}
	if err := s.Release(ctx, l, lease.Progress{LastSeq: 5}); err != nil || traceParent(f, "r") != want {
		t.Fatalf("release: %v, trace_parent %q, want %q", err, traceParent(f, "r"), want)
	}

	lt, err := s.Acquire(context.Background(), "t", "w1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Transfer(ctx, lt, "w2", lease.Progress{LastSeq: 2}, false); err != nil || traceParent(f, "t") != want {
		t.Fatalf("transfer: %v, trace_parent %q, want %q", err, traceParent(f, "t"), want)
	}

	if _, err := s.Acquire(context.Background(), "a", "dead"); err != nil {
		t.Fatal(err)
	}
	if ids, err := s.ReleaseAllOwnedBy(ctx, "dead"); err != nil || len(ids) != 1 || traceParent(f, "a") != want {
		t.Fatalf("crash release %v: %v, trace_parent %q, want %q", ids, err, traceParent(f, "a"), want)
	}

	lu, err := s.Acquire(context.Background(), "u", "w1")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Release(context.Background(), lu, lease.Progress{}); err != nil || traceParent(f, "u") != "" {
		t.Fatalf("release without a span: %v, trace_parent %q", err, traceParent(f, "u"))
	}
	if c := f.get("r"); c.Owned() || c.LastSeq != 5 {
		t.Fatalf("the traced release is a release like any other: %+v", c)
	}
}

// traceParent is the trace_parent of id's item as stored.
func traceParent(f *fixture, id string) string {
	if v, ok := f.raw(id)[tracing.AttrTraceParent].(*types.AttributeValueMemberS); ok {
		return v.Value
	}
	return ""
}
