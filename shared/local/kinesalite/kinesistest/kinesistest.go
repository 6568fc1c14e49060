// Package kinesistest runs the real local Kinesis engine (kinesalite) for tests.
//
// One engine process serves a whole test binary; every test gets a stream of its own.
// Use it from TestMain so the process stops when the tests end:
//
//	func TestMain(m *testing.M) { kinesistest.Main(m) }
//
// The engine is installed by `make tools` (which `make test` runs first).
package kinesistest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"
	"github.com/sockfleet/sockfleet/shared/local/kinesalite"
	"github.com/sockfleet/sockfleet/shared/local/localengine/enginetest"
)

// Env is one test's view of the engine.
type Env struct {
	Endpoint string // http://127.0.0.1:PORT
	Stream   string
	Kinesis  *kinesis.Client
}

// Environ returns the standard AWS settings that point a child process at the engine.
func (e *Env) Environ() []string {
	return []string{
		"AWS_ENDPOINT_URL_KINESIS=" + e.Endpoint,
		"AWS_REGION=us-east-1",
		"AWS_ACCESS_KEY_ID=local",
		"AWS_SECRET_ACCESS_KEY=local",
	}
}

// Client returns a Kinesis client for endpoint (the engine's, or a proxy's in front
// of it).
func Client(endpoint string) *kinesis.Client {
	cfg := aws.Config{
		Region:      "us-east-1",
		Credentials: credentials.NewStaticCredentialsProvider("local", "local", ""),
		HTTPClient:  &http.Client{Timeout: 30 * time.Second, Transport: ARNToName{}},
	}
	return kinesis.NewFromConfig(cfg, func(o *kinesis.Options) { o.BaseEndpoint = aws.String(endpoint) })
}

// ARNToName is an http.RoundTripper for kinesalite 3.3.3, which predates the
// StreamARN request parameter (added to the Kinesis API in 2022) and answers a call
// naming its stream by ARN alone with "Value null at 'streamName'". It adds the
// StreamName the ARN ends with, so the sink's ARN path runs against the engine as
// it does against AWS. Requests are otherwise untouched: the Go SDK and kinesalite
// agree on the rest of the wire protocol (awsJson1.1, X-Amz-Target, SigV4 headers).
type ARNToName struct{ Next http.RoundTripper }

func (a ARNToName) RoundTrip(r *http.Request) (*http.Response, error) {
	next := a.Next
	if next == nil {
		next = http.DefaultTransport
	}
	if r.Body == nil || !strings.HasPrefix(r.Header.Get("Content-Type"), "application/x-amz-json") {
		return next.RoundTrip(r)
	}
	body, err := io.ReadAll(r.Body)
	r.Body.Close()
	if err != nil {
		return nil, err
	}
	var in map[string]any
	if json.Unmarshal(body, &in) == nil {
		if arn, ok := in["StreamARN"].(string); ok && in["StreamName"] == nil {
			if i := strings.LastIndex(arn, ":stream/"); i >= 0 {
				delete(in, "StreamARN")
				in["StreamName"] = arn[i+len(":stream/"):]
				body, _ = json.Marshal(in)
			}
		}
	}
	r = r.Clone(r.Context())
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.Header.Del("Content-Length")
	return next.RoundTrip(r)
}

var (
	engine  = enginetest.New(func() (*kinesalite.Proc, error) { return kinesalite.Start(kinesalite.Options{}) })
	streams atomic.Int64
)

// Main runs the tests and stops the engine afterwards.
func Main(m *testing.M) { engine.Main(m) }

// Stop ends the engine, if it was started: for a TestMain that runs more than one
// engine.
func Stop() { engine.Stop() }

// Endpoint starts the engine once per process and returns its URL.
func Endpoint() (string, error) { return engine.Endpoint() }

// New starts the engine on first use and creates a fresh ACTIVE stream with shards
// shards for t.
func New(t testing.TB, shards int32) *Env {
	t.Helper()
	ep, err := Endpoint()
	if err != nil {
		t.Fatal(err)
	}
	e := &Env{Endpoint: ep, Kinesis: Client(ep)}
	e.Stream = fmt.Sprintf("s%d-%s", streams.Add(1), enginetest.Sanitize(t.Name(), 100))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := CreateStream(ctx, e.Kinesis, e.Stream, shards); err != nil {
		t.Fatal(err)
	}
	return e
}

// CreateStream creates stream and waits until it is ACTIVE.
func CreateStream(ctx context.Context, c *kinesis.Client, stream string, shards int32) error {
	if _, err := c.CreateStream(ctx, &kinesis.CreateStreamInput{StreamName: aws.String(stream), ShardCount: aws.Int32(shards)}); err != nil {
		return fmt.Errorf("create stream %s: %w", stream, err)
	}
	for {
		out, err := c.DescribeStreamSummary(ctx, &kinesis.DescribeStreamSummaryInput{StreamName: aws.String(stream)})
		if err != nil {
			return fmt.Errorf("describe stream %s: %w", stream, err)
		}
		if out.StreamDescriptionSummary.StreamStatus == types.StreamStatusActive {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("stream %s not active: %w", stream, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Record is one record read back, with the shard it is in.
type Record struct {
	Shard        string
	PartitionKey string
	Data         []byte
}

// ReadAll returns every record in stream, shard by shard, each shard in its order.
func ReadAll(ctx context.Context, c *kinesis.Client, stream string) ([]Record, error) {
	shards, err := c.ListShards(ctx, &kinesis.ListShardsInput{StreamName: aws.String(stream)})
	if err != nil {
		return nil, fmt.Errorf("list shards: %w", err)
	}
	var all []Record
	for _, sh := range shards.Shards {
		it, err := c.GetShardIterator(ctx, &kinesis.GetShardIteratorInput{StreamName: aws.String(stream),
			ShardId: sh.ShardId, ShardIteratorType: types.ShardIteratorTypeTrimHorizon})
		if err != nil {
			return nil, fmt.Errorf("shard iterator: %w", err)
		}
		iter := it.ShardIterator
		for iter != nil {
			out, err := c.GetRecords(ctx, &kinesis.GetRecordsInput{ShardIterator: iter, Limit: aws.Int32(10000)})
			if err != nil {
				return nil, fmt.Errorf("get records: %w", err)
			}
			for _, r := range out.Records {
				all = append(all, Record{Shard: *sh.ShardId, PartitionKey: *r.PartitionKey, Data: r.Data})
			}
			if len(out.Records) == 0 {
				break
			}
			iter = out.NextShardIterator
		}
	}
	return all, nil
}
