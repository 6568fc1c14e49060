package handler

import (
	"context"
	"fmt"
	"testing"

	"github.com/aws/aws-lambda-go/events"
	"github.com/sockfleet/sockfleet/functions/reconciler/rounds"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/wakeup"
)

// ownedStore lists each worker's connections and reads them as held at version 1.
type ownedStore map[string][]string

func (s ownedStore) OwnedBy(_ context.Context, w string) ([]string, float64, error) {
	return s[w], 0, nil
}

func (s ownedStore) Read(_ context.Context, ids []string) (map[string]rounds.Candidate, float64, error) {
	out := map[string]rounds.Candidate{}
	for w, owned := range s {
		for _, id := range owned {
			out[id] = rounds.Candidate{Found: true, Owner: w, Held: true, Started: true, LeaseVersion: 1}
		}
	}
	for id := range out {
		if !contains(ids, id) {
			delete(out, id)
		}
	}
	return out, 0, nil
}

func contains(ids []string, id string) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

func (r *rig) withRounds(t *testing.T, store ownedStore) {
	rr, err := rounds.New(rounds.Config{}, store, r.sender, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.h.d.Rounds = rr
}

// A worker joining (its registry item inserted) starts a round: the loaded worker is
// asked to hand connections to the new one, and the round's metrics are written.
func TestWorkerJoiningStartsARound(t *testing.T) {
	r := newRig(t, worker("w1", 8), worker("w2", 0))
	store := ownedStore{}
	for i := range 8 {
		store["w1"] = append(store["w1"], fmt.Sprintf("c%d", i))
	}
	r.withRounds(t, store)
	r.sender.by["w1:8080"] = wakeup.HandingOff
	join := events.DynamoDBEvent{Records: []events.DynamoDBEventRecord{record("INSERT", schema.WorkerKey("w2"),
		map[string]events.DynamoDBAttributeValue{schema.AttrIncarnation: events.NewStringAttribute("i2")})}}
	if _, err := r.h.HandleStream(context.Background(), join); err != nil {
		t.Fatal(err)
	}
	moves := r.sender.calls["w1:8080"]
	if len(moves) != 1 { // the cap: ⌈10 % of 8⌉
		t.Fatalf("moves %+v", moves)
	}
	if m := moves[0]; m.Reason != wakeup.Handoff || m.To != "w2" || m.LeaseVersion != 1 {
		t.Fatalf("move %+v", m)
	}
	if v, ok := r.metric(t, schema.MetricRebalanceMoves); !ok || v != 1 {
		t.Errorf("%s = %v, %v", schema.MetricRebalanceMoves, v, ok)
	}
	if v, ok := r.metric(t, schema.MetricRebalanceMinimum); !ok || v != 4 {
		t.Errorf("%s = %v, %v", schema.MetricRebalanceMinimum, v, ok)
	}
}

// The sweep is the rounds' backstop: it checks the balance too.
func TestSweepStartsARound(t *testing.T) {
	r := newRig(t, worker("w1", 4), worker("w2", 0))
	r.sweeper.allow = true
	r.withRounds(t, ownedStore{"w1": {"c1", "c2", "c3", "c4"}})
	r.sender.by["w1:8080"] = wakeup.HandingOff
	if _, err := r.h.Sweep(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := r.sender.calls["w1:8080"]; len(got) != 1 || got[0].To != "w2" {
		t.Fatalf("moves %+v", got)
	}
}

// A connection record alone (no worker-item record) does not check the balance.
func TestConnectionRecordsDoNotStartRounds(t *testing.T) {
	r := newRig(t, worker("w1", 4), worker("w2", 0))
	r.withRounds(t, ownedStore{"w1": {"c1", "c2", "c3", "c4"}})
	r.sender.by["w2:8080"] = wakeup.Acquired
	ins := record("INSERT", schema.ConnKey("new"), map[string]events.DynamoDBAttributeValue{
		schema.AttrPK: events.NewStringAttribute(schema.ConnKey("new")), schema.AttrDesiredState: events.NewStringAttribute("STARTED"),
		schema.AttrWSURL: events.NewStringAttribute("ws://up/new")})
	if _, err := r.h.HandleStream(context.Background(), events.DynamoDBEvent{Records: []events.DynamoDBEventRecord{ins}}); err != nil {
		t.Fatal(err)
	}
	if got := r.sender.calls["w1:8080"]; len(got) != 0 {
		t.Fatalf("a round ran: %+v", got)
	}
}
