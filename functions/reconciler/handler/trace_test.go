package handler

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/aws/aws-lambda-go/events"
	"github.com/sockfleet/sockfleet/shared/local/tracingtest"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/tracing"
	"github.com/sockfleet/sockfleet/shared/wakeup"
)

const causeTP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

func releasedRecord(t *testing.T, oldTP, newTP string) events.DynamoDBEvent {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "records", "testdata", "released.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ev events.DynamoDBEvent
	if err := json.Unmarshal(raw, &ev); err != nil {
		t.Fatal(err)
	}
	for _, set := range []struct {
		img map[string]events.DynamoDBAttributeValue
		tp  string
	}{{ev.Records[0].Change.OldImage, oldTP}, {ev.Records[0].Change.NewImage, newTP}} {
		if set.tp != "" {
			set.img[tracing.AttrTraceParent] = events.NewStringAttribute(set.tp)
		}
	}
	return ev
}

// A record whose write carried a new trace_parent is a child of that write's span,
// linked to its batch; without one (or with the one an earlier write left), a child
// of its batch. The wakeup it asks for is the record's child.
func TestRecordSpanJoinsTheWritersTrace(t *testing.T) {
	for _, c := range []struct {
		name         string
		oldTP, newTP string
		joins        bool
	}{
		{"new trace_parent", "", causeTP, true},
		{"none", "", "", false},
		{"left by an earlier write", causeTP, causeTP, false},
		{"malformed", "", "00-junk", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			sr := tracingtest.Record(t)
			r := newRig(t, worker("w1", 0))
			r.sender.by["w1:8080"] = wakeup.Acquired
			if _, err := r.h.HandleStream(context.Background(), releasedRecord(t, c.oldTP, c.newTP)); err != nil {
				t.Fatal(err)
			}
			batch, rec := tracingtest.Named(sr.Ended(), "reconcile.batch"), tracingtest.Named(sr.Ended(), "reconcile.record")
			if len(batch) != 1 || len(rec) != 1 {
				t.Fatalf("%d batch and %d record spans; want one each", len(batch), len(rec))
			}
			cause, _ := tracing.Remote(causeTP)
			joined := rec[0].Parent().SpanID() == cause.SpanID() && rec[0].SpanContext().TraceID() == cause.TraceID() &&
				len(rec[0].Links()) == 1 && rec[0].Links()[0].SpanContext.SpanID() == batch[0].SpanContext().SpanID()
			under := rec[0].Parent().SpanID() == batch[0].SpanContext().SpanID()
			if joined != c.joins || under == c.joins {
				t.Fatalf("record span: joins the writer's trace %v, under its batch %v; want joins %v", joined, under, c.joins)
			}
			if a := tracingtest.Attrs(rec[0].Attributes()); a[tracing.AttrConn] == "" || a[tracing.AttrDecision] != "needs_owner" ||
				a[tracing.AttrCause] != "released" || a[tracing.AttrWakeupResult] != "acquired" || a[tracing.AttrWorker] != "w1" {
				t.Fatalf("record span attributes %v", a)
			}
		})
	}
}

// A batch of heartbeats (every renew interval, from every worker) makes no span.
func TestHeartbeatBatchMakesNoSpan(t *testing.T) {
	sr := tracingtest.Record(t)
	r := newRig(t, worker("w1", 0))
	beat := events.DynamoDBEvent{Records: []events.DynamoDBEventRecord{record("MODIFY", schema.WorkerKey("w1"), nil)}}
	if _, err := r.h.HandleStream(context.Background(), beat); err != nil {
		t.Fatal(err)
	}
	if n := len(sr.Started()); n != 0 {
		t.Fatalf("%d spans for a heartbeat batch", n)
	}
}
