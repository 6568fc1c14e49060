package sink

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"
	"github.com/aws/smithy-go"
	"github.com/sockfleet/sockfleet/shared/sinkrecord"
)

// Kinesis Data Streams limits for one PutRecords call.
const (
	KinesisMaxRecords     = 500
	KinesisMaxRecordBytes = 1 << 20 // data plus partition key, per record
	KinesisMaxBatchBytes  = 5 << 20 // data plus partition keys, per call
)

// KinesisAPI is the one Kinesis call the sink makes.
type KinesisAPI interface {
	PutRecords(ctx context.Context, in *kinesis.PutRecordsInput, opts ...func(*kinesis.Options)) (*kinesis.PutRecordsOutput, error)
}

// KinesisOptions tune the Kinesis sink.
type KinesisOptions struct {
	// PassOversize: a message too large for one record is replaced by a stub record
	// flagged bad, with its size in "oversize" and no payload (SOCKFLEET_BAD_MESSAGES=pass).
	// Otherwise it is dropped. Either way OnOversize is told and last_seq moves past it.
	PassOversize bool
	OnOversize   func(m Message, size int)
	// OnRetry (may be nil) is told of each retry: how many records, and whether
	// Kinesis refused them for throughput.
	OnRetry    func(records int, throttled bool)
	BackoffMin time.Duration  // first retry wait; default 50 ms (throttled: 4×)
	BackoffMax time.Duration  // default 2 s
	Jitter     func() float64 // in [0, 1); default math/rand/v2
}

// KinesisStats count what the sink did, for metrics and tests.
type KinesisStats struct {
	Calls     atomic.Int64 // PutRecords calls
	Retried   atomic.Int64 // records sent again after a failure
	Throttled atomic.Int64 // calls or records refused for throughput
	Oversize  atomic.Int64 // messages too large for one record
}

// Kinesis writes each message as one record (the sink record line, newline
// included, so Firehose delivers JSON lines to S3) with the connection id as
// partition key: one connection's records go to one shard. Write returns nil only
// once every record of the batch was accepted; failed entries of a partial failure,
// and only those, are sent again with backoff and jitter until ctx ends.
//
// Non-guarantee: records retried after a partial failure land after later records
// of the same batch that succeeded at once, so within one batch a consumer can see
// them out of order (the seq field tells); across batches order holds, because a
// connection's next batch is only written after this one is acknowledged.
type Kinesis struct {
	api   KinesisAPI
	name  string // stream name, or
	arn   string // stream ARN
	opt   KinesisOptions
	Stats KinesisStats
}

// NewKinesis returns a sink writing to stream (a name or an ARN) through api.
func NewKinesis(api KinesisAPI, stream string, opt KinesisOptions) (*Kinesis, error) {
	if err := CheckKinesisStream(stream); err != nil {
		return nil, err
	}
	k := &Kinesis{api: api, opt: opt}
	if strings.HasPrefix(stream, "arn:") {
		k.arn = stream
	} else {
		k.name = stream
	}
	if k.opt.BackoffMin <= 0 {
		k.opt.BackoffMin = 50 * time.Millisecond
	}
	if k.opt.BackoffMax < k.opt.BackoffMin {
		k.opt.BackoffMax = max(2*time.Second, k.opt.BackoffMin)
	}
	if k.opt.Jitter == nil {
		k.opt.Jitter = rand.Float64
	}
	return k, nil
}

// KinesisPrefix starts a Kinesis sink spec: kinesis:STREAM (a name or an ARN).
const KinesisPrefix = "kinesis:"

// CheckKinesisStream checks a stream name (1-128 of [a-zA-Z0-9_.-]) or ARN.
func CheckKinesisStream(s string) error {
	if strings.HasPrefix(s, "arn:") {
		if !strings.Contains(s, ":stream/") {
			return fmt.Errorf("kinesis stream ARN %q: want arn:PARTITION:kinesis:REGION:ACCOUNT:stream/NAME", s)
		}
		return nil
	}
	if s == "" || len(s) > 128 {
		return fmt.Errorf("kinesis stream name %q: want 1 to 128 characters", s)
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '.' || r == '-') {
			return fmt.Errorf("kinesis stream name %q: only letters, digits, '_', '.' and '-'", s)
		}
	}
	return nil
}

// Write puts batch in calls within the Kinesis limits, in order.
func (k *Kinesis) Write(ctx context.Context, batch []Message) error {
	var chunk []types.PutRecordsRequestEntry
	size := 0
	for _, m := range batch {
		data := sinkrecord.Append(nil, m.Record())
		if n := len(data) + len(m.Conn); n > KinesisMaxRecordBytes {
			k.Stats.Oversize.Add(1)
			if k.opt.OnOversize != nil {
				k.opt.OnOversize(m, n)
			}
			if !k.opt.PassOversize {
				continue
			}
			data = sinkrecord.Append(nil, oversize(m, n))
		}
		n := len(data) + len(m.Conn)
		if len(chunk) == KinesisMaxRecords || size+n > KinesisMaxBatchBytes {
			if err := k.put(ctx, chunk); err != nil {
				return err
			}
			chunk, size = nil, 0
		}
		chunk = append(chunk, types.PutRecordsRequestEntry{Data: data, PartitionKey: aws.String(m.Conn)})
		size += n
	}
	if len(chunk) == 0 {
		return nil
	}
	return k.put(ctx, chunk)
}

// oversize is the stub record that stands for a message too large to send.
func oversize(m Message, size int) sinkrecord.Record {
	return sinkrecord.Record{Conn: m.Conn, Seq: m.Seq, Epoch: m.Epoch, Version: m.Version, Bad: true, Oversize: int64(size)}
}

// put sends entries until all are accepted, retrying only the failed ones.
func (k *Kinesis) put(ctx context.Context, entries []types.PutRecordsRequestEntry) error {
	for attempt := 0; ; attempt++ {
		in := &kinesis.PutRecordsInput{Records: entries}
		if k.arn != "" {
			in.StreamARN = aws.String(k.arn)
		} else {
			in.StreamName = aws.String(k.name)
		}
		k.Stats.Calls.Add(1)
		// One retry policy, this one, bounded by ctx: the SDK's own would retry whole
		// calls but never the failed entries of a partial failure.
		out, err := k.api.PutRecords(ctx, in, func(o *kinesis.Options) { o.Retryer = aws.NopRetryer{} })
		var throttled bool
		var why string
		switch {
		case err != nil:
			var ae smithy.APIError
			if errors.As(err, &ae) {
				if !retryableCode(ae.ErrorCode()) {
					return fmt.Errorf("kinesis put records: %w", err)
				}
				throttled = throttleCode(ae.ErrorCode())
			}
			if ctx.Err() != nil {
				return fmt.Errorf("kinesis put records: %w", err)
			}
			why = err.Error()
		case aws.ToInt32(out.FailedRecordCount) == 0:
			return nil
		default:
			if len(out.Records) != len(entries) {
				return fmt.Errorf("kinesis put records: %d results for %d records", len(out.Records), len(entries))
			}
			failed := entries[:0:0]
			for i, r := range out.Records {
				if r.ErrorCode == nil {
					continue
				}
				failed = append(failed, entries[i])
				if throttleCode(*r.ErrorCode) {
					throttled = true
				}
				why = *r.ErrorCode + ": " + aws.ToString(r.ErrorMessage)
			}
			entries = failed
			k.Stats.Retried.Add(int64(len(failed)))
			why = fmt.Sprintf("%d records failed, last %s", len(failed), why)
		}
		if throttled {
			k.Stats.Throttled.Add(1)
		}
		if k.opt.OnRetry != nil {
			k.opt.OnRetry(len(entries), throttled)
		}
		t := time.NewTimer(k.backoff(attempt, throttled))
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("kinesis put records: %s: %w", why, ctx.Err())
		case <-t.C:
		}
	}
}

// backoff is the wait before retry attempt+1: exponential, equal jitter; a throttled
// stream starts from a longer wait, since it will not take more right away.
func (k *Kinesis) backoff(attempt int, throttled bool) time.Duration {
	d := k.opt.BackoffMin
	if throttled {
		d *= 4
	}
	for i := 0; i < attempt && d < k.opt.BackoffMax; i++ {
		d *= 2
	}
	d = min(d, k.opt.BackoffMax)
	return d/2 + time.Duration(k.opt.Jitter()*float64(d/2))
}

func throttleCode(code string) bool {
	switch code {
	case "ProvisionedThroughputExceededException", "KMSThrottlingException", "LimitExceededException", "ThrottlingException":
		return true
	}
	return false
}

// retryableCode tells errors worth retrying (throttling, service faults) from those
// that will fail again (no such stream, access denied, bad request).
func retryableCode(code string) bool {
	switch code {
	case "ResourceNotFoundException", "AccessDeniedException", "ValidationException", "InvalidArgumentException",
		"KMSAccessDeniedException", "KMSDisabledException", "KMSInvalidStateException", "KMSNotFoundException",
		"KMSOptInRequired", "UnrecognizedClientException", "InvalidSignatureException":
		return false
	}
	return true
}

// Close does nothing: every Write is complete when it returns.
func (k *Kinesis) Close() error { return nil }
