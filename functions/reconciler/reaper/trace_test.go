package reaper_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/local/tracingtest"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/shared/tracing"
)

// A member declared dead is one reaper.release span (cause member_dead, the member,
// the declaration and each release as events), whose releases carry it as
// trace_parent; a pass that finds nothing to do makes no span.
func TestDeadMemberSpan(t *testing.T) {
	sr := tracingtest.Record(t)
	f := setup(t)
	f.join("hung", "i1", f.now.Add(-skew-time.Millisecond))
	f.join("live", "i2", f.now.Add(10*time.Second))
	f.own("a", "hung")
	f.own("c", "live")
	if _, _, err := f.reaper(nil).Reap(f.ctx, f.now); err != nil {
		t.Fatal(err)
	}
	spans := tracingtest.Named(sr.Ended(), "reaper.release")
	if len(spans) != 1 {
		t.Fatalf("%d reaper.release spans, want 1", len(spans))
	}
	s := spans[0]
	a := tracingtest.Attrs(s.Attributes())
	events := map[string]string{}
	for _, ev := range s.Events() {
		events[ev.Name] = tracingtest.Attrs(ev.Attributes)[tracing.AttrConn]
	}
	if a[tracing.AttrCause] != "member_dead" || a[tracing.AttrWorker] != "hung" || a["sockfleet.released"] != "1" ||
		events["released"] != "a" || len(events) != 2 {
		t.Fatalf("span attributes %v, events %v", a, s.Events())
	}
	out, err := f.e.DB.GetItem(context.Background(), &dynamodb.GetItemInput{TableName: &f.e.Table, ConsistentRead: aws.Bool(true),
		Key: map[string]types.AttributeValue{schema.AttrPK: codec.S(schema.ConnKey("a"))}})
	if err != nil {
		t.Fatal(err)
	}
	if tp, _ := out.Item[tracing.AttrTraceParent].(*types.AttributeValueMemberS); tp == nil ||
		!strings.Contains(tp.Value, s.SpanContext().SpanID().String()) {
		t.Fatalf("released item's trace_parent %v; want the reaper.release span", out.Item[tracing.AttrTraceParent])
	}
	n := len(sr.Started())
	if _, _, err := f.reaper(nil).Reap(f.ctx, f.now); err != nil || len(sr.Started()) != n {
		t.Fatalf("a pass with nothing to do: %v, %d new spans", err, len(sr.Started())-n)
	}
}
