package streampoller

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/local/ddbtest"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

func TestMain(m *testing.M) { ddbtest.Main(m) }

// recorder is a handler that keeps what it was given and answers with fail(seq).
type recorder struct {
	mu     sync.Mutex
	events []events.DynamoDBEvent
	fail   func(ev events.DynamoDBEvent) (events.DynamoDBEventResponse, error)
	got    chan events.DynamoDBEventRecord
}

func newRecorder() *recorder { return &recorder{got: make(chan events.DynamoDBEventRecord, 1000)} }

func (r *recorder) handle(_ context.Context, ev events.DynamoDBEvent) (events.DynamoDBEventResponse, error) {
	r.mu.Lock()
	r.events = append(r.events, ev)
	fail := r.fail
	r.mu.Unlock()
	if fail != nil {
		if resp, err := fail(ev); err != nil || len(resp.BatchItemFailures) > 0 {
			return resp, err
		}
	}
	for _, rec := range ev.Records {
		r.got <- rec
	}
	return events.DynamoDBEventResponse{}, nil
}

// next waits for the next record handed over for good.
func (r *recorder) next(t *testing.T) events.DynamoDBEventRecord {
	t.Helper()
	select {
	case rec := <-r.got:
		return rec
	case <-time.After(5 * time.Second):
		t.Fatal("no record reached the handler")
		return events.DynamoDBEventRecord{}
	}
}

func (r *recorder) none(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case rec := <-r.got:
		t.Fatalf("unexpected record %s %s", rec.EventName, rec.Change.Keys[schema.AttrPK].String())
	case <-time.After(d):
	}
}

func start(t *testing.T, p *Poller, h Handler) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx, h) }()
	return func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v", err)
		}
	}
}

func put(t *testing.T, e *ddbtest.Env, c codec.Connection) {
	t.Helper()
	if _, err := e.DB.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: &e.Table, Item: codec.EncodeConnection(c)}); err != nil {
		t.Fatal(err)
	}
}

func heartbeat(t *testing.T, e *ddbtest.Env, id string, exp int64) {
	t.Helper()
	_, err := e.DB.UpdateItem(context.Background(), &dynamodb.UpdateItemInput{
		TableName: &e.Table, Key: map[string]types.AttributeValue{schema.AttrPK: codec.S(schema.ConnKey(id))},
		UpdateExpression:          aws.String("SET #e = :e"),
		ExpressionAttributeNames:  map[string]string{"#e": schema.AttrLeaseExpires},
		ExpressionAttributeValues: map[string]types.AttributeValue{":e": codec.N(exp)},
	})
	if err != nil {
		t.Fatal(err)
	}
}

func started(id string) codec.Connection {
	return codec.Connection{ID: id, DesiredState: schema.Started, WSURL: "ws://127.0.0.1:1/x"}
}

func TestDeliversWhatLambdaWouldAndFilters(t *testing.T) {
	e := ddbtest.New(t)
	p, err := New(e.Streams, Config{Table: e.Table, Region: "eu-west-1"})
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	stop := start(t, p, rec.handle)
	defer stop()

	owned := started("owned")
	owned.LeaseOwner, owned.LeaseExpiresAtMs, owned.LeaseVersion = "w1", time.Now().Add(time.Minute).UnixMilli(), 1
	put(t, e, owned) // INSERT: passes
	got := rec.next(t)
	if got.EventName != "INSERT" || got.EventSource != "aws:dynamodb" || got.EventSourceArn == "" ||
		got.Change.Keys[schema.AttrPK].String() != "CONN#owned" || got.Change.SequenceNumber == "" ||
		got.Change.StreamViewType != "NEW_AND_OLD_IMAGES" || got.EventID == "" || got.AWSRegion == "" ||
		got.Change.NewImage[schema.AttrLeaseOwner].String() != "w1" || got.Change.OldImage != nil ||
		got.Change.ApproximateCreationDateTime.IsZero() {
		t.Errorf("record not as Lambda would pass it: %+v", got)
	}
	heartbeat(t, e, "owned", time.Now().Add(2*time.Minute).UnixMilli()) // filtered out
	put(t, e, started("fresh"))                                         // passes
	got = rec.next(t)
	if k := got.Change.Keys[schema.AttrPK].String(); k != "CONN#fresh" {
		t.Fatalf("got %s %s: the heartbeat was not filtered", got.EventName, k)
	}
	rec.none(t, 100*time.Millisecond)
	if p.Invocations() != 2 {
		t.Errorf("invocations %d, want 2", p.Invocations())
	}
	if p.Records() != 3 {
		t.Errorf("records read %d, want 3", p.Records())
	}
}

func TestResumesFromCheckpoint(t *testing.T) {
	e := ddbtest.New(t)
	file := filepath.Join(t.TempDir(), "checkpoint.json")
	cfg := Config{Table: e.Table, Checkpoint: file}
	p, _ := New(e.Streams, cfg)
	rec := newRecorder()
	stop := start(t, p, rec.handle)
	put(t, e, started("a"))
	put(t, e, started("b"))
	rec.next(t)
	rec.next(t)
	stop()

	put(t, e, started("c")) // written while the poller is down
	p2, _ := New(e.Streams, cfg)
	rec2 := newRecorder()
	stop2 := start(t, p2, rec2.handle)
	defer stop2()
	if k := rec2.next(t).Change.Keys[schema.AttrPK].String(); k != "CONN#c" {
		t.Fatalf("after restart got %s, want only CONN#c", k)
	}
	rec2.none(t, 100*time.Millisecond)
}

func TestRetriesFromFirstFailedRecord(t *testing.T) {
	e := ddbtest.New(t)
	p, _ := New(e.Streams, Config{Table: e.Table, IdleSleep: 50 * time.Millisecond})
	rec := newRecorder()
	failed := false
	rec.fail = func(ev events.DynamoDBEvent) (events.DynamoDBEventResponse, error) {
		// Fail the first time "b" is seen, and only it: "a" is done, "b" and
		// whatever follows are delivered again.
		for _, r := range ev.Records {
			if r.Change.Keys[schema.AttrPK].String() == "CONN#b" && !failed {
				failed = true
				var done []events.DynamoDBEventRecord
				for _, x := range ev.Records {
					if x.Change.SequenceNumber == r.Change.SequenceNumber {
						break
					}
					done = append(done, x)
				}
				for _, x := range done {
					rec.got <- x
				}
				return events.DynamoDBEventResponse{BatchItemFailures: []events.DynamoDBBatchItemFailure{{ItemIdentifier: r.Change.SequenceNumber}}}, nil
			}
		}
		return events.DynamoDBEventResponse{}, nil
	}
	// Write all three before the poller starts, so they arrive in one batch.
	for _, id := range []string{"a", "b", "c"} {
		put(t, e, started(id))
	}
	stop := start(t, p, rec.handle)
	defer stop()
	var keys []string
	for range 3 {
		keys = append(keys, rec.next(t).Change.Keys[schema.AttrPK].String())
	}
	if fmt.Sprint(keys) != "[CONN#a CONN#b CONN#c]" {
		t.Errorf("delivered %v", keys)
	}
	rec.none(t, 100*time.Millisecond)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.events) != 2 || len(rec.events[0].Records) != 3 || len(rec.events[1].Records) != 2 {
		var sizes []int
		for _, ev := range rec.events {
			sizes = append(sizes, len(ev.Records))
		}
		t.Errorf("batches of %v, want [3 2] (retry from the failed record)", sizes)
	}
}

func TestRetriesWholeBatchOnHandlerError(t *testing.T) {
	e := ddbtest.New(t)
	p, _ := New(e.Streams, Config{Table: e.Table})
	rec := newRecorder()
	calls := 0
	rec.fail = func(events.DynamoDBEvent) (events.DynamoDBEventResponse, error) {
		calls++
		if calls == 1 {
			return events.DynamoDBEventResponse{}, errors.New("boom")
		}
		return events.DynamoDBEventResponse{}, nil
	}
	put(t, e, started("a"))
	stop := start(t, p, rec.handle)
	defer stop()
	if k := rec.next(t).Change.Keys[schema.AttrPK].String(); k != "CONN#a" {
		t.Fatal(k)
	}
	if p.Invocations() != 2 {
		t.Errorf("invocations %d, want 2", p.Invocations())
	}
}

func TestInvokeAdapter(t *testing.T) {
	var sent []byte
	h := Invoke(func(_ context.Context, ev []byte) ([]byte, error) {
		sent = ev
		return []byte(`{"batchItemFailures":[{"itemIdentifier":"42"}]}`), nil
	})
	ev := events.DynamoDBEvent{Records: []events.DynamoDBEventRecord{{EventName: "INSERT", EventSource: "aws:dynamodb",
		Change: events.DynamoDBStreamRecord{SequenceNumber: "42"}}}}
	resp, err := h(context.Background(), ev)
	if err != nil || len(resp.BatchItemFailures) != 1 || resp.BatchItemFailures[0].ItemIdentifier != "42" {
		t.Fatalf("%+v %v", resp, err)
	}
	if !strings.Contains(string(sent), `"Records":[{`) || !strings.Contains(string(sent), `"eventSource":"aws:dynamodb"`) {
		t.Errorf("sent %s", sent)
	}
}
