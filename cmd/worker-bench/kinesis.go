package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	ktypes "github.com/aws/aws-sdk-go-v2/service/kinesis/types"
	"github.com/sockfleet/sockfleet/shared/local/demoupstream"
	"github.com/sockfleet/sockfleet/shared/local/kinesalite"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/shared/sinkrecord"
)

// stallProxy forwards to kinesalite; while stalled, PutRecords calls hang until the
// stall ends or the caller gives up, as a Kinesis endpoint that stopped answering.
type stallProxy struct {
	rp      *httputil.ReverseProxy
	stalled atomic.Pointer[chan struct{}]
	addr    string
}

func newStallProxy(target string) (*stallProxy, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &stallProxy{rp: httputil.NewSingleHostReverseProxy(u), addr: "http://" + ln.Addr().String()}
	p.rp.ErrorLog = log.New(io.Discard, "", 0) // calls the worker abandoned at its sink timeout
	go func() { _ = http.Serve(ln, p) }()
	return p, nil
}

func (p *stallProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if ch := p.stalled.Load(); ch != nil && strings.HasSuffix(r.Header.Get("X-Amz-Target"), ".PutRecords") {
		select {
		case <-*ch:
		case <-r.Context().Done():
			return
		}
	}
	p.rp.ServeHTTP(w, r)
}

func (p *stallProxy) stall() { ch := make(chan struct{}); p.stalled.Store(&ch) }
func (p *stallProxy) resume() {
	if ch := p.stalled.Swap(nil); ch != nil {
		close(*ch)
	}
}

// kinesisBench runs the Kinesis measurements on one kinesalite.
type kinesisBench struct {
	*bench
	engine  *kinesalite.Proc
	proxy   *stallProxy
	k       *kinesis.Client
	streams int
}

func (b *bench) kinesis() (*kinesisBench, error) {
	eng, err := kinesalite.Start(kinesalite.Options{})
	if err != nil {
		return nil, err
	}
	p, err := newStallProxy(eng.Endpoint)
	if err != nil {
		eng.Stop()
		return nil, err
	}
	k := kinesis.NewFromConfig(localConfig(), func(o *kinesis.Options) { o.BaseEndpoint = aws.String(eng.Endpoint) })
	return &kinesisBench{bench: b, engine: eng, proxy: p, k: k}, nil
}

func (kb *kinesisBench) newStream(shards int32) (string, error) {
	kb.streams++
	name := fmt.Sprintf("bench%d", kb.streams)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := kb.k.CreateStream(ctx, &kinesis.CreateStreamInput{StreamName: &name, ShardCount: aws.Int32(shards)}); err != nil {
		return "", err
	}
	for {
		out, err := kb.k.DescribeStreamSummary(ctx, &kinesis.DescribeStreamSummaryInput{StreamName: &name})
		if err == nil && out.StreamDescriptionSummary.StreamStatus == ktypes.StreamStatusActive {
			return name, nil
		}
		if ctx.Err() != nil {
			return "", fmt.Errorf("stream %s not active: %v", name, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kinesisEnv points a worker at the proxy in front of kinesalite.
func (kb *kinesisBench) kinesisEnv() []string {
	return []string{"AWS_ENDPOINT_URL_KINESIS=" + kb.proxy.addr}
}

// throughput: messages per second one worker delivers to Kinesis, the upstream
// sending as fast as the worker reads.
func (kb *kinesisBench) throughput(n int, dur time.Duration, size int) error {
	stream, err := kb.newStream(4)
	if err != nil {
		return err
	}
	msgs, _, err := kb.deliveryRate(n, size, dur, "kinesis:"+stream, kb.kinesisEnv())
	if err != nil {
		return err
	}
	fmt.Printf("| Kinesis (kinesalite, 4 shards) | %d | %d B | %.0f | %s |\n", n, size, msgs, dur)
	return nil
}

// latency: with n connections at rate messages/s each, the time from the upstream's
// send timestamp (ts, ms) to the record's arrival in the stream.
func (kb *kinesisBench) latency(n int, rate float64, dur time.Duration) error {
	stream, err := kb.newStream(4)
	if err != nil {
		return err
	}
	r, err := kb.startRig(n, rate, 64, "kinesis:"+stream, kb.kinesisEnv())
	if err != nil {
		return err
	}
	defer r.up.stop()
	start := time.Now().Add(2 * time.Second) // skip the connect burst
	time.Sleep(2*time.Second + dur)
	r.w.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	lat, err := kb.arrivalLatencies(ctx, stream, start)
	if err != nil {
		return err
	}
	if len(lat) == 0 {
		return fmt.Errorf("no records after %s", start)
	}
	slices.Sort(lat)
	q := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
	fmt.Printf("| %d × %.0f/s | %d | %s | %s | %s | %s |\n", n, rate, len(lat), q(0.5), q(0.99), lat[len(lat)-1], dur)
	return nil
}

// arrivalLatencies reads every record and returns arrival − ts for those sent after from.
func (kb *kinesisBench) arrivalLatencies(ctx context.Context, stream string, from time.Time) ([]time.Duration, error) {
	shards, err := kb.k.ListShards(ctx, &kinesis.ListShardsInput{StreamName: &stream})
	if err != nil {
		return nil, err
	}
	var out []time.Duration
	for _, sh := range shards.Shards {
		it, err := kb.k.GetShardIterator(ctx, &kinesis.GetShardIteratorInput{StreamName: &stream, ShardId: sh.ShardId,
			ShardIteratorType: ktypes.ShardIteratorTypeTrimHorizon})
		if err != nil {
			return nil, err
		}
		iter := it.ShardIterator
		for iter != nil {
			res, err := kb.k.GetRecords(ctx, &kinesis.GetRecordsInput{ShardIterator: iter, Limit: aws.Int32(10000)})
			if err != nil {
				return nil, err
			}
			for _, r := range res.Records {
				rec, err := sinkrecord.Parse(r.Data)
				if err != nil || rec.Binary || r.ApproximateArrivalTimestamp == nil {
					continue
				}
				ts, ok := demoupstream.ProducedAt(rec.Data)
				if !ok {
					continue
				}
				sent := time.UnixMilli(ts)
				if sent.After(from) {
					out = append(out, r.ApproximateArrivalTimestamp.Sub(sent))
				}
			}
			if len(res.Records) == 0 {
				break
			}
			iter = res.NextShardIterator
		}
	}
	return out, nil
}

// stall: n connections at rate messages/s each; Kinesis stops answering PutRecords
// for d. Renewals must go on (none missed), memory must stay flat, and delivery
// must resume without a gap afterwards.
func (kb *kinesisBench) stall(n int, rate float64, d time.Duration) error {
	stream, err := kb.newStream(4)
	if err != nil {
		return err
	}
	// Renew every 2 s, so a 10 s stall spans five rounds of renewals.
	env := append(kb.kinesisEnv(), schema.EnvLease+"=20s", schema.EnvRenewInterval+"=2s", schema.EnvRenewDeadline+"=10s")
	r, err := kb.startRig(n, rate, 64, "kinesis:"+stream, env)
	if err != nil {
		return err
	}
	defer r.stop()
	w := r.w
	time.Sleep(5 * time.Second)
	rss0, _ := rssKB(w.cmd.Process.Pid)
	fails0, _ := metric(w.addr, "sockfleet_renew_failures_total")
	lost0, _ := metric(w.addr, "sockfleet_leases_lost_total")
	fence0, _ := metric(w.addr, "sockfleet_self_fences_total")
	leases0, err := kb.leaseExpiries(r.table)
	if err != nil {
		return err
	}
	kb.proxy.stall()
	var peak int64
	var slowMax, queueMax int64
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		if r, err := rssKB(w.cmd.Process.Pid); err == nil {
			peak = max(peak, r)
		}
		if v, err := metric(w.addr, "sockfleet_sink_slow_connections"); err == nil {
			slowMax = max(slowMax, v)
		}
		if v, err := metric(w.addr, "sockfleet_sink_queue_depth"); err == nil {
			queueMax = max(queueMax, v)
		}
	}
	leases1, err := kb.leaseExpiries(r.table)
	if err != nil {
		return err
	}
	kb.proxy.resume()
	m0, _ := metric(w.addr, "sockfleet_messages_total")
	time.Sleep(5 * time.Second)
	m1, _ := metric(w.addr, "sockfleet_messages_total")
	fails1, _ := metric(w.addr, "sockfleet_renew_failures_total")
	lost1, _ := metric(w.addr, "sockfleet_leases_lost_total")
	fence1, _ := metric(w.addr, "sockfleet_self_fences_total")
	renewed := 0
	for id, e := range leases1 {
		if e > leases0[id] {
			renewed++
		}
	}
	fmt.Printf("| %d × %.0f/s | %s | %d of %d | %d | %d / %d | %.1f → %.1f MiB | %d | %d | %.0f |\n",
		n, rate, d, renewed, n, fails1-fails0, lost1-lost0, fence1-fence0, float64(rss0)/1024, float64(peak)/1024,
		slowMax, queueMax, float64(m1-m0)/5)
	return nil
}

// leaseExpiries returns each connection's lease_expires_at_ms.
func (kb *kinesisBench) leaseExpiries(table string) (map[string]int64, error) {
	out := map[string]int64{}
	p := dynamodb.NewScanPaginator(kb.db, &dynamodb.ScanInput{TableName: &table, ConsistentRead: aws.Bool(true)})
	for p.HasMorePages() {
		page, err := p.NextPage(context.Background())
		if err != nil {
			return nil, err
		}
		for _, it := range page.Items {
			c, err := codec.DecodeConnection(it)
			if err == nil {
				out[c.ID] = c.LeaseExpiresAtMs
			}
		}
	}
	return out, nil
}

// fileThroughputRow is the file sink's row of the comparison table, same run.
func (b *bench) fileThroughputRow(n int, dur time.Duration, size int) error {
	out := filepath.Join(b.dir, fmt.Sprintf("cmp%d.jsonl", n))
	defer os.Remove(out)
	msgs, _, err := b.deliveryRate(n, size, dur, "file:"+out, nil)
	if err != nil {
		return err
	}
	fmt.Printf("| file | %d | %d B | %.0f | %s |\n", n, size, msgs, dur)
	return nil
}

// runKinesis prints the sink comparison, the latency and the stall tables.
func (b *bench) runKinesis(tput []int, dur time.Duration, size int, latConns int, latRate float64, stallFor time.Duration) error {
	kb, err := b.kinesis()
	if err != nil {
		return err
	}
	defer kb.engine.Stop()
	header(true, "sink", "connections", "payload", "messages/s", "window")
	for _, n := range tput {
		if err := b.fileThroughputRow(n, dur, size); err != nil {
			return fmt.Errorf("file throughput at %d: %w", n, err)
		}
		if err := kb.throughput(n, dur, size); err != nil {
			return fmt.Errorf("kinesis throughput at %d: %w", n, err)
		}
	}
	fmt.Println()
	header(true, "load", "records", "p50 send → record", "p99", "max", "window")
	if err := kb.latency(latConns, latRate, dur); err != nil {
		return fmt.Errorf("kinesis latency: %w", err)
	}
	fmt.Println()
	header(true, "load", "Kinesis stall", "leases renewed during it", "renew failures", "leases lost / self-fences",
		"RSS before → peak", "connections sink_slow (max)", "queue depth (max)", "messages/s after")
	if err := kb.stall(latConns, latRate, stallFor); err != nil {
		return fmt.Errorf("kinesis stall: %w", err)
	}
	return nil
}
