package handler

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/sockfleet/sockfleet/functions/reconciler/reaper"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/shared/wakeup"
)

// fakeMembers is the membership registry: it lists the rig's workers and records
// declarations and tombstones.
type fakeMembers struct {
	*fakeRegistry
	declared, tombstoned []string
}

func (f *fakeMembers) DeclareDead(_ context.Context, w codec.Worker, _ time.Time, _ time.Duration) (bool, error) {
	f.declared = append(f.declared, w.ID)
	return true, nil
}

func (f *fakeMembers) Tombstone(_ context.Context, id string, _ time.Time) (bool, error) {
	f.tombstoned = append(f.tombstoned, id)
	return true, nil
}

func record(event, pk string, img map[string]events.DynamoDBAttributeValue) events.DynamoDBEventRecord {
	return events.DynamoDBEventRecord{EventName: event, EventSource: "aws:dynamodb", Change: events.DynamoDBStreamRecord{
		Keys: map[string]events.DynamoDBAttributeValue{schema.AttrPK: events.NewStringAttribute(pk)}, NewImage: img,
		SequenceNumber: "1"}}
}

// A worker heartbeat record drives dead-member detection, at most once per interval;
// a connection record naming an owner with no registry item gets it a tombstone.
func TestHeartbeatsDriveDeadMemberDetection(t *testing.T) {
	hung := codec.Worker{ID: "hung", Addr: "hung:8080", Capacity: 10, Incarnation: "i",
		HeartbeatExpiresAtMs: now.Add(-10 * time.Second).UnixMilli()}
	r := newRig(t, worker("w1", 0), hung)
	r.leases.allow = true
	fm := &fakeMembers{fakeRegistry: r.reg}
	r.h.d.Members = &reaper.Reaper{Registry: fm, Leases: r.leases, Skew: 2 * time.Second}
	beat := events.DynamoDBEvent{Records: []events.DynamoDBEventRecord{record("MODIFY", schema.WorkerKey("w1"), nil)}}
	if _, err := r.h.HandleStream(context.Background(), beat); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(fm.declared, []string{"hung"}) || !slices.Equal(r.leases.calls, []string{"hung"}) {
		t.Fatalf("declared %v, released for %v", fm.declared, r.leases.calls)
	}
	// Another heartbeat within the interval does not list the registry again.
	if _, err := r.h.HandleStream(context.Background(), beat); err != nil {
		t.Fatal(err)
	}
	if len(fm.declared) != 1 {
		t.Fatalf("reaped twice within the interval: %v", fm.declared)
	}
	// An INSERT that names a ghost owner (a console edit).
	img := map[string]events.DynamoDBAttributeValue{
		schema.AttrPK:           events.NewStringAttribute(schema.ConnKey("x")),
		schema.AttrDesiredState: events.NewStringAttribute(string(schema.Started)),
		schema.AttrWSURL:        events.NewStringAttribute("ws://h/x"),
		schema.AttrLeaseOwner:   events.NewStringAttribute("ghost"),
		schema.AttrLeaseExpires: events.NewNumberAttribute("9999999999999"),
		schema.AttrLeaseVersion: events.NewNumberAttribute("1"),
	}
	ins := events.DynamoDBEvent{Records: []events.DynamoDBEventRecord{record("INSERT", schema.ConnKey("x"), img)}}
	if _, err := r.h.HandleStream(context.Background(), ins); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(fm.tombstoned, []string{"ghost"}) {
		t.Fatalf("tombstoned %v, want the ghost owner", fm.tombstoned)
	}
	// An owner that is a live member is not reaped: it is asked whether it runs the
	// item (no acquire inserts one), and one that does keeps it.
	img[schema.AttrLeaseOwner] = events.NewStringAttribute("w1")
	r.sender.by["w1:8080"] = wakeup.AlreadyOwned
	calls := len(r.leases.calls)
	if _, err := r.h.HandleStream(context.Background(), ins); err != nil {
		t.Fatal(err)
	}
	if len(fm.tombstoned) != 1 || len(fm.declared) != 1 || len(r.leases.calls) != calls {
		t.Fatalf("acted on a live owner: %v %v %v", fm.tombstoned, fm.declared, r.leases.calls)
	}
	if c := r.sender.calls["w1:8080"]; len(c) != 1 || c[0].Reason != wakeup.Check {
		t.Fatalf("the named live owner was not asked: %+v", c)
	}
}
