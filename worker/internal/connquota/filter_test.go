package connquota

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/sockfleet/sockfleet/shared/local/streampoller"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

// A dial's admission (an INSERT of QUOTA#host, then MODIFYs) and a 429 hold pass no
// event filter: otherwise every dial of the fleet would invoke the reconciler. The
// local stream poller applies the same filter patterns as the event source mapping.
func TestQuotaWritesInvokeNothing(t *testing.T) {
	s, env := newStore(t)
	p, err := streampoller.New(env.Streams, streampoller.Config{Table: env.Table, Region: "eu-west-1"})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan events.DynamoDBEventRecord, 100)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- p.Run(ctx, func(_ context.Context, ev events.DynamoDBEvent) (events.DynamoDBEventResponse, error) {
			for _, r := range ev.Records {
				got <- r
			}
			return events.DynamoDBEventResponse{}, nil
		})
	}()
	defer func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v", err)
		}
	}()

	now := time.Now()
	for range 3 {
		if v, err := s.Admit(ctx, host, 10, time.Minute, now); err != nil || !v.Admitted {
			t.Fatalf("admit: %+v, %v", v, err)
		}
	}
	if err := s.Hold(ctx, host, now.Add(7*time.Second), now); err != nil {
		t.Fatal(err)
	}
	// A connection item written after them passes: the poller has read past them.
	c := codec.Connection{ID: "after", DesiredState: schema.Started, WSURL: "ws://127.0.0.1:1/x"}
	if _, err := env.DB.PutItem(ctx, &dynamodb.PutItemInput{TableName: &env.Table, Item: codec.EncodeConnection(c)}); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-got:
		if k := r.Change.Keys[schema.AttrPK].String(); k != schema.ConnKey("after") {
			t.Fatalf("a quota write reached the handler: %s %s", r.EventName, k)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no record reached the handler")
	}
}
