package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/local/demoupstream"
	"github.com/sockfleet/sockfleet/shared/local/dynoxide"
	"github.com/sockfleet/sockfleet/shared/local/fleet"
	"github.com/sockfleet/sockfleet/shared/local/localddb"
	"github.com/sockfleet/sockfleet/shared/local/netguard"
	"github.com/sockfleet/sockfleet/shared/local/netrules"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

// enforceIAM runs stream-mode fleets as the stack's roles, behind the IAM proxy
// (fleet.EnforceIAM), as `make run` does. Polling mode is the seed's design, which
// the stack does not deploy, so it has no policies to enforce: its processes go
// through the same proxy unrestricted, so that both modes pay the same extra hop
// and stay comparable side by side.
var enforceIAM = flag.Bool("iam", true, "enforce the synthesized stack's IAM policies in stream mode (make template writes the template)")

// sweepPeriod is the backstop sweep's schedule in stream mode: the CDK stack's.
const sweepPeriod = 60 * time.Second

var (
	networkRules = flag.Bool("network-rules", true, "enforce the synthesized template's security group rules on the calls "+
		"between the fleets' processes, as `make run` does (a refused call is reported: its figures would not hold on AWS)")
	templatePath = flag.String("template", "", "the template whose network rules to enforce; default: cdk.out/"+
		netrules.DefaultStack+".template.json in this folder or a parent (make template)")
)

var loadedTemplate struct {
	once sync.Once
	t    *netrules.Template
	err  error
}

// network is the template the fleets enforce (read once); nil with -network-rules=false.
func network() (*netrules.Template, error) {
	if !*networkRules {
		return nil, nil
	}
	loadedTemplate.once.Do(func() {
		if *templatePath != "" {
			loadedTemplate.t, loadedTemplate.err = netrules.Load(*templatePath)
		} else {
			loadedTemplate.t, loadedTemplate.err = netrules.LoadDefault()
		}
	})
	if loadedTemplate.err != nil {
		return nil, fmt.Errorf("network rules: %w (or pass -network-rules=false)", loadedTemplate.err)
	}
	return loadedTemplate.t, nil
}

// fleetSpec shapes one benchmark fleet.
type fleetSpec struct {
	Mode           string // schema.ModeStream or schema.ModePolling
	Workers        int
	Conns          int
	MaxConnections int     // per worker; 0: the worker's default
	Rate           float64 // upstream messages per second per stream
	Size           int     // upstream payload bytes
	// RestartDelay is how long the supervisor takes to replace an exited worker.
	RestartDelay time.Duration
	// Env, if set, adds settings of the worker with id (after the ones above).
	Env       func(id string) []string
	NoRestart bool // an exited worker stays gone (a scale-in)
	// UpstreamRTT, if set, puts the upstream behind a delayLink: on another host,
	// this round trip away, as far as timing goes.
	UpstreamRTT time.Duration
}

// benchFleet is a running fleet: its own engine, table, upstream, metering proxies
// (one for the workers, one for the reconciler) and processes.
type benchFleet struct {
	spec    fleetSpec
	dir     string
	engine  *dynoxide.Proc
	db      *dynamodb.Client
	table   string
	up      *demoupstream.Server
	link    *delayLink        // in front of up, if spec.UpstreamRTT is set
	workers *fleet.FaultProxy // every worker call goes through it
	recon   *fleet.FaultProxy // every reconciler call (stream mode)
	stack   *fleet.Stack
	iam     *fleet.IAM // nil when IAM is not enforced
	ids     []string
	http    *http.Client
	log     *slog.Logger
}

func startFleet(ctx context.Context, bins fleet.Binaries, spec fleetSpec, dir string, log *slog.Logger) (*benchFleet, error) {
	f := &benchFleet{spec: spec, dir: dir, table: "sockfleet", log: log, http: &http.Client{Timeout: 2 * time.Second}}
	fail := func(err error) (*benchFleet, error) { f.Stop(); return nil, err }
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var err error
	if f.engine, err = dynoxide.Start(dynoxide.Options{}); err != nil {
		return nil, err
	}
	f.db = dynamodb.New(dynamodb.Options{
		Region: fleet.LocalRegion, BaseEndpoint: aws.String(f.engine.Endpoint),
		Credentials: credentials.NewStaticCredentialsProvider("local", "local", ""),
	})
	if _, err := localddb.EnsureTable(ctx, f.db, f.table); err != nil {
		return fail(err)
	}
	if spec.Mode == schema.ModePolling {
		if err := localddb.EnsurePollingIndex(ctx, f.db, f.table); err != nil {
			return fail(err)
		}
	}
	if f.up, err = demoupstream.Listen("127.0.0.1:0", demoupstream.Config{Rate: spec.Rate, Size: spec.Size,
		ClientTimeout: 5 * time.Second}); err != nil {
		return fail(err)
	}
	if spec.UpstreamRTT > 0 {
		if f.link, err = newDelayLink(f.up.Addr(), spec.UpstreamRTT); err != nil {
			return fail(err)
		}
	}
	// Every process reaches the engine as its role, through the IAM proxy; the
	// metering proxies sit in front of it.
	engine, keys := f.engine.Endpoint, fleet.Keys{}
	if *enforceIAM {
		if f.iam, err = fleet.EnforceIAM(ctx, fleet.IAMConfig{Endpoint: engine, Table: f.table, Log: log}); err != nil {
			return fail(err)
		}
		engine = f.iam.DynamoDB.Endpoint()
		if spec.Mode == schema.ModeStream {
			keys = f.iam.Keys
		}
	}
	if f.workers, err = fleet.NewFaultProxy(engine, 1); err != nil {
		return fail(err)
	}
	cfg := fleet.Config{
		Keys: keys,
		Dir:  dir, Endpoint: engine, WorkerEndpoint: f.workers.Endpoint(), Table: f.table,
		Cluster: "bench", Secret: "bench-secret-0123456789abcdef", Workers: spec.Workers,
		WorkerBin: bins.Worker, Restart: !spec.NoRestart, RestartDelay: spec.RestartDelay, Log: log,
		WorkerEnv: func(_ int, id string) []string {
			env := []string{schema.EnvLogLevel + "=info"}
			if spec.MaxConnections > 0 {
				env = append(env, schema.EnvMaxConnections+"="+strconv.Itoa(spec.MaxConnections))
			}
			if spec.Mode == schema.ModePolling {
				env = append(env, schema.EnvMode+"="+schema.ModePolling)
			}
			if spec.Env != nil {
				env = append(env, spec.Env(id)...)
			}
			return env
		},
	}
	if cfg.Network, err = network(); err != nil {
		return fail(err)
	}
	if spec.Mode == schema.ModeStream {
		if f.recon, err = fleet.NewFaultProxy(engine, 2); err != nil {
			return fail(err)
		}
		cfg.Bootstrap, cfg.RIE, cfg.LambdaAddr = bins.Bootstrap, bins.RIE, "127.0.0.1:0"
		cfg.SweepEvery = sweepPeriod
		cfg.ReconcilerEnv = []string{
			schema.EnvSweepPeriod + "=" + sweepPeriod.String(),
			schema.EnvSkewMargin + "=" + schema.DefaultSkewMargin.String(),
			"AWS_ENDPOINT_URL_DYNAMODB=" + f.recon.Endpoint(),
		}
	}
	if f.stack, err = fleet.Start(ctx, cfg); err != nil {
		return fail(err)
	}
	// Workers first, so the reconciler has somewhere to put the new connections.
	if err := f.waitWorkers(ctx, time.Minute); err != nil {
		return fail(err)
	}
	time.Sleep(2 * time.Second) // let the workers register
	for i := range spec.Conns {
		id := fmt.Sprintf("c%04d", i)
		f.ids = append(f.ids, id)
		it := codec.EncodeConnection(codec.Connection{ID: id, DesiredState: schema.Started, WSURL: f.upstreamURL(id)})
		if _, err := f.db.PutItem(ctx, &dynamodb.PutItemInput{TableName: &f.table, Item: it}); err != nil {
			return fail(fmt.Errorf("add %s: %w", id, err))
		}
	}
	return f, nil
}

// Stop drains the workers and stops everything; safe on a partly started fleet.
func (f *benchFleet) Stop() {
	if f.stack != nil {
		f.stack.Stop()
		// The fleet logs each refusal; with a silent log, say it here.
		for _, line := range netguard.Summary(f.stack.Denials()) {
			fmt.Fprintf(os.Stderr, "sockfleet-bench: %s: calls the template's security groups refuse, so its figures do not hold on AWS: %s\n", f.dir, line)
		}
	}
	for _, p := range []*fleet.FaultProxy{f.workers, f.recon} {
		if p != nil {
			p.Close()
		}
	}
	if f.link != nil {
		f.link.Close()
	}
	if f.up != nil {
		f.up.Close()
	}
	if f.iam != nil {
		for _, d := range f.iam.Denials() {
			f.log.Error("IAM denied a call during the benchmark: its figures are not those of the stack", "role", d.Role, "action", d.Action, "resource", d.Resource)
		}
		f.iam.Close()
	}
	f.engine.Stop()
}

// upstreamURL is the URL connection id streams from: the upstream's, or its
// delayLink's.
func (f *benchFleet) upstreamURL(id string) string {
	u := f.up.URL(id)
	if f.link != nil {
		u = strings.Replace(u, f.up.Addr(), f.link.Addr(), 1)
	}
	return u
}

// usage is what both proxies metered so far.
func (f *benchFleet) usage() (workers, recon fleet.Usage) {
	workers = f.workers.Meter.Snapshot()
	if f.recon != nil {
		recon = f.recon.Meter.Snapshot()
	}
	return workers, recon
}

func (f *benchFleet) invokes(kind string) int {
	if f.stack.Lambda == nil {
		return 0
	}
	return f.stack.InvokeCount(kind)
}

func (f *benchFleet) setState(ctx context.Context, id string, s schema.State) error {
	_, err := f.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: &f.table, Key: map[string]types.AttributeValue{schema.AttrPK: codec.S(schema.ConnKey(id))},
		UpdateExpression:          aws.String("SET desired_state = :s"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":s": codec.S(string(s))},
	})
	return err
}

// conns reads every connection item (consistent reads, straight from the engine: the
// observer is not metered).
func (f *benchFleet) conns(ctx context.Context) (map[string]codec.Connection, error) {
	out := map[string]codec.Connection{}
	var start map[string]types.AttributeValue
	for {
		page, err := f.db.Scan(ctx, &dynamodb.ScanInput{TableName: &f.table, ExclusiveStartKey: start, ConsistentRead: aws.Bool(true)})
		if err != nil {
			return nil, err
		}
		for _, it := range page.Items {
			if c, err := codec.DecodeConnection(it); err == nil {
				out[c.ID] = c
			}
		}
		if len(page.LastEvaluatedKey) == 0 {
			return out, nil
		}
		start = page.LastEvaluatedKey
	}
}

// oneClientEach reports whether every id has exactly one upstream client: cheap, so
// it is checked first and often.
func (f *benchFleet) oneClientEach(ids []string) bool {
	for _, id := range ids {
		if f.up.Stats(id).Clients != 1 {
			return false
		}
	}
	return true
}

// streamingElsewhere reports whether every id has exactly one upstream client and a
// lease held by someone other than notOwner.
func (f *benchFleet) streamingElsewhere(ctx context.Context, ids []string, notOwner string) (bool, string, error) {
	if !f.oneClientEach(ids) {
		return false, "upstream clients", nil
	}
	cs, err := f.conns(ctx)
	if err != nil {
		return false, "", err
	}
	for _, id := range ids {
		c := cs[id]
		if !c.Owned() || c.LeaseOwner == notOwner {
			return false, fmt.Sprintf("%s: owner %q", id, c.LeaseOwner), nil
		}
	}
	return true, "", nil
}

// waitGap polls until every id streams elsewhere and returns the time from start to
// the first check of the upstream that passed (the table is confirmed right after).
func (f *benchFleet) waitGap(ctx context.Context, start time.Time, ids []string, notOwner string, every, timeout time.Duration) (time.Duration, error) {
	var why string
	for time.Since(start) < timeout {
		if f.oneClientEach(ids) {
			at := time.Since(start)
			ok, w, err := f.streamingElsewhere(ctx, ids, notOwner)
			if err != nil {
				return 0, err
			}
			if ok {
				return at, nil
			}
			why = w
		}
		time.Sleep(every)
	}
	return 0, fmt.Errorf("not streaming elsewhere within %s: %s", timeout, why)
}

// waitFor polls cond every `every` until it holds or timeout passes, and returns the
// time since start.
func waitFor(start time.Time, every, timeout time.Duration, what string, cond func() bool) (time.Duration, error) {
	for time.Since(start) < timeout {
		if cond() {
			return time.Since(start), nil
		}
		time.Sleep(every)
	}
	return 0, fmt.Errorf("%s: not within %s", what, timeout)
}

// live returns the running worker in every slot, or false if a slot has none or
// one that does not answer /healthz.
func (f *benchFleet) live(ctx context.Context) ([]*fleet.Proc, bool) {
	var ps []*fleet.Proc
	for slot := range f.spec.Workers {
		p := f.stack.Sup.Get(slot)
		if p == nil {
			return nil, false
		}
		select {
		case <-p.Done():
			return nil, false
		default:
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:"+strconv.Itoa(p.Port)+"/healthz", nil)
		resp, err := f.http.Do(req)
		if err != nil {
			return nil, false
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return nil, false
		}
		ps = append(ps, p)
	}
	return ps, true
}

func (f *benchFleet) waitWorkers(ctx context.Context, timeout time.Duration) error {
	_, err := waitFor(time.Now(), 50*time.Millisecond, timeout, "all workers up", func() bool {
		_, ok := f.live(ctx)
		return ok
	})
	return err
}

// waitSettled waits until every worker slot is up and every connection streams,
// owned by a live worker.
func (f *benchFleet) waitSettled(ctx context.Context, timeout time.Duration) error {
	start := time.Now()
	if err := f.waitWorkers(ctx, timeout); err != nil {
		return err
	}
	every := 50 * time.Millisecond
	if len(f.ids) > 100 {
		every = 250 * time.Millisecond
	}
	var why string
	_, err := waitFor(start, every, timeout, "all connections streaming", func() bool {
		ps, ok := f.live(ctx)
		if !ok {
			why = "a worker is down"
			return false
		}
		alive := map[string]bool{}
		for _, p := range ps {
			alive[p.ID] = true
		}
		ok, w, err := f.streamingElsewhere(ctx, f.ids, "")
		if err != nil || !ok {
			why = w
			return false
		}
		cs, err := f.conns(ctx)
		if err != nil {
			return false
		}
		for _, id := range f.ids {
			if !alive[cs[id].LeaseOwner] {
				why = id + " owned by a dead worker"
				return false
			}
		}
		return true
	})
	if err != nil {
		return fmt.Errorf("%w (%s)", err, why)
	}
	return nil
}

// biggestOwner returns the slot, id and connections of the worker owning most.
func (f *benchFleet) biggestOwner(ctx context.Context) (slot int, id string, owned []string, err error) {
	cs, err := f.conns(ctx)
	if err != nil {
		return 0, "", nil, err
	}
	by := map[string][]string{}
	for cid, c := range cs {
		if c.Owned() {
			by[c.LeaseOwner] = append(by[c.LeaseOwner], cid)
		}
	}
	slot = -1
	for s := range f.spec.Workers {
		p := f.stack.Sup.Get(s)
		if p != nil && len(by[p.ID]) > len(owned) {
			slot, id, owned = s, p.ID, by[p.ID]
		}
	}
	if slot < 0 {
		return 0, "", nil, errors.New("no live worker owns anything")
	}
	sort.Strings(owned)
	return slot, id, owned, nil
}

// distribution lists how many connections each live worker owns, largest first.
func (f *benchFleet) distribution(ctx context.Context) []int {
	cs, err := f.conns(ctx)
	if err != nil {
		return nil
	}
	by := map[string]int{}
	for _, c := range cs {
		if c.Owned() {
			by[c.LeaseOwner]++
		}
	}
	var out []int
	for s := range f.spec.Workers {
		if p := f.stack.Sup.Get(s); p != nil {
			out = append(out, by[p.ID])
		}
	}
	sort.Sort(sort.Reverse(sort.IntSlice(out)))
	return out
}

// metric sums a counter from the /metrics of every live worker.
func (f *benchFleet) metric(ctx context.Context, name string) float64 {
	var sum float64
	for s := range f.spec.Workers {
		sum += f.metricOf(ctx, s, name)
	}
	return sum
}

// metricOf reads a counter from the /metrics of slot's worker; 0 if it is down.
func (f *benchFleet) metricOf(ctx context.Context, slot int, name string) float64 {
	p := f.stack.Sup.Get(slot)
	if p == nil {
		return 0
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:"+strconv.Itoa(p.Port)+"/metrics", nil)
	resp, err := f.http.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			x, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return x
		}
	}
	return 0
}

// logTail returns the last n bytes of a fleet log, for error reports.
func (f *benchFleet) logTail(name string, n int) string {
	b, _ := os.ReadFile(filepath.Join(f.dir, "logs", name))
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
