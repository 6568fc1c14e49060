// Package streampoller is the local stand-in for Lambda's DynamoDB event source
// mapping: it reads a table's stream with the dynamodbstreams SDK client
// (ListStreams, DescribeStream, GetShardIterator, GetRecords), applies the same
// filter patterns as production (shared/filters, matched by shared/local/filtermatch), and calls the reconciler's handler
// with the events.DynamoDBEvent Lambda would pass.
//
// Guarantees:
//   - Per shard, records reach the handler in order, one batch at a time, and a
//     child shard is read only once its parent is read to its end (or is gone).
//   - At least once: a position is saved only after the handler returned for the
//     records before it. Batch item failures are honoured as Lambda does: the records
//     before the first failed one are done, and reading resumes at the failed one
//     (after a backoff). A handler error retries the whole batch. Retries go on until
//     they succeed, as with Lambda's default (retry until the record expires).
//   - Positions (per shard, the last sequence number handled) survive restarts in a
//     small checkpoint file, written atomically after every batch.
//   - An expired iterator is renewed from the saved position; a position older than
//     the stream's retention restarts the shard at its trim horizon, with a warning.
//
// Non-guarantees: exactly-once delivery (nor does Lambda promise it), and Lambda's
// batching window (records are handed over as soon as one GetRecords returns them,
// which is what keeps local latency low).
package streampoller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodbstreams"
	stypes "github.com/aws/aws-sdk-go-v2/service/dynamodbstreams/types"
	"github.com/sockfleet/sockfleet/shared/filters"
	"github.com/sockfleet/sockfleet/shared/local/filtermatch"
)

// Streams is the part of the dynamodbstreams client the poller uses.
type Streams interface {
	ListStreams(context.Context, *dynamodbstreams.ListStreamsInput, ...func(*dynamodbstreams.Options)) (*dynamodbstreams.ListStreamsOutput, error)
	DescribeStream(context.Context, *dynamodbstreams.DescribeStreamInput, ...func(*dynamodbstreams.Options)) (*dynamodbstreams.DescribeStreamOutput, error)
	GetShardIterator(context.Context, *dynamodbstreams.GetShardIteratorInput, ...func(*dynamodbstreams.Options)) (*dynamodbstreams.GetShardIteratorOutput, error)
	GetRecords(context.Context, *dynamodbstreams.GetRecordsInput, ...func(*dynamodbstreams.Options)) (*dynamodbstreams.GetRecordsOutput, error)
}

// Handler is the reconciler's stream entry point.
type Handler func(context.Context, events.DynamoDBEvent) (events.DynamoDBEventResponse, error)

// Config configures a Poller.
type Config struct {
	// Table whose (latest) stream is read, unless StreamARN is set.
	Table     string
	StreamARN string
	// Checkpoint is the file positions are kept in; empty keeps them in memory only.
	Checkpoint string
	// Filters: nil means the production patterns, filters.Patterns.
	Filters *filtermatch.Set
	// BatchSize is the GetRecords limit. Default 100 (Lambda's default batch size).
	BatchSize int32
	// IdleSleep is the pause after a pass over the shards that found no records.
	// Default 10ms: dynoxide surfaces a write on its stream within a few ms, so the
	// sleep dominates the write-to-handler latency.
	IdleSleep time.Duration
	// RefreshEvery is how often the shard list is re-read. Default 1s.
	RefreshEvery time.Duration
	// StartLatest starts shards with no saved position at LATEST instead of
	// TRIM_HORIZON (the default, so a write made before the poller started is seen).
	StartLatest bool
	// MaxBackoff caps the pause between retries of a failing batch. Default 2s.
	MaxBackoff time.Duration
	// Region is the awsRegion of records that carry none. Default "local".
	Region string
	Log    *slog.Logger
}

// Poller reads one stream.
type Poller struct {
	api Streams
	cfg Config
	log *slog.Logger

	invocations atomic.Int64
	records     atomic.Int64

	arn    string
	shards map[string]*shard
}

type shard struct {
	id, parent string
	iter       *string
	last       string // sequence number of the last record handled
	done       bool   // closed, and read to its end
	retryAt    time.Time
	backoff    time.Duration
}

// New returns a Poller.
func New(api Streams, cfg Config) (*Poller, error) {
	if cfg.Table == "" && cfg.StreamARN == "" {
		return nil, errors.New("stream poller: set a table or a stream ARN")
	}
	if cfg.Filters == nil {
		s, err := filtermatch.Compile(filters.Patterns)
		if err != nil {
			return nil, fmt.Errorf("stream poller: %w", err)
		}
		cfg.Filters = s
	}
	if cfg.BatchSize == 0 {
		cfg.BatchSize = 100
	}
	if cfg.BatchSize < 1 || cfg.BatchSize > 1000 {
		return nil, fmt.Errorf("stream poller: batch size %d: want 1 to 1000", cfg.BatchSize)
	}
	if cfg.IdleSleep == 0 {
		cfg.IdleSleep = 10 * time.Millisecond
	}
	if cfg.RefreshEvery == 0 {
		cfg.RefreshEvery = time.Second
	}
	if cfg.MaxBackoff == 0 {
		cfg.MaxBackoff = 2 * time.Second
	}
	if cfg.Region == "" {
		cfg.Region = "local"
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Poller{api: api, cfg: cfg, log: log, shards: map[string]*shard{}}, nil
}

// Invocations is how many times the handler has been called.
func (p *Poller) Invocations() int64 { return p.invocations.Load() }

// Records is how many records have been read from the stream, passed or filtered.
func (p *Poller) Records() int64 { return p.records.Load() }

// Run reads the stream until ctx ends, calling h. It returns ctx's error, or an error
// if the stream cannot be found.
func (p *Poller) Run(ctx context.Context, h Handler) error {
	if err := p.resolve(ctx); err != nil {
		return err
	}
	p.loadCheckpoint()
	var refreshed time.Time
	for ctx.Err() == nil {
		if time.Since(refreshed) >= p.cfg.RefreshEvery {
			if err := p.refresh(ctx); err != nil && ctx.Err() == nil {
				p.log.Warn("stream poller: describe stream", "err", err)
			}
			refreshed = time.Now()
		}
		busy := false
		for _, s := range p.ready() {
			n, err := p.poll(ctx, s, h)
			if err != nil && ctx.Err() == nil {
				p.fail(s, err)
			}
			if n > 0 || s.done {
				busy = true
			}
			if s.done {
				refreshed = time.Time{} // children may be ready now
			}
		}
		if !busy {
			sleep(ctx, p.cfg.IdleSleep)
		}
	}
	return ctx.Err()
}

// resolve finds the stream: the given ARN, or the table's newest stream.
func (p *Poller) resolve(ctx context.Context) error {
	if p.cfg.StreamARN != "" {
		p.arn = p.cfg.StreamARN
		return nil
	}
	var best stypes.Stream
	in := &dynamodbstreams.ListStreamsInput{TableName: &p.cfg.Table}
	for {
		out, err := p.api.ListStreams(ctx, in)
		if err != nil {
			return fmt.Errorf("stream poller: list streams of %s: %w", p.cfg.Table, err)
		}
		for _, s := range out.Streams {
			if aws.ToString(s.StreamLabel) >= aws.ToString(best.StreamLabel) {
				best = s
			}
		}
		if out.LastEvaluatedStreamArn == nil {
			break
		}
		in.ExclusiveStartStreamArn = out.LastEvaluatedStreamArn
	}
	if best.StreamArn == nil {
		return fmt.Errorf("stream poller: table %s has no stream", p.cfg.Table)
	}
	p.arn = *best.StreamArn
	return nil
}

// refresh reads the shard list and adds shards not yet known.
func (p *Poller) refresh(ctx context.Context) error {
	in := &dynamodbstreams.DescribeStreamInput{StreamArn: &p.arn}
	for {
		out, err := p.api.DescribeStream(ctx, in)
		if err != nil {
			return err
		}
		d := out.StreamDescription
		for _, sh := range d.Shards {
			id := aws.ToString(sh.ShardId)
			if id == "" {
				continue
			}
			if known, ok := p.shards[id]; ok {
				known.parent = aws.ToString(sh.ParentShardId) // a shard restored from a checkpoint
			} else {
				p.shards[id] = &shard{id: id, parent: aws.ToString(sh.ParentShardId)}
			}
		}
		if d.LastEvaluatedShardId == nil {
			return nil
		}
		in.ExclusiveStartShardId = d.LastEvaluatedShardId
	}
}

// ready lists the shards to read now: not done, parent done or gone, not backing off.
func (p *Poller) ready() []*shard {
	now := time.Now()
	var out []*shard
	for _, s := range p.shards {
		if s.done || now.Before(s.retryAt) {
			continue
		}
		if parent, ok := p.shards[s.parent]; ok && !parent.done {
			continue
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b *shard) int { return strings.Compare(a.id, b.id) })
	return out
}

// poll reads one batch of s and hands it over. It returns how many records it read.
func (p *Poller) poll(ctx context.Context, s *shard, h Handler) (int, error) {
	if s.iter == nil {
		if err := p.iterator(ctx, s); err != nil || s.done {
			return 0, err
		}
	}
	out, err := p.api.GetRecords(ctx, &dynamodbstreams.GetRecordsInput{ShardIterator: s.iter, Limit: &p.cfg.BatchSize})
	var expired *stypes.ExpiredIteratorException
	var trimmed *stypes.TrimmedDataAccessException
	switch {
	case errors.As(err, &expired):
		s.iter = nil // renewed from the saved position on the next pass
		return 0, nil
	case errors.As(err, &trimmed):
		p.log.Warn("stream poller: position older than the stream's retention; records were lost", "shard", s.id, "last", s.last)
		s.iter, s.last = nil, ""
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("get records of %s: %w", s.id, err)
	}
	p.records.Add(int64(len(out.Records)))
	if err := p.deliver(ctx, s, out.Records, h); err != nil {
		return len(out.Records), err
	}
	s.iter, s.backoff = out.NextShardIterator, 0
	if s.iter == nil {
		s.done = true // a closed shard, read to its end
		p.log.Info("stream poller: shard finished", "shard", s.id)
	}
	if len(out.Records) > 0 || s.done {
		p.saveCheckpoint()
	}
	return len(out.Records), nil
}

// iterator gets s an iterator: after its saved position, or at its start.
func (p *Poller) iterator(ctx context.Context, s *shard) error {
	in := &dynamodbstreams.GetShardIteratorInput{StreamArn: &p.arn, ShardId: &s.id}
	switch {
	case s.last != "":
		in.ShardIteratorType, in.SequenceNumber = stypes.ShardIteratorTypeAfterSequenceNumber, &s.last
	case p.cfg.StartLatest:
		in.ShardIteratorType = stypes.ShardIteratorTypeLatest
	default:
		in.ShardIteratorType = stypes.ShardIteratorTypeTrimHorizon
	}
	out, err := p.api.GetShardIterator(ctx, in)
	var trimmed *stypes.TrimmedDataAccessException
	var gone *stypes.ResourceNotFoundException
	switch {
	case errors.As(err, &trimmed):
		p.log.Warn("stream poller: saved position is past retention; restarting the shard at its trim horizon", "shard", s.id, "last", s.last)
		s.last = ""
		return p.iterator(ctx, s)
	case errors.As(err, &gone):
		p.log.Info("stream poller: shard gone", "shard", s.id)
		s.done = true
		return nil
	case err != nil:
		return fmt.Errorf("shard iterator of %s: %w", s.id, err)
	}
	s.iter = out.ShardIterator
	return nil
}

// deliver filters recs, hands what passes to h, and moves s.last past what is done.
func (p *Poller) deliver(ctx context.Context, s *shard, recs []stypes.Record, h Handler) error {
	var ev events.DynamoDBEvent
	all := make([]string, len(recs))
	for i, r := range recs {
		rec, err := Convert(r, p.arn, p.cfg.Region)
		all[i] = rec.Change.SequenceNumber
		if err != nil {
			p.log.Error("stream poller: record will not convert; skipped", "shard", s.id, "err", err)
			continue
		}
		b, err := json.Marshal(rec)
		if err != nil {
			p.log.Error("stream poller: record will not encode; skipped", "shard", s.id, "seq", all[i], "err", err)
			continue
		}
		if ok, _ := p.cfg.Filters.MatchJSON(b); ok {
			ev.Records = append(ev.Records, rec)
		}
	}
	if len(ev.Records) > 0 {
		p.invocations.Add(1)
		resp, err := h(ctx, ev)
		if err != nil {
			s.iter = nil // re-read the whole batch from the saved position
			return fmt.Errorf("handler: %w", err)
		}
		if len(resp.BatchItemFailures) > 0 {
			failed := map[string]bool{}
			for _, f := range resp.BatchItemFailures {
				failed[f.ItemIdentifier] = true
			}
			first := slices.IndexFunc(all, func(seq string) bool { return failed[seq] })
			if first < 0 {
				// Like Lambda: a failure naming no record of the batch fails all of it.
				s.iter = nil
				return fmt.Errorf("handler reported failures for unknown records %v", resp.BatchItemFailures)
			}
			if first > 0 {
				s.last = all[first-1]
				p.saveCheckpoint()
			}
			s.iter = nil
			return fmt.Errorf("handler reported %d failed records; retrying from %s", len(resp.BatchItemFailures), all[first])
		}
	}
	if len(all) > 0 {
		s.last = all[len(all)-1]
	}
	return nil
}

func (p *Poller) fail(s *shard, err error) {
	s.backoff = min(max(2*s.backoff, 50*time.Millisecond), p.cfg.MaxBackoff)
	s.retryAt = time.Now().Add(s.backoff)
	p.log.Warn("stream poller: retrying", "shard", s.id, "in", s.backoff, "err", err)
}

// checkpoint is the file format.
type checkpoint struct {
	StreamARN string                     `json:"stream_arn"`
	Shards    map[string]checkpointShard `json:"shards"`
}

type checkpointShard struct {
	Last string `json:"last,omitempty"`
	Done bool   `json:"done,omitempty"`
}

func (p *Poller) loadCheckpoint() {
	if p.cfg.Checkpoint == "" {
		return
	}
	b, err := os.ReadFile(p.cfg.Checkpoint)
	if errors.Is(err, os.ErrNotExist) {
		return
	}
	var c checkpoint
	if err == nil {
		err = json.Unmarshal(b, &c)
	}
	switch {
	case err != nil:
		p.log.Warn("stream poller: checkpoint unreadable; starting afresh", "file", p.cfg.Checkpoint, "err", err)
	case c.StreamARN != p.arn:
		p.log.Info("stream poller: checkpoint is for another stream; starting afresh", "file", p.cfg.Checkpoint)
	default:
		for id, cs := range c.Shards {
			p.shards[id] = &shard{id: id, last: cs.Last, done: cs.Done}
		}
	}
}

// saveCheckpoint writes the positions atomically (temporary file, then rename).
func (p *Poller) saveCheckpoint() {
	if p.cfg.Checkpoint == "" {
		return
	}
	c := checkpoint{StreamARN: p.arn, Shards: map[string]checkpointShard{}}
	for id, s := range p.shards {
		if s.last != "" || s.done {
			c.Shards[id] = checkpointShard{Last: s.last, Done: s.done}
		}
	}
	b, _ := json.Marshal(c) // strings and bools always marshal
	tmp, err := os.CreateTemp(filepath.Dir(p.cfg.Checkpoint), ".checkpoint-*")
	if err == nil {
		_, err = tmp.Write(b)
		if cerr := tmp.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Rename(tmp.Name(), p.cfg.Checkpoint)
		}
		if err != nil {
			os.Remove(tmp.Name())
		}
	}
	if err != nil {
		p.log.Warn("stream poller: save checkpoint", "file", p.cfg.Checkpoint, "err", err)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
