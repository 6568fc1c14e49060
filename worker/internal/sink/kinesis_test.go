package sink

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/sockfleet/sockfleet/shared/local/kinesalite/kinesistest"
	"github.com/sockfleet/sockfleet/shared/sinkrecord"
)

func TestMain(m *testing.M) { kinesistest.Main(m) }

func readRecords(t *testing.T, e *kinesistest.Env) []kinesistest.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	all, err := kinesistest.ReadAll(ctx, e.Kinesis, e.Stream)
	if err != nil {
		t.Fatal(err)
	}
	return all
}

func decode(t *testing.T, r kinesistest.Record) sinkrecord.Record {
	t.Helper()
	if !bytes.HasSuffix(r.Data, []byte("\n")) || bytes.Count(r.Data, []byte("\n")) != 1 {
		t.Fatalf("record %q: want one JSON line", r.Data)
	}
	v, err := sinkrecord.Parse(r.Data)
	if err != nil {
		t.Fatalf("record %q: %v", r.Data, err)
	}
	if v.Conn != r.PartitionKey {
		t.Fatalf("record of %s under partition key %s", v.Conn, r.PartitionKey)
	}
	return v
}

func msgs(conn string, from, n int) []Message {
	var b []Message
	for i := from; i < from+n; i++ {
		b = append(b, Message{Conn: conn, Seq: int64(i), Version: 1000 + int64(len(conn)), Data: fmt.Appendf(nil, `{"seq":%d}`, i)})
	}
	return b
}

// Many connections write at once into a stream of several shards; each
// connection's records come back in sequence order, all from one shard.
func TestKinesisOrderPerConnection(t *testing.T) {
	e := kinesistest.New(t, 4)
	k, err := NewKinesis(e.Kinesis, e.Stream, KinesisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	const conns, batches, per = 8, 5, 40
	var wg sync.WaitGroup
	for c := range conns {
		wg.Go(func() {
			for b := range batches {
				if err := k.Write(context.Background(), msgs(fmt.Sprintf("conn-%d", c), 1+b*per, per)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	last := map[string]int64{}
	shard := map[string]string{}
	all := readRecords(t, e)
	for _, r := range all {
		v := decode(t, r)
		if v.Seq != last[v.Conn]+1 {
			t.Fatalf("%s: seq %d after %d", v.Conn, v.Seq, last[v.Conn])
		}
		last[v.Conn] = v.Seq
		if v.Version != 1000+int64(len(v.Conn)) {
			t.Fatalf("%s seq %d: lease_version %d, want the message's fencing token", v.Conn, v.Seq, v.Version)
		}
		if s, ok := shard[v.Conn]; ok && s != r.Shard {
			t.Fatalf("%s in shards %s and %s", v.Conn, s, r.Shard)
		}
		shard[v.Conn] = r.Shard
	}
	if len(all) != conns*batches*per {
		t.Fatalf("%d records, want %d", len(all), conns*batches*per)
	}
}

// A stream named by ARN, as the CDK stack passes it.
func TestKinesisStreamByARN(t *testing.T) {
	e := kinesistest.New(t, 1)
	out, err := e.Kinesis.DescribeStreamSummary(context.Background(), &kinesis.DescribeStreamSummaryInput{StreamName: aws.String(e.Stream)})
	if err != nil {
		t.Fatal(err)
	}
	k, err := NewKinesis(e.Kinesis, *out.StreamDescriptionSummary.StreamARN, KinesisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := k.Write(context.Background(), msgs("a", 1, 3)); err != nil {
		t.Fatal(err)
	}
	if all := readRecords(t, e); len(all) != 3 {
		t.Fatalf("%d records, want 3", len(all))
	}
}

// A partial failure is retried with only the failed entries: every record lands
// exactly once, the retries are counted, and throttling is told apart.
func TestKinesisPartialFailureRetriesOnlyFailed(t *testing.T) {
	e := kinesistest.New(t, 2)
	p := kinesistest.NewFaultProxy(t, e.Endpoint)
	p.FailEntries(func(call, entry int, _ string, _ []byte) string {
		switch {
		case call == 0 && entry%3 == 0:
			return "ProvisionedThroughputExceededException"
		case call == 1 && entry == 0:
			return "InternalFailure"
		}
		return ""
	})
	k, err := NewKinesis(kinesistest.Client(p.Endpoint), e.Stream, KinesisOptions{BackoffMin: time.Millisecond, Jitter: func() float64 { return 0 }})
	if err != nil {
		t.Fatal(err)
	}
	if err := k.Write(context.Background(), msgs("a", 1, 30)); err != nil {
		t.Fatal(err)
	}
	seen := map[int64]int{}
	for _, r := range readRecords(t, e) {
		seen[decode(t, r).Seq]++
	}
	for s := int64(1); s <= 30; s++ {
		if seen[s] != 1 {
			t.Fatalf("seq %d stored %d times, want once (%v)", s, seen[s], seen)
		}
	}
	// Call 0 fails entries 0,3,…,27 (10); call 1 resends those 10 and fails the first.
	if p.Calls() != 3 || k.Stats.Retried.Load() != 11 || k.Stats.Throttled.Load() != 1 {
		t.Fatalf("calls %d retried %d throttled %d; want 3, 11, 1", p.Calls(), k.Stats.Retried.Load(), k.Stats.Throttled.Load())
	}
}

// While entries keep failing, Write does not return nil, so the stream never
// checkpoints past them; when the fault clears, the retried batch lands in full.
func TestKinesisCheckpointOnlyAfterSuccess(t *testing.T) {
	e := kinesistest.New(t, 1)
	p := kinesistest.NewFaultProxy(t, e.Endpoint)
	p.FailEntries(func(_, _ int, _ string, data []byte) string {
		if bytes.Contains(data, []byte(`"seq":5,`)) {
			return "InternalFailure"
		}
		return ""
	})
	k, err := NewKinesis(kinesistest.Client(p.Endpoint), e.Stream, KinesisOptions{BackoffMin: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err = k.Write(ctx, msgs("a", 1, 10))
	if err == nil || !strings.Contains(err.Error(), "InternalFailure") {
		t.Fatalf("Write with an entry failing for good: %v; want an error naming InternalFailure", err)
	}
	p.FailEntries(nil)
	if err := k.Write(context.Background(), msgs("a", 1, 10)); err != nil { // the stream's retry of the batch
		t.Fatal(err)
	}
	seen := map[int64]int{}
	for _, r := range readRecords(t, e) {
		seen[decode(t, r).Seq]++
	}
	if len(seen) != 10 || seen[5] != 1 {
		t.Fatalf("stored %v; want 1..10, seq 5 once (at least once for the others)", seen)
	}
}

// Errors a retry cannot fix return at once; throttling of a whole call is retried.
func TestKinesisWholeCallErrors(t *testing.T) {
	e := kinesistest.New(t, 1)
	p := kinesistest.NewFaultProxy(t, e.Endpoint)
	p.FailCalls(func(call int) string {
		if call < 2 {
			return "ProvisionedThroughputExceededException"
		}
		return ""
	})
	k, err := NewKinesis(kinesistest.Client(p.Endpoint), e.Stream, KinesisOptions{BackoffMin: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := k.Write(context.Background(), msgs("a", 1, 2)); err != nil {
		t.Fatal(err)
	}
	if p.Calls() != 3 || k.Stats.Throttled.Load() != 2 {
		t.Fatalf("calls %d throttled %d; want 3, 2", p.Calls(), k.Stats.Throttled.Load())
	}
	missing, err := NewKinesis(e.Kinesis, "no-such-stream", KinesisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = missing.Write(context.Background(), msgs("a", 1, 1))
	if err == nil || !strings.Contains(err.Error(), "ResourceNotFoundException") || time.Since(start) > 5*time.Second {
		t.Fatalf("write to a missing stream: %v after %s; want ResourceNotFoundException at once", err, time.Since(start))
	}
}

// A message over 1 MiB is dropped (or replaced by a stub when passed), counted,
// and never retried; the rest of its batch lands. Batches over 500 records or
// 5 MiB are split into calls within the limits.
func TestKinesisOversizeAndLimits(t *testing.T) {
	big := Message{Conn: "a", Seq: 2, Data: bytes.Repeat([]byte("x"), 800<<10), Binary: true} // 1.07 MiB in base64
	for _, pass := range []bool{false, true} {
		t.Run(fmt.Sprint("pass=", pass), func(t *testing.T) {
			e := kinesistest.New(t, 1)
			var told []int64
			k, err := NewKinesis(e.Kinesis, e.Stream, KinesisOptions{PassOversize: pass,
				OnOversize: func(m Message, size int) { told = append(told, m.Seq) }})
			if err != nil {
				t.Fatal(err)
			}
			batch := []Message{msgs("a", 1, 1)[0], big, msgs("a", 3, 1)[0]}
			if err := k.Write(context.Background(), batch); err != nil {
				t.Fatal(err)
			}
			var got []sinkrecord.Record
			for _, r := range readRecords(t, e) {
				got = append(got, decode(t, r))
			}
			want := 2
			if pass {
				want = 3
			}
			if len(got) != want || len(told) != 1 || told[0] != 2 || k.Stats.Calls.Load() != 1 {
				t.Fatalf("records %+v, told %v, calls %d", got, told, k.Stats.Calls.Load())
			}
			if pass && (!got[1].Bad || got[1].Oversize <= KinesisMaxRecordBytes || got[1].Data != nil) {
				t.Fatalf("stub %+v: want bad, its size, no payload", got[1])
			}
		})
	}
	t.Run("split", func(t *testing.T) {
		e := kinesistest.New(t, 1)
		k, err := NewKinesis(e.Kinesis, e.Stream, KinesisOptions{})
		if err != nil {
			t.Fatal(err)
		}
		batch := msgs("a", 1, 1200)
		for i := range 12 { // 12 × 600 KiB: over 5 MiB in the first 500
			batch[i].Data, batch[i].Binary = bytes.Repeat([]byte{1}, 450<<10), true
		}
		if err := k.Write(context.Background(), batch); err != nil {
			t.Fatal(err)
		}
		if n := len(readRecords(t, e)); n != 1200 || k.Stats.Calls.Load() < 4 {
			t.Fatalf("%d records in %d calls; want 1200 in at least 4", n, k.Stats.Calls.Load())
		}
	})
}

// Bad stream names are refused when the sink is built.
func TestKinesisBadStreamNames(t *testing.T) {
	for _, s := range []string{"", "has space", strings.Repeat("x", 129), "arn:aws:kinesis:us-east-1:1:nostream"} {
		if _, err := NewKinesis(nil, s, KinesisOptions{}); err == nil {
			t.Errorf("stream %q accepted", s)
		}
	}
}

// The oversize stub is part of the record format (docs/SINKS.md).
func TestOversizeStubGolden(t *testing.T) {
	got := string(sinkrecord.Append(nil, oversize(Message{Conn: "a\"b", Seq: 9, Epoch: 1, Version: 7}, 1048600)))
	if want := `{"conn":"a\"b","seq":9,"epoch":1,"lease_version":7,"bad":true,"oversize":1048600}` + "\n"; got != want {
		t.Fatalf("got %s want %s", got, want)
	}
}
