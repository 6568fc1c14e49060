package stream

import (
	"context"
	"flag"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/sockfleet/sockfleet/shared/local/ddbtest"
	"github.com/sockfleet/sockfleet/shared/local/demoupstream"
	"github.com/sockfleet/sockfleet/worker/internal/connquota"
)

var quotaWorkers = flag.Int("quota.workers", 5, "workers sharing the connect quota through the table in BenchmarkFleetQuotaFailover")

// countingDB counts the quota store's writes (conditional failures included: they
// are billed too) and reads.
type countingDB struct {
	connquota.DB
	writes, reads atomic.Int64
}

func (c *countingDB) GetItem(ctx context.Context, in *dynamodb.GetItemInput, o ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	c.reads.Add(1)
	return c.DB.GetItem(ctx, in, o...)
}

func (c *countingDB) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, o ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	c.writes.Add(1)
	return c.DB.UpdateItem(ctx, in, o...)
}

// BenchmarkFleetQuotaFailover is a mass failover of quota.conns connections onto
// quota.workers workers at once, each worker with its own client of one table on the
// local engine, against one upstream host under a fleet-wide quota of quota.n dials
// per quota.window. It reports the most handshakes the upstream accepted in one of
// the quota's (epoch-aligned) windows (goal: at most quota.n), the most in any
// sliding window of the same length (a fixed window allows up to 2 × quota.n
// there), the time until all stream against what the quota allows, and the quota's
// table writes per dial.
//
//	go test -run '^$' -bench FleetQuotaFailover -benchtime 1x ./worker/internal/stream/ \
//	  -args -quota.conns=500 -quota.workers=5 -quota.n=50 -quota.window=1s
func BenchmarkFleetQuotaFailover(b *testing.B) {
	for range b.N {
		env := ddbtest.New(b)
		up, err := demoupstream.Listen("127.0.0.1:0", demoupstream.Config{Rate: 1, Size: 16})
		if err != nil {
			b.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		cl := &countingListener{Listener: ln}
		go proxy(cl, up.Addr())
		snk := &checkSink{next: map[string]int64{}}
		cfgs := make([]*Config, *quotaWorkers)
		dbs := make([]*countingDB, *quotaWorkers)
		for i := range cfgs {
			cfgs[i] = benchConfig(b, snk)
			dbs[i] = &countingDB{DB: env.Client(nil)}
			cfgs[i].Gate = &TableGate{Store: &connquota.Store{DB: dbs[i], Table: env.Table}, N: *quotaN, W: *quotaW,
				Local: &LocalGate{}, Metrics: cfgs[i].Metrics}
		}
		ctx, cancel := context.WithCancelCause(context.Background())
		var wg sync.WaitGroup
		streams := make([]*Stream, *quotaConns)
		start := time.Now()
		for i := range streams {
			id := fmt.Sprintf("q%05d", i)
			streams[i] = New(cfgs[i%len(cfgs)], id, "ws://"+ln.Addr().String()+"/streams/"+id, 0)
			wg.Go(func() { streams[i].Run(ctx) })
		}
		for {
			all := true
			for _, s := range streams {
				all = all && s.Status().State == "streaming"
			}
			if all {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		took := time.Since(start)
		cancel(ErrGraceful)
		wg.Wait()
		ln.Close()
		up.Close()
		cl.mu.Lock()
		aligned, sliding := map[int64]int{}, 0
		for i, t := range cl.times {
			aligned[t.UnixMilli()/quotaW.Milliseconds()]++
			n := 0
			for _, u := range cl.times[i:] {
				if u.Sub(t) < *quotaW {
					n++
				}
			}
			sliding = max(sliding, n)
		}
		dials := len(cl.times)
		cl.mu.Unlock()
		most := 0
		for _, n := range aligned {
			most = max(most, n)
		}
		var writes, tableErrors int64
		for i := range cfgs {
			writes += dbs[i].writes.Load()
			tableErrors += cfgs[i].Metrics.QuotaTableErrors.Load()
		}
		allowed := time.Duration((*quotaConns+*quotaN-1) / *quotaN - 1) * *quotaW
		b.ReportMetric(float64(most), "max-dials-per-window")
		b.ReportMetric(float64(sliding), "max-dials-per-sliding-window")
		b.ReportMetric(took.Seconds(), "s-until-all-stream")
		b.ReportMetric(allowed.Seconds(), "s-quota-allows")
		b.ReportMetric(float64(writes)/float64(dials), "table-writes-per-dial")
		b.ReportMetric(float64(tableErrors), "table-errors")
	}
}
