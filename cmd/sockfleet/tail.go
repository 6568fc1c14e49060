package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"
	"github.com/sockfleet/sockfleet/shared/sinkrecord"
)

// tailOpts are tail's flags.
type tailOpts struct {
	source string // kinesis:STREAM, file:PATH or a path
	conn   string // only this connection
	follow bool
	latest bool // Kinesis: start at the newest record, not the oldest
	poll   time.Duration
}

func parseTail(args []string) (tailOpts, error) {
	o := tailOpts{poll: time.Second}
	for i := 0; i < len(args); i++ {
		switch a := args[i]; {
		case a == "-f" || a == "--follow":
			o.follow = true
		case a == "--latest":
			o.latest = true
		case a == "--conn" && i+1 < len(args):
			o.conn = args[i+1]
			i++
		case strings.HasPrefix(a, "-"):
			return o, fmt.Errorf("%w: tail: unknown flag %q", errUsage, a)
		case o.source == "":
			o.source = a
		default:
			return o, fmt.Errorf("%w: tail takes one source", errUsage)
		}
	}
	if o.source == "" {
		return o, fmt.Errorf("%w: tail kinesis:STREAM|file:PATH [--conn ID] [-f] [--latest]", errUsage)
	}
	return o, nil
}

// tally is what tail saw of one connection: the records as they came (count, seq
// range in the latest epoch, gaps, repeats, bad), and what the consumer rule
// (docs/SINKS.md, "Fencing: effectively once") dropped.
type tally struct {
	n, repeats, gaps int
	first, last      int64
	epoch            int64
	bad              int
	snapshots        int // records marked snapshot: a jump to one is not a gap
	stale, dups      int // dropped by the rule: a lower lease_version; at or below the accepted position
}

// printer writes records one per line and keeps per-connection tallies.
type printer struct {
	out     io.Writer
	conn    string
	tallies map[string]*tally
	fence   sinkrecord.Fence
	skipped int // lines that were not records
}

func (p *printer) line(b []byte) {
	b = bytes.TrimRight(b, "\r\n")
	if len(b) == 0 {
		return
	}
	r, err := sinkrecord.Parse(b)
	if err != nil {
		p.skipped++
		fmt.Fprintf(p.out, "! %v: %.80q\n", err, b)
		return
	}
	if p.conn != "" && r.Conn != p.conn {
		return
	}
	t := p.tallies[r.Conn]
	if t == nil {
		t = &tally{first: r.Seq, last: r.Seq - 1, epoch: r.Epoch}
		p.tallies[r.Conn] = t
	}
	t.n++
	switch {
	case r.Bad:
		t.bad++
	case r.Epoch > t.epoch: // the upstream's numbering restarted: a new range, no gap
		t.epoch, t.first, t.last = r.Epoch, r.Seq, r.Seq
	case r.Snapshot && r.Epoch == t.epoch && r.Seq >= t.last:
		t.snapshots++ // the state up to its seq: the deltas it covers are not sent
		t.last = r.Seq
	case r.Epoch < t.epoch || r.Seq <= t.last:
		t.repeats++
	case r.Seq > t.last+1:
		t.gaps++
		t.last = r.Seq
	default:
		t.last = r.Seq
	}
	flag := ""
	switch p.fence.Check(r) {
	case sinkrecord.Stale:
		t.stale++
		flag = " stale"
	case sinkrecord.Duplicate:
		t.dups++
		flag = " duplicate"
	}
	data := string(r.Data)
	switch {
	case r.Oversize > 0:
		data = fmt.Sprintf("(oversize: %d bytes, not delivered)", r.Oversize)
	case r.Binary:
		data = fmt.Sprintf("(%d bytes) %x", len(r.Data), r.Data[:min(len(r.Data), 32)])
	}
	if r.Bad {
		flag = " bad" + flag
	}
	if r.Snapshot {
		flag = " snapshot" + flag
	}
	if r.Version != 0 {
		flag = fmt.Sprintf(" lease_version=%d%s", r.Version, flag)
	}
	fmt.Fprintf(p.out, "%s\tseq=%d epoch=%d%s\t%s\n", r.Conn, r.Seq, r.Epoch, flag, data)
}

func (p *printer) summary() {
	ids := make([]string, 0, len(p.tallies))
	for id := range p.tallies {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	fmt.Fprintf(p.out, "\n%d connections\n", len(ids))
	for _, id := range ids {
		t := p.tallies[id]
		epoch := ""
		if t.epoch != 0 {
			epoch = fmt.Sprintf(" (epoch %d)", t.epoch)
		}
		snaps := ""
		if t.snapshots > 0 {
			snaps = fmt.Sprintf(", %d snapshots", t.snapshots)
		}
		fmt.Fprintf(p.out, "%s\t%d messages, seq %d..%d%s%s, %d gaps, %d repeats, %d bad; dropped %d stale, %d duplicates (lease_version %d)\n",
			id, t.n, t.first, t.last, epoch, snaps, t.gaps, t.repeats, t.bad, t.stale, t.dups, p.fence.State(id).Version)
	}
	if p.skipped > 0 {
		fmt.Fprintf(p.out, "%d lines were not sink records\n", p.skipped)
	}
}

// tail prints a sink's records and, unless following, a summary per connection.
func (c *cli) tail(ctx context.Context, cfg aws.Config, o tailOpts) error {
	p := &printer{out: c.out, conn: o.conn, tallies: map[string]*tally{}}
	var err error
	if stream, ok := strings.CutPrefix(o.source, "kinesis:"); ok {
		err = tailKinesis(ctx, kinesis.NewFromConfig(cfg), stream, o, p)
	} else {
		err = tailFile(ctx, strings.TrimPrefix(o.source, "file:"), o, p)
	}
	if ctx.Err() != nil {
		err = nil // Ctrl-C ends a follow
	}
	p.summary()
	return err
}

func tailFile(ctx context.Context, path string, o tailOpts, p *printer) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("tail: %w", err)
	}
	defer f.Close()
	br := bufio.NewReaderSize(f, 64<<10)
	var partial []byte
	for {
		b, err := br.ReadBytes('\n')
		partial = append(partial, b...)
		if err == nil {
			p.line(partial)
			partial = partial[:0]
			continue
		}
		if err != io.EOF {
			return fmt.Errorf("tail %s: %w", path, err)
		}
		if !o.follow {
			p.line(partial) // a last line without its newline
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(o.poll):
		}
	}
}

// KinesisReader is the part of the Kinesis client tail uses.
type KinesisReader interface {
	ListShards(context.Context, *kinesis.ListShardsInput, ...func(*kinesis.Options)) (*kinesis.ListShardsOutput, error)
	GetShardIterator(context.Context, *kinesis.GetShardIteratorInput, ...func(*kinesis.Options)) (*kinesis.GetShardIteratorOutput, error)
	GetRecords(context.Context, *kinesis.GetRecordsInput, ...func(*kinesis.Options)) (*kinesis.GetRecordsOutput, error)
}

// tailKinesis reads every shard round the clock until each is caught up (or, with
// follow, until ctx ends). A record holds one sink line.
func tailKinesis(ctx context.Context, k KinesisReader, stream string, o tailOpts, p *printer) error {
	var ls kinesis.ListShardsInput
	if strings.HasPrefix(stream, "arn:") {
		ls.StreamARN = aws.String(stream)
	} else {
		ls.StreamName = aws.String(stream)
	}
	shards, err := k.ListShards(ctx, &ls)
	if err != nil {
		return fmt.Errorf("tail: list shards of %s: %w", stream, err)
	}
	start := types.ShardIteratorTypeTrimHorizon
	if o.latest {
		start = types.ShardIteratorTypeLatest
	}
	iters := map[string]*string{}
	for _, sh := range shards.Shards {
		in := &kinesis.GetShardIteratorInput{ShardId: sh.ShardId, ShardIteratorType: start,
			StreamName: ls.StreamName, StreamARN: ls.StreamARN}
		it, err := k.GetShardIterator(ctx, in)
		if err != nil {
			return fmt.Errorf("tail: shard %s: %w", aws.ToString(sh.ShardId), err)
		}
		iters[*sh.ShardId] = it.ShardIterator
	}
	ids := make([]string, 0, len(iters))
	for id := range iters {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for len(iters) > 0 {
		caughtUp := true
		for _, id := range ids {
			it := iters[id]
			if it == nil {
				continue
			}
			out, err := k.GetRecords(ctx, &kinesis.GetRecordsInput{ShardIterator: it, StreamARN: ls.StreamARN})
			if err != nil {
				return fmt.Errorf("tail: read shard %s: %w", id, err)
			}
			for _, r := range out.Records {
				p.line(r.Data)
			}
			if len(out.Records) > 0 || aws.ToInt64(out.MillisBehindLatest) > 0 {
				caughtUp = false
			}
			iters[id] = out.NextShardIterator // nil: the shard is closed
			if out.NextShardIterator == nil {
				delete(iters, id)
			}
		}
		if caughtUp && !o.follow {
			return nil
		}
		if caughtUp {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(o.poll):
			}
		}
	}
	return nil
}
