package handler

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/aws/aws-lambda-go/events"
	"github.com/sockfleet/sockfleet/shared/wakeup"
)

type image = map[string]events.DynamoDBAttributeValue

func conn(state, owner, exp, version string) image {
	im := image{
		"Pk": events.NewStringAttribute("CONN#c1"), "desired_state": events.NewStringAttribute(state),
		"ws_url": events.NewStringAttribute("wss://feed.example/s"), "lease_expires_at_ms": events.NewNumberAttribute(exp),
		"lease_version": events.NewNumberAttribute(version),
	}
	if owner != "" {
		im["lease_owner"] = events.NewStringAttribute(owner)
	}
	return im
}

func modify(seq string, old, cur image) events.DynamoDBEvent {
	return events.DynamoDBEvent{Records: []events.DynamoDBEventRecord{{
		EventName: "MODIFY", EventSource: "aws:dynamodb",
		Change: events.DynamoDBStreamRecord{SequenceNumber: seq, Keys: image{"Pk": events.NewStringAttribute("CONN#c1")},
			OldImage: old, NewImage: cur},
	}}}
}

const held = "1764680060000"

// A stale image left the item released at a lower version: the holder is asked first;
// once it says it does not hold it, the connection is offered to a worker.
func TestStaleReleasedImageIsOfferedOnceTheHolderLetGo(t *testing.T) {
	r := newRig(t, worker("w1", 5), worker("w2", 1))
	r.sender.by["w1:8080"] = wakeup.LostRace
	r.sender.by["w2:8080"] = wakeup.Acquired
	resp, err := r.h.HandleStream(context.Background(), modify("s1", conn("STARTED", "w1", held, "5"), conn("STARTED", "", "0", "3")))
	if err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("%+v, %v", resp, err)
	}
	if got := r.sender.calls["w1:8080"]; len(got) != 1 || got[0] != (wakeup.Conn{ID: "c1", LeaseVersion: 5, Reason: wakeup.Check}) {
		t.Errorf("holder got %+v", got)
	}
	// The offer carries the holder's version (5), not the stale image's (3), as the
	// floor of the next acquire.
	// The stale image's old unheld mark is restarted before the holder is asked.
	if want := []string{"c1@3"}; !reflect.DeepEqual(r.leases.marked, want) {
		t.Errorf("marks restarted %v, want %v", r.leases.marked, want)
	}
	want := []wakeup.Conn{{ID: "c1", LeaseVersion: 5, Reason: wakeup.NeedsOwner}}
	if got := r.sender.calls["w2:8080"]; !reflect.DeepEqual(got, want) {
		t.Errorf("w2 got %+v, want %+v", got, want)
	}
}

// A stale image left another worker's lease on the item, and the holder is not a
// live member: the stale lease is released, conditioned on exactly what it showed.
func TestStaleOwnedImageIsReleasedWhenTheHolderIsGone(t *testing.T) {
	r := newRig(t, worker("w2", 1)) // w1, the holder, is not in the registry
	r.leases.allow = true
	resp, err := r.h.HandleStream(context.Background(), modify("s2", conn("STARTED", "w1", held, "5"), conn("STOPPED", "w0", held, "3")))
	if err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("%+v, %v", resp, err)
	}
	if want := []string{"stale c1 w0@3 over 5"}; !reflect.DeepEqual(r.leases.calls, want) {
		t.Errorf("lease calls %v, want %v", r.leases.calls, want)
	}
}

// A holder that still holds the lease has taken it back itself: nothing to repair
// (the strict fake fails on any lease call).
func TestStaleImageTakenBackByTheHolder(t *testing.T) {
	r := newRig(t, worker("w1", 5))
	r.sender.by["w1:8080"] = wakeup.AlreadyOwned
	resp, err := r.h.HandleStream(context.Background(), modify("s3", conn("STARTED", "w1", held, "5"), conn("STARTED", "", "0", "3")))
	if err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("%+v, %v", resp, err)
	}
	if len(r.sender.calls["w1:8080"]) != 1 {
		t.Errorf("holder calls %+v", r.sender.calls)
	}
}

// An unowned item with a lowercase "started": the problem goes on the item; if that
// write fails, the record is retried.
func TestInvalidItemIsReportedOnTheItem(t *testing.T) {
	r := newRig(t, worker("w1", 0))
	r.leases.allow = true
	old, cur := conn("STOPPED", "", "0", "3"), conn("started", "", "0", "3")
	resp, err := r.h.HandleStream(context.Background(), modify("s4", old, cur))
	if err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("%+v, %v", resp, err)
	}
	want := []string{`invalid c1: invalid desired_state "started": want STARTED or STOPPED`}
	if !reflect.DeepEqual(r.leases.calls, want) {
		t.Errorf("lease calls %v, want %v", r.leases.calls, want)
	}

	r.leases.err = errors.New("table down")
	resp, _ = r.h.HandleStream(context.Background(), modify("s5", old, cur))
	if len(resp.BatchItemFailures) != 1 || resp.BatchItemFailures[0].ItemIdentifier != "s5" {
		t.Errorf("failures %+v, want s5 retried", resp.BatchItemFailures)
	}
}

// A holder that is draining releases the lease itself, and one that cannot be reached
// may still be streaming: neither is a reason to repair (the strict fake fails on any
// lease call); the unreachable one's record is retried.
func TestStaleImageNotRepairedWhileTheHolderMayStream(t *testing.T) {
	r := newRig(t, worker("w1", 5))
	r.sender.by["w1:8080"] = wakeup.Draining
	resp, err := r.h.HandleStream(context.Background(), modify("s6", conn("STARTED", "w1", held, "5"), conn("STOPPED", "w0", held, "3")))
	if err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("draining holder: %+v, %v", resp, err)
	}

	r = newRig(t, worker("w1", 5)) // w1 is live but its address is not answering
	r.sender.down = map[string]bool{"w1:8080": true}
	resp, err = r.h.HandleStream(context.Background(), modify("s7", conn("STARTED", "w1", held, "5"), conn("STOPPED", "w0", held, "3")))
	if err != nil || len(resp.BatchItemFailures) != 1 || resp.BatchItemFailures[0].ItemIdentifier != "s7" {
		t.Fatalf("unreachable holder: %+v, %v; want s7 retried", resp, err)
	}
}
