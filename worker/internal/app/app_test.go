package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/lease"
	"github.com/sockfleet/sockfleet/shared/local/ddbtest"
	"github.com/sockfleet/sockfleet/shared/local/demoupstream"
	"github.com/sockfleet/sockfleet/shared/local/kinesalite/kinesistest"
	"github.com/sockfleet/sockfleet/shared/local/localddb"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/shared/wakeup"
	"github.com/sockfleet/sockfleet/worker/internal/config"
	"github.com/sockfleet/sockfleet/worker/internal/sink"
	"github.com/sockfleet/sockfleet/worker/internal/stream"
)

func TestMain(m *testing.M) {
	code := m.Run()
	ddbtest.Stop()
	kinesistest.Stop()
	os.Exit(code)
}

var secret = []byte("test-secret-0123456789")

// Short timings: fence after min(deadline 2s, lease 3s - margin 0.5s) = 2s.
const (
	leaseDur = 3 * time.Second
	interval = 400 * time.Millisecond
	deadline = 2 * time.Second
	margin   = 500 * time.Millisecond
	// Stream mode: checkpoints at most this often per connection.
	checkpointEvery = interval
	rate            = 200 // upstream messages per second per stream
)

// memSink records what it acknowledged, per connection.
type memSink struct {
	mu   sync.Mutex
	seqs map[string][]int64
	vers map[string]map[int64]int // per connection, messages per lease version
}

func (s *memSink) Write(_ context.Context, b []sink.Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seqs == nil {
		s.seqs, s.vers = map[string][]int64{}, map[string]map[int64]int{}
	}
	for _, m := range b {
		s.seqs[m.Conn] = append(s.seqs[m.Conn], m.Seq)
		if s.vers[m.Conn] == nil {
			s.vers[m.Conn] = map[int64]int{}
		}
		s.vers[m.Conn][m.Version]++
	}
	return nil
}

func (s *memSink) Close() error { return nil }

func (s *memSink) get(id string) []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]int64(nil), s.seqs[id]...)
}

func (s *memSink) count(id string) int { return len(s.get(id)) }

// versions is how many of id's messages carried each lease version.
func (s *memSink) versions(id string) map[int64]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[int64]int{}
	for v, n := range s.vers[id] {
		out[v] = n
	}
	return out
}

func (s *memSink) last(id string) int64 {
	q := s.get(id)
	if len(q) == 0 {
		return 0
	}
	return q[len(q)-1]
}

// cutter is a transport to the table that a test can cut: fail fast, or hang until
// the request's context ends (a blackholed network).
type cutter struct {
	mode atomic.Int32 // 0 pass, 1 fail, 2 hang
}

const (
	pass int32 = iota
	fail
	hang
)

func (c *cutter) RoundTrip(r *http.Request) (*http.Response, error) {
	switch c.mode.Load() {
	case fail:
		return nil, errors.New("network cut by test")
	case hang:
		for c.mode.Load() == hang { // until the request gives up or the test reconnects
			select {
			case <-r.Context().Done():
				return nil, r.Context().Err()
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	return http.DefaultTransport.RoundTrip(r)
}

type env struct {
	t     *testing.T
	db    *ddbtest.Env
	up    *demoupstream.Server
	store *lease.Store
}

func newEnv(t *testing.T, upRate float64) *env {
	e := &env{t: t, db: ddbtest.New(t)}
	up, err := demoupstream.Listen("127.0.0.1:0", demoupstream.Config{Rate: upRate, Size: 16})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close() })
	e.up = up
	e.store, err = lease.New(e.db.DB, lease.Config{Table: e.db.Table, Duration: leaseDur, SkewMargin: margin})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) putConn(id string, state schema.State) {
	e.t.Helper()
	e.up.Touch(id)
	_, err := e.db.DB.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: &e.db.Table,
		Item: codec.EncodeConnection(codec.Connection{ID: id, DesiredState: state, WSURL: e.up.URL(id)})})
	if err != nil {
		e.t.Fatal(err)
	}
}

// putUnheld writes a STARTED connection as the reconciler's sweep leaves one nobody
// took: free, carrying its unheld mark for an hour (what the start-up pass takes).
func (e *env) putUnheld(id string) {
	e.t.Helper()
	e.up.Touch(id)
	it := codec.EncodeConnection(codec.Connection{ID: id, DesiredState: schema.Started, WSURL: e.up.URL(id)})
	it[schema.AttrUnheldSince] = codec.N(time.Now().Add(-time.Hour).UnixMilli())
	if _, err := e.db.DB.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: &e.db.Table, Item: it}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) get(id string) codec.Connection {
	e.t.Helper()
	c, err := e.store.Get(context.Background(), id)
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

func (e *env) update(id, expr string, vals map[string]types.AttributeValue, names map[string]string) {
	e.t.Helper()
	_, err := e.db.DB.UpdateItem(context.Background(), &dynamodb.UpdateItemInput{
		TableName: &e.db.Table, Key: map[string]types.AttributeValue{schema.AttrPK: codec.S(schema.ConnKey(id))},
		UpdateExpression: aws.String(expr), ExpressionAttributeValues: vals, ExpressionAttributeNames: names,
	})
	if err != nil {
		e.t.Fatal(err)
	}
}

type worker struct {
	*App
	id   string
	sink *memSink
	cut  *cutter
	stop func() error // cancel and wait for Run
}

type opts struct {
	max        int
	startup    bool
	polling    bool
	stdout     io.Writer     // set: the real stdout sink writes here instead of the memSink
	sink       sink.Sink     // set: this sink instead of the memSink
	resume     string        // "": the default
	counter    bool          // no seq_path: sequences count the messages read (SOCKFLEET_SEQ_PATH empty)
	backstop   time.Duration // stream mode; default 1 minute (out of the way)
	checkpoint time.Duration // stream mode; default checkpointEvery
	// Planned handoffs: standbyMax messages held (default 10000); advertise, if set,
	// turns the listener's address into the one registered (a proxy in front of it);
	// noHandoff turns them off.
	standbyMax int
	advertise  func(addr string) string
	noHandoff  bool
	sinkDelay  time.Duration // each write of the handoff tests' ledger sink takes this long
	idle       time.Duration // set: the fleet's idle_timeout (SOCKFLEET_IDLE_TIMEOUT)
	stderr     io.Writer     // set: EMF metric lines go here
	secrets    string        // set: the local secrets file (SOCKFLEET_SECRETS_FILE)
	sinks      string        // set: SOCKFLEET_SINKS_ALLOWED
	// transport, if set, carries the worker's table calls instead of its cutter.
	transport http.RoundTripper
}

func (e *env) worker(id string, o opts) *worker {
	e.t.Helper()
	if o.max == 0 {
		o.max = 10
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		e.t.Fatal(err)
	}
	cfg := config.Defaults()
	cfg.Table, cfg.WorkerID, cfg.AdvertiseAddr, cfg.ListenAddr = e.db.Table, id, ln.Addr().String(), ln.Addr().String()
	cfg.MaxConnections = o.max
	cfg.Lease, cfg.RenewInterval, cfg.RenewDeadline, cfg.SkewMargin = leaseDur, interval, deadline, margin
	cfg.DrainTimeout = 10 * time.Second
	cfg.SeqPath = "seq"
	if o.counter {
		cfg.SeqPath = ""
	}
	cfg.WakeupSecret = secret
	cfg.CheckpointInterval, cfg.BackstopInterval = checkpointEvery, time.Minute
	if o.backstop > 0 {
		cfg.BackstopInterval = o.backstop
	}
	if o.checkpoint > 0 {
		cfg.CheckpointInterval = o.checkpoint
	}
	if o.polling {
		cfg.Mode, cfg.PollInterval = schema.ModePolling, 300*time.Millisecond
	}
	if o.resume != "" {
		cfg.Resume = o.resume
	}
	cfg.HandoffPrepareTimeout, cfg.HandoffStandbyTimeout = 2*time.Second, 3*time.Second
	if o.standbyMax > 0 {
		cfg.StandbyMaxMessages = o.standbyMax
	}
	if o.advertise != nil {
		cfg.AdvertiseAddr = o.advertise(cfg.AdvertiseAddr)
	}
	cfg.Handoff = !o.noHandoff
	if o.idle > 0 {
		cfg.IdleTimeout = o.idle
	}
	cfg.SecretsFile = o.secrets
	cfg.SinksAllowed = o.sinks
	if err := cfg.Validate(); err != nil {
		e.t.Fatal(err)
	}
	w := &worker{id: id, sink: &memSink{}, cut: &cutter{}}
	var rt http.RoundTripper = w.cut
	if o.transport != nil {
		rt = o.transport
	}
	var snk sink.Sink = w.sink
	if o.stderr == nil {
		o.stderr = io.Discard
	}
	switch {
	case o.stdout != nil:
		snk = nil // the one cfg names: stdout
	case o.sink != nil:
		snk = o.sink
	}
	a, err := New(cfg, Deps{
		DB:       e.db.Client(rt, func(o *dynamodb.Options) { o.RetryMaxAttempts = 1 }),
		Listener: ln,
		Stdout:   o.stdout,
		Stderr:   o.stderr,
		Sink:     snk,
		Stream: stream.Config{
			BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
			PongWait: 2 * time.Second, HandshakeTimeout: 2 * time.Second,
		},
		NoStartupPass: !o.startup,
	})
	if err != nil {
		e.t.Fatal(err)
	}
	w.App = a
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	var once sync.Once
	var runErr error
	w.stop = func() error {
		once.Do(func() { cancel(); runErr = <-done })
		return runErr
	}
	e.t.Cleanup(func() { w.stop() })
	if !o.polling {
		waitFor(e.t, 5*time.Second, id+" joined", a.Manager.Joined)
	}
	return w
}

func (e *env) wake(w *worker, reason wakeup.Reason, version int64, ids ...string) []wakeup.ConnResult {
	e.t.Helper()
	req := wakeup.Request{}
	for _, id := range ids {
		req.Conns = append(req.Conns, wakeup.Conn{ID: id, LeaseVersion: version, Reason: reason})
	}
	resp, err := (&wakeup.Client{Secret: secret}).Send(context.Background(), w.Addr(), req)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp.Results
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > d {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start)
}

func contiguous(t *testing.T, what string, seqs []int64) {
	t.Helper()
	for i := 1; i < len(seqs); i++ {
		if seqs[i] != seqs[i-1]+1 {
			t.Fatalf("%s: gap or repeat at %d: %d then %d", what, i, seqs[i-1], seqs[i])
		}
	}
}

func TestWakeupLeadsToStreaming(t *testing.T) {
	e := newEnv(t, rate)
	e.putConn("c1", schema.Started)
	w := e.worker("w1", opts{})
	res := e.wake(w, wakeup.NeedsOwner, 0, "c1")
	if res[0].Result != wakeup.Acquired {
		t.Fatalf("wake: %+v", res)
	}
	waitFor(t, 5*time.Second, "messages at the sink", func() bool { return w.sink.count("c1") >= 50 })
	// The renew carries the checkpoint and folds in the status.
	waitFor(t, 5*time.Second, "checkpoint and status in the item", func() bool {
		c := e.get("c1")
		return c.LastSeq >= 20 && c.Status == "streaming" && c.LeaseOwner == "w1"
	})
	contiguous(t, "sink", w.sink.get("c1"))
	if s := w.sink.get("c1"); s[0] != 1 {
		t.Fatalf("first seq %d, want 1", s[0])
	}
	// /healthz and /metrics answer.
	for path, want := range map[string]string{"/healthz": "ok", "/metrics": "sockfleet_owned_connections 1\n"} {
		resp, err := http.Get("http://" + w.Addr() + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(b), want) {
			t.Fatalf("%s: %d %q", path, resp.StatusCode, b)
		}
	}
}

func TestStoppedClosesAndReleases(t *testing.T) {
	e := newEnv(t, rate)
	e.putConn("c1", schema.Started)
	w := e.worker("w1", opts{})
	e.wake(w, wakeup.NeedsOwner, 0, "c1")
	waitFor(t, 5*time.Second, "streaming", func() bool { return w.sink.count("c1") >= 20 })
	e.update("c1", "SET #d = :s", map[string]types.AttributeValue{":s": codec.S(string(schema.Stopped))},
		map[string]string{"#d": schema.AttrDesiredState})
	// Without a wakeup, the next renew notices; a Check wakeup makes it immediate.
	res := e.wake(w, wakeup.Check, e.get("c1").LeaseVersion, "c1")
	if res[0].Result != wakeup.NotStartable {
		t.Fatalf("check of a stopped connection: %+v", res)
	}
	waitFor(t, 5*time.Second, "released", func() bool { return e.get("c1").LeaseExpiresAtMs == 0 })
	waitFor(t, 2*time.Second, "upstream socket closed", func() bool { return e.up.Stats("c1").Clients == 0 })
	c := e.get("c1")
	if c.LeaseOwner != "" || c.Status != "stopped" || c.LastSeq != w.sink.last("c1") {
		t.Fatalf("item %+v; sink last %d", c, w.sink.last("c1"))
	}
}

func TestStoppedNoticedByRenewAlone(t *testing.T) {
	e := newEnv(t, rate)
	e.putConn("c1", schema.Started)
	w := e.worker("w1", opts{})
	e.wake(w, wakeup.NeedsOwner, 0, "c1")
	waitFor(t, 5*time.Second, "streaming", func() bool { return w.sink.count("c1") >= 10 })
	e.update("c1", "SET #d = :s", map[string]types.AttributeValue{":s": codec.S(string(schema.Stopped))},
		map[string]string{"#d": schema.AttrDesiredState})
	took := waitFor(t, 5*time.Second, "released", func() bool { return e.get("c1").LeaseExpiresAtMs == 0 })
	if took > interval+time.Second {
		t.Fatalf("release took %s with a %s renew interval", took, interval)
	}
	if c := e.get("c1"); c.LastSeq != w.sink.last("c1") {
		t.Fatalf("checkpoint %d, sink last %d", c.LastSeq, w.sink.last("c1"))
	}
}

func TestDrainReleasesEveryLease(t *testing.T) {
	e := newEnv(t, rate)
	ids := []string{"a", "b", "c"}
	for _, id := range ids {
		e.putConn(id, schema.Started)
	}
	w := e.worker("w1", opts{})
	for _, r := range e.wake(w, wakeup.NeedsOwner, 0, ids...) {
		if r.Result != wakeup.Acquired {
			t.Fatalf("wake: %+v", r)
		}
	}
	for _, id := range ids {
		waitFor(t, 5*time.Second, "streaming "+id, func() bool { return w.sink.count(id) >= 10 })
	}
	start := time.Now()
	if err := w.stop(); err != nil {
		t.Fatalf("drain: %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("drain took %s", took)
	}
	for _, id := range ids {
		c := e.get(id)
		if c.LeaseExpiresAtMs != 0 || c.LeaseOwner != "" || c.LastSeq != w.sink.last(id) || c.Status != "released" {
			t.Errorf("%s: item %+v, sink last %d", id, c, w.sink.last(id))
		}
		if n := e.up.Stats(id).Clients; n != 0 {
			t.Errorf("%s: %d upstream clients after drain", id, n)
		}
	}
	// The membership item stays, marked gone: not a live member, and whatever still
	// names it may be released at once.
	if it := e.workerItem("w1"); !it.Dead() || it.Live(time.Now().UnixMilli()) {
		t.Fatalf("registry item after drain: %+v", it)
	}
}

func TestTakeoverResumesWithoutGap(t *testing.T) {
	e := newEnv(t, rate)
	e.putConn("c1", schema.Started)
	w1 := e.worker("w1", opts{})
	e.wake(w1, wakeup.NeedsOwner, 0, "c1")
	var v1 int64 // w1's lease version, read with the checkpoint (no extra read before the cut)
	waitFor(t, 5*time.Second, "w1 streaming across renews", func() bool {
		if w1.sink.count("c1") < rate {
			return false
		}
		c := e.get("c1")
		v1 = c.LeaseVersion
		return c.LastSeq > 0
	})
	// w1 dies without releasing: its table access is cut, then it stops.
	w1.cut.mode.Store(fail)
	w1.stop()
	checkpoint := e.get("c1").LastSeq
	// The reconciler's crash path releases the dead worker's leases.
	if _, err := e.store.ReleaseAllOwnedBy(context.Background(), "w1"); err != nil {
		t.Fatal(err)
	}
	w2 := e.worker("w2", opts{})
	e.up.ResetMax("c1")
	if r := e.wake(w2, wakeup.NeedsOwner, e.get("c1").LeaseVersion, "c1"); r[0].Result != wakeup.Acquired {
		t.Fatalf("w2 wake: %+v", r)
	}
	waitFor(t, 5*time.Second, "w2 streaming", func() bool { return w2.sink.count("c1") >= 50 })
	// The fencing token: every record of w1 carries w1's lease version, every one of
	// w2 the higher version of its acquire.
	v2 := e.get("c1").LeaseVersion
	if n1, n2 := w1.sink.versions("c1"), w2.sink.versions("c1"); v2 <= v1 || len(n1) != 1 || n1[v1] == 0 || len(n2) != 1 || n2[v2] == 0 {
		t.Fatalf("lease versions delivered: w1 %v (held %d), w2 %v (holds %d): want each owner's own, the new one higher", n1, v1, n2, v2)
	}
	s1, s2 := w1.sink.get("c1"), w2.sink.get("c1")
	contiguous(t, "w1", s1)
	contiguous(t, "w2", s2)
	if s2[0] != checkpoint+1 {
		t.Fatalf("w2 resumed at %d, checkpoint %d", s2[0], checkpoint)
	}
	if s2[0] > s1[len(s1)-1]+1 {
		t.Fatalf("gap: w1 ended at %d, w2 began at %d", s1[len(s1)-1], s2[0])
	}
	dups := s1[len(s1)-1] - checkpoint
	// Duplicates are what w1 delivered after its last successful renew: at most about
	// one renew interval of traffic (plus one in-flight batch).
	bound := int64(rate*interval.Seconds()*1.5) + 20
	t.Logf("w1 delivered up to %d, checkpoint %d: %d duplicates (bound %d)", s1[len(s1)-1], checkpoint, dups, bound)
	if dups < 0 || dups > bound {
		t.Fatalf("%d duplicates, bound %d", dups, bound)
	}
	if m := e.up.Stats("c1").MaxClients; m != 1 {
		t.Fatalf("%d upstream clients at once during takeover", m)
	}
}

func TestStolenLeaseStopsWithinOneInterval(t *testing.T) {
	e := newEnv(t, rate)
	e.putConn("c1", schema.Started)
	w := e.worker("w1", opts{})
	e.wake(w, wakeup.NeedsOwner, 0, "c1")
	waitFor(t, 5*time.Second, "streaming", func() bool { return w.sink.count("c1") >= 10 })
	v := e.get("c1").LeaseVersion
	e.update("c1", "SET #o = :o, #v = :v, #e = :e", map[string]types.AttributeValue{
		":o": codec.S("thief"), ":v": codec.N(v + 1), ":e": codec.N(time.Now().Add(time.Minute).UnixMilli()),
	}, map[string]string{"#o": schema.AttrLeaseOwner, "#v": schema.AttrLeaseVersion, "#e": schema.AttrLeaseExpires})
	took := waitFor(t, 5*time.Second, "the old owner to close its socket", func() bool { return e.up.Stats("c1").Clients == 0 })
	// One interval until the renew, plus the renew itself and the socket close.
	if took > interval+500*time.Millisecond {
		t.Fatalf("stopped %s after the theft; renew interval %s", took, interval)
	}
	n := w.sink.count("c1")
	time.Sleep(2 * interval)
	if w.sink.count("c1") != n {
		t.Fatal("still delivering after losing the lease")
	}
	if c := e.get("c1"); c.LeaseOwner != "thief" || c.LeaseVersion != v+1 {
		t.Fatalf("the old owner wrote over the thief: %+v", c)
	}
	if w.Metrics.LeasesLost.Load() != 1 {
		t.Fatalf("leases lost %d", w.Metrics.LeasesLost.Load())
	}
}

func TestUnreachableTableSelfFencesBeforeExpiry(t *testing.T) {
	e := newEnv(t, rate)
	e.putConn("c1", schema.Started)
	w := e.worker("w1", opts{})
	e.wake(w, wakeup.NeedsOwner, 0, "c1")
	waitFor(t, 5*time.Second, "renewed at least once", func() bool { return e.get("c1").LastSeq > 0 })
	w.cut.mode.Store(hang)
	// The last membership renew that reached the table set the expiry others go by.
	cutAt := time.Now()
	expires := time.UnixMilli(e.workerItem("w1").HeartbeatExpiresAtMs)
	waitFor(t, 5*time.Second, "self-fence", func() bool { return e.up.Stats("c1").Clients == 0 })
	stoppedAt := time.Now()
	// Others may take it only once it expired by more than the skew margin; the
	// fence must come before the expiry itself.
	if !stoppedAt.Before(expires) {
		t.Fatalf("stopped at %s, lease expired at %s", stoppedAt.Format(time.StampMilli), expires.Format(time.StampMilli))
	}
	t.Logf("cut at %s, fenced %s later, %s before expiry", cutAt.Format(time.StampMilli),
		stoppedAt.Sub(cutAt).Round(time.Millisecond), expires.Sub(stoppedAt).Round(time.Millisecond))
	// The stream's own fence guard may close the socket a moment before its session
	// counts the fence (the session does so once the stream returns): wait for it.
	waitFor(t, 2*time.Second, "the fence counted", func() bool { return w.Metrics.SelfFences.Load() >= 1 })
	if w.Metrics.SelfFences.Load() != 1 {
		t.Fatalf("self-fences %d", w.Metrics.SelfFences.Load())
	}
	n := w.sink.count("c1")
	time.Sleep(interval)
	if w.sink.count("c1") != n {
		t.Fatal("delivering after the fence")
	}
	// After an outage longer than the lease, the release that failed is retried as
	// soon as the table answers again.
	w.cut.mode.Store(pass)
	waitFor(t, 5*time.Second, "release after reconnecting", func() bool { return e.get("c1").LeaseExpiresAtMs == 0 })
	if c := e.get("c1"); c.Status != "fenced" || c.LastSeq != w.sink.last("c1") {
		t.Fatalf("item %+v, sink last %d", c, w.sink.last("c1"))
	}
}

func TestBadWakeupsChangeNothing(t *testing.T) {
	e := newEnv(t, rate)
	e.putConn("c1", schema.Started)
	w := e.worker("w1", opts{})
	url := "http://" + w.Addr() + wakeup.Path
	good := []byte(`{"v":1,"conns":[{"id":"c1","lease_version":0,"reason":"needs_owner"}]}`)
	send := func(body []byte, ts, sig string) int {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(string(body)))
		if ts != "" {
			req.Header.Set(wakeup.HeaderTimestamp, ts)
		}
		if sig != "" {
			req.Header.Set(wakeup.HeaderSignature, sig)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	now := func() string { return wakeup.Timestamp(time.Now()) }
	replayTS := now()
	replaySig := wakeup.Sign(secret, replayTS, []byte(`{"v":1,"conns":[{"id":"zz","lease_version":0,"reason":"needs_owner"}]}`))
	send([]byte(`{"v":1,"conns":[{"id":"zz","lease_version":0,"reason":"needs_owner"}]}`), replayTS, replaySig) // first use: accepted (zz does not exist)
	big := make([]byte, wakeup.MaxBody+1)
	cases := []struct {
		name string
		code int
		do   func() int
	}{
		{"missing signature", 401, func() int { return send(good, now(), "") }},
		{"missing timestamp", 401, func() int { return send(good, "", wakeup.Sign(secret, now(), good)) }},
		{"bad signature", 401, func() int { ts := now(); return send(good, ts, wakeup.Sign([]byte("wrong-secret-0123456"), ts, good)) }},
		{"stale timestamp", 401, func() int {
			ts := wakeup.Timestamp(time.Now().Add(-31 * time.Second))
			return send(good, ts, wakeup.Sign(secret, ts, good))
		}},
		{"future timestamp", 401, func() int {
			ts := wakeup.Timestamp(time.Now().Add(31 * time.Second))
			return send(good, ts, wakeup.Sign(secret, ts, good))
		}},
		{"replay", 401, func() int {
			return send([]byte(`{"v":1,"conns":[{"id":"zz","lease_version":0,"reason":"needs_owner"}]}`), replayTS, replaySig)
		}},
		{"malformed", 400, func() int {
			b := []byte(`{"v":1,"conns":[{"id":"c1"`)
			ts := now()
			return send(b, ts, wakeup.Sign(secret, ts, b))
		}},
		{"unknown field", 400, func() int {
			b := []byte(`{"v":1,"conns":[],"x":1}`)
			ts := now()
			return send(b, ts, wakeup.Sign(secret, ts, b))
		}},
		{"bad version", 400, func() int {
			b := []byte(`{"v":2,"conns":[{"id":"c1","lease_version":0,"reason":"needs_owner"}]}`)
			ts := now()
			return send(b, ts, wakeup.Sign(secret, ts, b))
		}},
		{"too large", 413, func() int { ts := now(); return send(big, ts, wakeup.Sign(secret, ts, big)) }},
		{"wrong method", 405, func() int {
			resp, err := http.Get(url)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			return resp.StatusCode
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.do(); got != tc.code {
				t.Fatalf("status %d, want %d", got, tc.code)
			}
		})
	}
	if c := e.get("c1"); c.LeaseOwner != "" || c.LeaseVersion != 0 || w.Metrics.Acquisitions.Load() != 0 || len(w.Manager.Owned()) != 0 {
		t.Fatalf("state changed: item %+v, acquisitions %d", c, w.Metrics.Acquisitions.Load())
	}
	// Draining (503) is covered in package server, where a draining owner is a fake.
}

// The start-up pass takes free connections up to capacity, but (stream mode) only
// those that carried the reconciler's unheld mark long enough: a free item without
// one may be a stale released image whose holder is taking it back.
func TestStartupPassAcquiresUpToCapacity(t *testing.T) {
	e := newEnv(t, 0)
	for _, id := range []string{"a", "b", "c"} {
		e.putUnheld(id)
	}
	e.putConn("unmarked", schema.Started)
	e.putConn("stopped", schema.Stopped)
	e.putConn("held", schema.Started)
	if _, err := e.store.Acquire(context.Background(), "held", "other"); err != nil {
		t.Fatal(err)
	}
	w := e.worker("w1", opts{max: 2, startup: true})
	waitFor(t, 10*time.Second, "two acquisitions", func() bool { return len(w.Manager.Owned()) == 2 })
	time.Sleep(3 * interval)
	owned := w.Manager.Owned()
	sort.Strings(owned)
	if len(owned) != 2 {
		t.Fatalf("owned %v, want 2 of a, b, c", owned)
	}
	for _, id := range owned {
		if id != "a" && id != "b" && id != "c" {
			t.Fatalf("acquired %s", id)
		}
		waitFor(t, 5*time.Second, "upstream client "+id, func() bool { return e.up.Stats(id).Clients == 1 })
	}
	if c := e.get("held"); c.LeaseOwner != "other" {
		t.Fatalf("took a held lease: %+v", c)
	}
	if got := fmt.Sprint(w.Metrics.Acquisitions.Load()); got != "2" {
		t.Fatalf("acquisitions %s", got)
	}
}

// Polling mode (the seed's design): with no reconciler and no wakeups, a worker finds
// a new connection by polling the seed's index, and a crashed worker's connection is
// found by another worker once its lease has expired beyond the margin.
func TestPollingModeFindsOrphansWithoutWakeups(t *testing.T) {
	e := newEnv(t, rate)
	if err := localddb.EnsurePollingIndex(context.Background(), e.db.DB, e.db.Table); err != nil {
		t.Fatal(err)
	}
	e.putConn("c1", schema.Started)
	w1 := e.worker("w1", opts{polling: true})
	waitFor(t, 5*time.Second, "w1 finds and streams c1 by polling", func() bool { return w1.sink.count("c1") > 0 })
	if w1.Metrics.OrphanPolls.Load() == 0 {
		t.Fatal("no orphan poll counted")
	}
	waitFor(t, 5*time.Second, "a checkpoint", func() bool { return e.get("c1").LastSeq > 0 })
	w1.cut.mode.Store(fail) // crash: no release reaches the table
	w1.stop()
	crashed := time.Now()
	w2 := e.worker("w2", opts{polling: true})
	d := waitFor(t, 10*time.Second, "w2 takes c1 over by polling", func() bool { return w2.sink.count("c1") > 0 })
	if d < leaseDur-interval-margin {
		t.Fatalf("w2 took over %s after the crash; a polling takeover must wait for expiry", time.Since(crashed))
	}
	contiguous(t, "w2", w2.sink.get("c1"))
	e.update("c1", "SET desired_state = :s", map[string]types.AttributeValue{":s": codec.S("STOPPED")}, nil)
	waitFor(t, 3*time.Second, "w2 stops c1 after reading desired_state", func() bool { return !e.get("c1").Owned() })
}

// An operator's bad value on a streaming connection stops it, and the item says which
// field and value (a console user sees status/status_error, not a plain "stopped").
func TestOperatorTypoStopsWithTheValueOnTheItem(t *testing.T) {
	cases := []struct {
		name, attr, value, want string
	}{
		{"lowercase started", schema.AttrDesiredState, "started", `desired_state "started"`},
		{"ws_url not ws", schema.AttrWSURL, "http://up.example/x", `ws_url "http://up.example/x"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, rate)
			e.putConn("c1", schema.Started)
			w := e.worker("w1", opts{})
			e.wake(w, wakeup.NeedsOwner, 0, "c1")
			waitFor(t, 5*time.Second, "streaming", func() bool { return w.sink.count("c1") >= 5 })
			e.update("c1", "SET #a = :v", map[string]types.AttributeValue{":v": codec.S(tc.value)}, map[string]string{"#a": tc.attr})
			if res := e.wake(w, wakeup.Check, e.get("c1").LeaseVersion, "c1"); res[0].Result != wakeup.NotStartable {
				t.Fatalf("check: %+v", res)
			}
			waitFor(t, 5*time.Second, "released", func() bool { return e.get("c1").LeaseExpiresAtMs == 0 })
			c := e.get("c1")
			if c.Status != "invalid" || !strings.Contains(c.StatusError, tc.want) {
				t.Fatalf("status %q, status_error %q; want invalid naming %s", c.Status, c.StatusError, tc.want)
			}
			if c.LastSeq != w.sink.last("c1") {
				t.Fatalf("checkpoint %d, sink last %d", c.LastSeq, w.sink.last("c1"))
			}
		})
	}
}

// Polling mode: an unusable STARTED item is taken and given back once, not by every
// worker on every poll.
func TestPollingModeDoesNotChurnAnUnusableItem(t *testing.T) {
	e := newEnv(t, rate)
	if err := localddb.EnsurePollingIndex(context.Background(), e.db.DB, e.db.Table); err != nil {
		t.Fatal(err)
	}
	_, err := e.db.DB.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: &e.db.Table,
		Item: codec.EncodeConnection(codec.Connection{ID: "bad", DesiredState: schema.Started, WSURL: "ws://"})})
	if err != nil {
		t.Fatal(err)
	}
	w1 := e.worker("w1", opts{polling: true})
	w2 := e.worker("w2", opts{polling: true})
	waitFor(t, 5*time.Second, "given back as invalid", func() bool { return e.get("bad").Status == "invalid" })
	first := e.get("bad")
	polls := w1.Metrics.OrphanPolls.Load() + w2.Metrics.OrphanPolls.Load()
	waitFor(t, 10*time.Second, "ten more polls", func() bool {
		return w1.Metrics.OrphanPolls.Load()+w2.Metrics.OrphanPolls.Load() >= polls+10
	})
	if c := e.get("bad"); c.StatusAtMs != first.StatusAtMs || c.LeaseVersion != first.LeaseVersion {
		t.Fatalf("taken again: %+v, first given back as %+v", c, first)
	}
	if !strings.Contains(first.StatusError, "ws_url") {
		t.Errorf("status_error %q does not name ws_url", first.StatusError)
	}
}
