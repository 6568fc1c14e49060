package records

import (
	"github.com/aws/aws-lambda-go/events"
	"github.com/sockfleet/sockfleet/shared/tracing"
	"go.opentelemetry.io/otel/trace"
)

// TraceParent returns the span that caused r, when the write r records carried one:
// its new image has a trace_parent (tracing.AttrTraceParent) that parses and differs
// from the old image's. An unchanged trace_parent was left by an earlier write (a
// release long ago) and says nothing of this one; a malformed one is ignored.
func TraceParent(r events.DynamoDBEventRecord) (trace.SpanContext, bool) {
	tp := str(r.Change.NewImage, tracing.AttrTraceParent)
	if tp == "" || tp == str(r.Change.OldImage, tracing.AttrTraceParent) {
		return trace.SpanContext{}, false
	}
	return tracing.Remote(tp)
}

func str(img map[string]events.DynamoDBAttributeValue, name string) string {
	v, ok := img[name]
	if !ok || v.DataType() != events.DataTypeString {
		return ""
	}
	return v.String()
}
