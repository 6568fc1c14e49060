package streampoller

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/sockfleet/sockfleet/shared/local/ddbtest"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

// BenchmarkWriteToHandler measures the time from issuing a table write (a STARTED
// INSERT, which the filters pass) to the handler being called with it, through the
// local engine's stream and this poller. One write at a time; the clock starts before
// the PutItem call, so the write's own round trip is included.
//
//	go test -run '^$' -bench WriteToHandler -benchtime 2000x ./shared/local/streampoller
func BenchmarkWriteToHandler(b *testing.B) {
	e := ddbtest.New(b)
	p, err := New(e.Streams, Config{Table: e.Table})
	if err != nil {
		b.Fatal(err)
	}
	seen := make(chan string, 16)
	h := func(_ context.Context, ev events.DynamoDBEvent) (events.DynamoDBEventResponse, error) {
		for _, r := range ev.Records {
			seen <- r.Change.Keys["Pk"].String()
		}
		return events.DynamoDBEventResponse{}, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = p.Run(ctx, h) }()
	defer func() { cancel(); <-done }()

	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c := started(fmt.Sprintf("bench-%d", i))
		t0 := time.Now()
		if _, err := e.DB.PutItem(ctx, &dynamodb.PutItemInput{TableName: &e.Table, Item: codec.EncodeConnection(c)}); err != nil {
			b.Fatal(err)
		}
		for k := range seen {
			if k == "CONN#"+c.ID {
				break
			}
		}
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	slices.Sort(lat)
	q := func(f float64) float64 { return float64(lat[int(f*float64(len(lat)-1))].Microseconds()) / 1000 }
	b.ReportMetric(q(0.50), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	b.ReportMetric(q(1), "max-ms")
	b.ReportMetric(float64(p.Invocations())/float64(b.N), "invocations/write")
}
