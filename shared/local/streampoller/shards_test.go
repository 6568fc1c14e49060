package streampoller

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodbstreams"
	stypes "github.com/aws/aws-sdk-go-v2/service/dynamodbstreams/types"
	"github.com/sockfleet/sockfleet/shared/schema"
)

// fakeStreams is an in-memory stream whose shards can be closed, split and expired,
// which the local engine never does on its own.
type fakeStreams struct {
	mu       sync.Mutex
	shards   []stypes.Shard
	records  map[string][]stypes.Record
	closed   map[string]bool
	expireAt map[string]int // shard -> the GetRecords call (1-based) that finds its iterator expired
	trimmed  map[string]bool
	gets     map[string]int
	iters    []string // "shard type seq" of every GetShardIterator
}

func (f *fakeStreams) ListStreams(context.Context, *dynamodbstreams.ListStreamsInput, ...func(*dynamodbstreams.Options)) (*dynamodbstreams.ListStreamsOutput, error) {
	return &dynamodbstreams.ListStreamsOutput{Streams: []stypes.Stream{
		{StreamArn: aws.String("arn:old"), StreamLabel: aws.String("2026-01-01")},
		{StreamArn: aws.String("arn:new"), StreamLabel: aws.String("2026-12-01")},
	}}, nil
}

func (f *fakeStreams) DescribeStream(_ context.Context, in *dynamodbstreams.DescribeStreamInput, _ ...func(*dynamodbstreams.Options)) (*dynamodbstreams.DescribeStreamOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if aws.ToString(in.StreamArn) != "arn:new" {
		return nil, fmt.Errorf("described %s, want the newest stream", aws.ToString(in.StreamArn))
	}
	// One shard per page, to exercise pagination.
	i := 0
	if in.ExclusiveStartShardId != nil {
		i = slices.IndexFunc(f.shards, func(s stypes.Shard) bool { return *s.ShardId == *in.ExclusiveStartShardId }) + 1
	}
	d := &stypes.StreamDescription{Shards: f.shards[i : i+1]}
	if i+1 < len(f.shards) {
		d.LastEvaluatedShardId = f.shards[i].ShardId
	}
	return &dynamodbstreams.DescribeStreamOutput{StreamDescription: d}, nil
}

func (f *fakeStreams) GetShardIterator(_ context.Context, in *dynamodbstreams.GetShardIteratorInput, _ ...func(*dynamodbstreams.Options)) (*dynamodbstreams.GetShardIteratorOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := aws.ToString(in.ShardId)
	f.iters = append(f.iters, strings.TrimSpace(fmt.Sprintf("%s %s %s", id, in.ShardIteratorType, aws.ToString(in.SequenceNumber))))
	pos := 0
	switch in.ShardIteratorType {
	case stypes.ShardIteratorTypeAfterSequenceNumber:
		if f.trimmed[id] {
			delete(f.trimmed, id)
			return nil, &stypes.TrimmedDataAccessException{Message: aws.String("trimmed")}
		}
		pos = slices.IndexFunc(f.records[id], func(r stypes.Record) bool { return *r.Dynamodb.SequenceNumber == *in.SequenceNumber }) + 1
	case stypes.ShardIteratorTypeLatest:
		pos = len(f.records[id])
	}
	return &dynamodbstreams.GetShardIteratorOutput{ShardIterator: aws.String(fmt.Sprintf("%s|%d", id, pos))}, nil
}

func (f *fakeStreams) GetRecords(_ context.Context, in *dynamodbstreams.GetRecordsInput, _ ...func(*dynamodbstreams.Options)) (*dynamodbstreams.GetRecordsOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	id, p, _ := strings.Cut(aws.ToString(in.ShardIterator), "|")
	pos, _ := strconv.Atoi(p)
	f.gets[id]++
	if f.expireAt[id] == f.gets[id] {
		return nil, &stypes.ExpiredIteratorException{Message: aws.String("expired")}
	}
	end := min(pos+int(aws.ToInt32(in.Limit)), len(f.records[id]))
	out := &dynamodbstreams.GetRecordsOutput{Records: f.records[id][pos:end]}
	if !(f.closed[id] && end == len(f.records[id])) {
		out.NextShardIterator = aws.String(fmt.Sprintf("%s|%d", id, end))
	}
	return out, nil
}

func record(seq, key string) stypes.Record {
	return stypes.Record{
		EventID: aws.String("e" + seq), EventName: stypes.OperationTypeInsert, EventSource: aws.String("aws:dynamodb"),
		Dynamodb: &stypes.StreamRecord{
			SequenceNumber: aws.String(seq),
			Keys:           map[string]stypes.AttributeValue{schema.AttrPK: &stypes.AttributeValueMemberS{Value: key}},
			NewImage:       map[string]stypes.AttributeValue{schema.AttrPK: &stypes.AttributeValueMemberS{Value: key}},
			StreamViewType: stypes.StreamViewTypeNewAndOldImages,
		},
	}
}

func mkShard(id, parent string) stypes.Shard {
	s := stypes.Shard{ShardId: aws.String(id)}
	if parent != "" {
		s.ParentShardId = aws.String(parent)
	}
	return s
}

func TestShardRolloverAndExpiredIterators(t *testing.T) {
	f := &fakeStreams{
		// The child is listed first: order in the listing must not matter.
		shards: []stypes.Shard{mkShard("s2", "s1"), mkShard("s1", ""), mkShard("s9", "trimmed-away")},
		records: map[string][]stypes.Record{
			"s1": {record("11", "CONN#a"), record("12", "CONN#b")},
			"s2": {record("21", "CONN#c"), record("22", "CONN#d"), record("23", "CONN#e")},
			"s9": {record("91", "CONN#z")},
		},
		closed:   map[string]bool{"s1": true},
		expireAt: map[string]int{"s2": 2},
		gets:     map[string]int{},
	}
	file := filepath.Join(t.TempDir(), "checkpoint.json")
	p, err := New(f, Config{Table: "t", BatchSize: 1, IdleSleep: time.Millisecond, RefreshEvery: 10 * time.Millisecond, Checkpoint: file})
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	stop := start(t, p, rec.handle)
	var got []string
	for range 6 {
		got = append(got, rec.next(t).Change.SequenceNumber)
	}
	rec.none(t, 50*time.Millisecond)
	stop()
	pos := func(seq string) int { return slices.Index(got, seq) }
	if len(got) != 6 || pos("11") > pos("12") || pos("12") > pos("21") || pos("21") > pos("22") || pos("22") > pos("23") {
		t.Errorf("delivered %v: want every record once, the parent's before the child's, in order", got)
	}
	if !slices.Contains(f.iters, "s2 AFTER_SEQUENCE_NUMBER 21") {
		t.Errorf("expired iterator not renewed from the position: %v", f.iters)
	}

	// A restart resumes every shard where it stopped; a position past retention
	// restarts that shard at its trim horizon.
	f.mu.Lock()
	f.records["s2"] = append(f.records["s2"], record("24", "CONN#f"))
	f.records["s9"] = append(f.records["s9"], record("92", "CONN#y"))
	f.trimmed = map[string]bool{"s9": true}
	f.iters = nil
	f.mu.Unlock()
	p2, _ := New(f, Config{Table: "t", IdleSleep: time.Millisecond, Checkpoint: file})
	rec2 := newRecorder()
	stop2 := start(t, p2, rec2.handle)
	defer stop2()
	var again []string
	for range 3 {
		again = append(again, rec2.next(t).Change.SequenceNumber)
	}
	slices.Sort(again)
	if fmt.Sprint(again) != "[24 91 92]" {
		t.Errorf("after restart delivered %v, want [24 91 92]", again)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, it := range f.iters {
		if strings.HasPrefix(it, "s1 ") {
			t.Errorf("finished shard s1 read again: %v", f.iters)
		}
	}
}
