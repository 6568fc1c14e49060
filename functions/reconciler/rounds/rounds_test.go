package rounds

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/functions/reconciler/rebalance"
	"github.com/sockfleet/sockfleet/shared/local/ddbtest"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/shared/wakeup"
)

func TestMain(m *testing.M) { ddbtest.Main(m) }

var secret = []byte("0123456789abcdef0123")

// t0 is a wall-clock time (the wakeup signatures are checked against the clock).
var t0 = time.Now().Truncate(time.Millisecond)

// fleet is a table on the real engine, and one HTTP server per worker standing in
// for the worker's wakeup endpoint: it checks the signature and the body as a worker
// does, records every move, and, when apply is set, does what a handoff ends with
// (the lease moves to the target at version+1 with moved_at_ms, by a conditional
// write on owner and version).
type fleet struct {
	t       *testing.T
	db      *dynamodb.Client
	table   string
	workers map[string]*codec.Worker
	mu      sync.Mutex
	moves   []wakeup.Conn            // every handoff received
	owner   map[string]string        // the server each move reached
	answer  map[string]wakeup.Result // per worker; default HandingOff
	apply   bool
}

func newFleet(t *testing.T, loads map[string]int, capacity int) *fleet {
	e := ddbtest.New(t)
	f := &fleet{t: t, db: e.DB, table: e.Table, workers: map[string]*codec.Worker{}, owner: map[string]string{},
		answer: map[string]wakeup.Result{}, apply: true}
	for _, id := range slices.Sorted(maps.Keys(loads)) {
		srv := httptest.NewServer(f.handler(id))
		t.Cleanup(srv.Close)
		f.workers[id] = &codec.Worker{ID: id, Addr: strings.TrimPrefix(srv.URL, "http://"), Capacity: capacity,
			Incarnation: "inc-" + id, HeartbeatExpiresAtMs: t0.Add(time.Hour).UnixMilli()}
		for i := range loads[id] {
			f.put(codec.Connection{ID: fmt.Sprintf("%s-c%03d", id, i), DesiredState: schema.Started, WSURL: "ws://up/x",
				LeaseOwner: id, LeaseExpiresAtMs: schema.LeaseHeldByMember, LeaseVersion: 7})
		}
		f.workers[id].Load = loads[id]
	}
	return f
}

func (f *fleet) put(c codec.Connection) {
	f.t.Helper()
	if _, err := f.db.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: &f.table, Item: codec.EncodeConnection(c)}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fleet) handler(id string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if err := wakeup.Verify(secret, time.Now(), r.Header.Get(wakeup.HeaderTimestamp), r.Header.Get(wakeup.HeaderSignature), body); err != nil {
			f.t.Errorf("worker %s: %v", id, err)
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		req, err := wakeup.DecodeRequest(body)
		if err != nil {
			f.t.Errorf("worker %s: %v", id, err)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		resp := wakeup.Response{V: wakeup.Version}
		f.mu.Lock()
		ans, ok := f.answer[id]
		if !ok {
			ans = wakeup.HandingOff
		}
		apply := f.apply
		f.mu.Unlock()
		for _, c := range req.Conns {
			if c.Reason != wakeup.Handoff {
				f.t.Errorf("worker %s: reason %q", id, c.Reason)
			}
			f.mu.Lock()
			f.moves = append(f.moves, c)
			f.owner[c.ID+"@"+fmt.Sprint(len(f.moves))] = id
			f.mu.Unlock()
			if ans == wakeup.HandingOff && apply {
				f.transfer(id, c)
			}
			resp.Results = append(resp.Results, wakeup.ConnResult{ID: c.ID, Result: ans})
		}
		_ = writeJSON(w, resp)
	}
}

// transfer moves c from owner to c.To as a handoff's one conditional write does.
func (f *fleet) transfer(owner string, c wakeup.Conn) {
	_, err := f.db.UpdateItem(context.Background(), &dynamodb.UpdateItemInput{
		TableName:           &f.table,
		Key:                 map[string]types.AttributeValue{schema.AttrPK: codec.S(schema.ConnKey(c.ID))},
		UpdateExpression:    aws.String("SET #o = :to, #v = :nv, #m = :m"),
		ConditionExpression: aws.String("#o = :from AND #v = :v"),
		ExpressionAttributeNames: map[string]string{"#o": schema.AttrLeaseOwner, "#v": schema.AttrLeaseVersion,
			"#m": schema.AttrMovedAt},
		ExpressionAttributeValues: map[string]types.AttributeValue{":to": codec.S(c.To), ":from": codec.S(owner),
			":v": codec.N(c.LeaseVersion), ":nv": codec.N(c.LeaseVersion + 1), ":m": codec.N(time.Now().UnixMilli())},
	})
	if err != nil {
		f.t.Errorf("transfer %s from %s (version %d): %v", c.ID, owner, c.LeaseVersion, err)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.workers[owner].Load--
	f.workers[c.To].Load++
}

// list is the registry as the reconciler would list it now.
func (f *fleet) list() []codec.Worker {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []codec.Worker
	for _, id := range slices.Sorted(maps.Keys(f.workers)) {
		out = append(out, *f.workers[id])
	}
	return out
}

func (f *fleet) loads() map[string]int {
	out := map[string]int{}
	for _, w := range f.list() {
		out[w.ID] = w.Load
	}
	return out
}

func (f *fleet) rounds(cfg Config) *Rounds {
	r, err := New(cfg, &Reader{DB: f.db, Table: f.table}, &wakeup.Client{Secret: secret}, nil)
	if err != nil {
		f.t.Fatal(err)
	}
	return r
}

func writeJSON(w http.ResponseWriter, v wakeup.Response) error {
	w.Header().Set("Content-Type", "application/json")
	b := []byte(fmt.Sprintf(`{"v":%d,"results":[`, v.V))
	for i, r := range v.Results {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, fmt.Sprintf(`{"id":%q,"result":%q}`, r.ID, r.Result)...)
	}
	b = append(b, "]}"...)
	_, err := w.Write(b)
	return err
}

// A round reads the donors' connections, plans with the cap and sends each move to
// its owner as a signed handoff wakeup naming the target and the version read, one
// request per owner.
func TestRoundSendsHandoffsToOwners(t *testing.T) {
	f := newFleet(t, map[string]int{"a": 30, "b": 30, "c": 30, "d": 0, "e": 0}, 100)
	f.apply = false
	r := f.rounds(Config{})
	rep := r.Check(context.Background(), t0, f.list(), "worker joined")
	if rep.Skipped != "" || rep.Err != nil {
		t.Fatalf("no round: %+v", rep)
	}
	// 90 connections over 5 workers: 18 each, band [17, 19]; d and e need 17 each: min 34,
	// capped at ⌈10 % of 90⌉ = 9.
	if rep.Plan.Min != 34 || len(rep.Plan.Moves) != 9 || !rep.Plan.CapReached {
		t.Fatalf("plan: min %d, moves %d, cap %v", rep.Plan.Min, len(rep.Plan.Moves), rep.Plan.CapReached)
	}
	if rep.Sent != 9 || rep.Accepted() != 9 || rep.ReadUnits <= 0 {
		t.Fatalf("sent %d, accepted %d, read units %v", rep.Sent, rep.Accepted(), rep.ReadUnits)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.moves) != 9 {
		t.Fatalf("%d moves reached the workers", len(f.moves))
	}
	for i, m := range f.moves {
		from := f.owner[m.ID+"@"+fmt.Sprint(i+1)]
		if !strings.HasPrefix(m.ID, from+"-") || (m.To != "d" && m.To != "e") || m.LeaseVersion != 7 {
			t.Errorf("move %+v sent to %s", m, from)
		}
	}
}

// Rounds chain, each once the previous round's moves show in the loads, until every
// worker is in its band, with exactly the minimum number of moves in all and no
// connection moved twice.
func TestRoundsChainUntilBalanced(t *testing.T) {
	f := newFleet(t, map[string]int{"a": 100, "b": 100, "c": 100, "d": 0, "e": 0}, 200)
	r := f.rounds(Config{})
	now := t0
	first := r.Check(context.Background(), now, f.list(), "worker joined")
	if first.Plan.Min != 108 {
		t.Fatalf("minimum %d, want 108 (d and e need 54 each)", first.Plan.Min)
	}
	total, rounds := len(first.Plan.Moves), 1
	for rounds < 20 {
		now = now.Add(DefaultMinInterval)
		rep := r.Check(context.Background(), now, f.list(), "heartbeat")
		if rep.Skipped == "balanced" {
			break
		}
		if rep.Skipped != "" || rep.Err != nil {
			t.Fatalf("round %d: %+v", rounds+1, rep)
		}
		if len(rep.Plan.Moves) > 30 {
			t.Fatalf("round %d moved %d, over the cap of 30", rounds+1, len(rep.Plan.Moves))
		}
		total += len(rep.Plan.Moves)
		rounds++
	}
	if total != 108 || rounds != 4 {
		t.Errorf("%d moves in %d rounds, want 108 in 4", total, rounds)
	}
	for id, n := range f.loads() {
		if n < 54 || n > 66 {
			t.Errorf("worker %s ends with %d, outside [54, 66]", id, n)
		}
	}
	seen := map[string]bool{}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range f.moves {
		if seen[m.ID] {
			t.Errorf("%s moved twice", m.ID)
		}
		seen[m.ID] = true
	}
}

// A round whose moves do not show in the loads yet holds the next one back until
// they do, or until Settle has passed.
func TestRoundWaitsForItsMovesToShow(t *testing.T) {
	f := newFleet(t, map[string]int{"a": 50, "b": 50, "c": 0}, 100)
	f.apply = false // accepted, but nothing moves yet
	r := f.rounds(Config{})
	if rep := r.Check(context.Background(), t0, f.list(), "worker joined"); rep.Accepted() != 10 {
		t.Fatalf("first round: %+v", rep)
	}
	rep := r.Check(context.Background(), t0.Add(DefaultMinInterval), f.list(), "heartbeat")
	if !strings.Contains(rep.Skipped, "do not show") {
		t.Fatalf("second round not held back: %+v", rep)
	}
	rep = r.Check(context.Background(), t0.Add(DefaultSettle), f.list(), "heartbeat")
	if rep.Skipped != "" {
		t.Fatalf("not retried after settle: %+v", rep)
	}
	// The moves sent in the first round are cooling (the table shows no moved_at_ms yet).
	f.mu.Lock()
	defer f.mu.Unlock()
	seen := map[string]int{}
	for _, m := range f.moves {
		seen[m.ID]++
		if seen[m.ID] > 1 {
			t.Errorf("%s sent twice within the cooling period", m.ID)
		}
	}
}

// Draining, gone and unaddressed workers neither give nor take; an owner's
// target_unavailable and draining answers are counted, not retried in the round.
func TestRoundSkipsDrainingAndGone(t *testing.T) {
	f := newFleet(t, map[string]int{"a": 40, "b": 40, "dr": 40, "gone": 40, "idle": 0, "idle2": 0}, 100)
	f.workers["dr"].Draining = true
	f.workers["gone"].HeartbeatExpiresAtMs = t0.Add(-time.Minute).UnixMilli()
	f.workers["idle2"].Draining = true
	f.answer["b"] = wakeup.TargetUnavailable
	f.apply = false
	r := f.rounds(Config{Plan: rebalance.Config{MaxFraction: 1}})
	rep := r.Check(context.Background(), t0, f.list(), "heartbeat")
	if rep.Workers != 3 {
		t.Fatalf("%d workers take part, want a, b, idle", rep.Workers)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, m := range f.moves {
		from := f.owner[m.ID+"@"+fmt.Sprint(i+1)]
		if from != "a" && from != "b" || m.To != "idle" {
			t.Errorf("move %s from %s to %s", m.ID, from, m.To)
		}
	}
	if rep.Results[wakeup.TargetUnavailable] == 0 || rep.Accepted() == 0 ||
		rep.Results[wakeup.TargetUnavailable]+rep.Accepted() != len(f.moves) || len(f.moves) != rep.Sent {
		t.Errorf("results %v for %d moves sent", rep.Results, len(f.moves))
	}
}

// A connection moved within the cooling period (moved_at_ms) is not moved again;
// a donor whose connections all cool gives nothing and the plan says why.
func TestRoundHonoursCooling(t *testing.T) {
	f := newFleet(t, map[string]int{"a": 20, "b": 0}, 100)
	for i := range 20 {
		f.put(codec.Connection{ID: fmt.Sprintf("a-c%03d", i), DesiredState: schema.Started, WSURL: "ws://up/x",
			LeaseOwner: "a", LeaseExpiresAtMs: schema.LeaseHeldByMember, LeaseVersion: 7,
			MovedAtMs: t0.Add(-time.Minute).UnixMilli()})
	}
	r := f.rounds(Config{})
	rep := r.Check(context.Background(), t0, f.list(), "heartbeat")
	if len(rep.Plan.Moves) != 0 || !rep.Plan.Cooling || rep.Sent != 0 {
		t.Fatalf("moved cooling connections: %+v", rep)
	}
	// A round that moved nothing holds the next one for Settle, rather than reading
	// the same cooling candidates on every heartbeat.
	if rep := r.Check(context.Background(), t0.Add(DefaultMinInterval), f.list(), "heartbeat"); !strings.Contains(rep.Skipped, "do not show") {
		t.Fatalf("not held after a round that moved nothing: %+v", rep)
	}
	// It holds until the first of them cools (4 min from now), not just for Settle,
	// so a fleet stuck on cooling is not read again on every settle period; a
	// worker joining checks anyway.
	if rep := r.Check(context.Background(), t0.Add(3*time.Minute), f.list(), "heartbeat"); !strings.Contains(rep.Skipped, "do not show") {
		t.Fatalf("not held until the cooling ends: %+v", rep)
	}
	if rep := r.Check(context.Background(), t0.Add(3*time.Minute), f.list(), WhyJoined); rep.Skipped != "" || rep.Accepted() != 0 {
		t.Fatalf("a join did not check (or moved cooling connections): %+v", rep)
	}
	// Past the cooling period they move.
	rep = r.Check(context.Background(), t0.Add(5*time.Minute), f.list(), "heartbeat")
	if rep.Accepted() != 2 {
		t.Fatalf("after cooling: %+v", rep)
	}
}

// A balanced fleet costs no read: the store fails the test if called.
func TestBalancedFleetReadsNothing(t *testing.T) {
	r, err := New(Config{}, strictStore{t}, &wakeup.Client{Secret: secret}, nil)
	if err != nil {
		t.Fatal(err)
	}
	exp := t0.Add(time.Hour).UnixMilli()
	ws := []codec.Worker{
		{ID: "a", Addr: "a:1", Capacity: 100, Load: 50, HeartbeatExpiresAtMs: exp},
		{ID: "b", Addr: "b:1", Capacity: 100, Load: 54, HeartbeatExpiresAtMs: exp},
		{ID: "dr", Addr: "dr:1", Capacity: 100, Load: 0, Draining: true, HeartbeatExpiresAtMs: exp},
	}
	if rep := r.Check(context.Background(), t0, ws, "heartbeat"); rep.Skipped != "balanced" {
		t.Fatalf("%+v", rep)
	}
}

type strictStore struct{ t *testing.T }

func (s strictStore) OwnedBy(context.Context, string) ([]string, float64, error) {
	s.t.Error("unexpected OwnedBy")
	return nil, 0, nil
}

func (s strictStore) Read(context.Context, []string) (map[string]Candidate, float64, error) {
	s.t.Error("unexpected Read")
	return nil, 0, nil
}

// Rounds are at least MinInterval apart, checks at most once per CheckEvery, and a
// disabled Rounds never checks.
func TestIntervals(t *testing.T) {
	f := newFleet(t, map[string]int{"a": 50, "b": 0}, 100)
	r := f.rounds(Config{MinInterval: 10 * time.Second})
	if !r.Due(t0) || r.Due(t0.Add(time.Second)) || !r.Due(t0.Add(DefaultCheckEvery)) {
		t.Fatal("Due does not bound checks to one per CheckEvery")
	}
	if rep := r.Check(context.Background(), t0, f.list(), "heartbeat"); rep.Skipped != "" {
		t.Fatalf("%+v", rep)
	}
	if rep := r.Check(context.Background(), t0.Add(9*time.Second), f.list(), "heartbeat"); !strings.Contains(rep.Skipped, "minimum interval") {
		t.Fatalf("%+v", rep)
	}
	off := f.rounds(Config{Disabled: true})
	if off.Due(t0) || off.Check(context.Background(), t0, f.list(), "sweep").Skipped != "disabled" {
		t.Fatal("a disabled Rounds checks")
	}
}

func TestConfigRejectsBadValues(t *testing.T) {
	for name, c := range map[string]Config{
		"tolerance 1":        {Plan: rebalance.Config{Tolerance: 1}},
		"negative tolerance": {Plan: rebalance.Config{Tolerance: -0.1}},
		"fraction over 1":    {Plan: rebalance.Config{MaxFraction: 1.5}},
		"negative cooling":   {Plan: rebalance.Config{Cooling: -time.Second}},
		"negative interval":  {MinInterval: -time.Second},
		"negative settle":    {Settle: -time.Second},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := New(c, strictStore{t}, &wakeup.Client{Secret: secret}, nil); err == nil {
				t.Fatal("accepted")
			}
		})
	}
	if _, err := New(Config{}, nil, &wakeup.Client{Secret: secret}, nil); err == nil {
		t.Fatal("accepted a nil store")
	}
}

// The reader lists a worker's connections from the index (released ones too, as
// the index keeps lease_owner) and reads what a round needs, counting read units.
func TestReader(t *testing.T) {
	f := newFleet(t, map[string]int{"a": 2, "b": 1}, 10)
	f.put(codec.Connection{ID: "a-released", DesiredState: schema.Started, WSURL: "ws://up/x", LeaseOwner: "a", LeaseVersion: 3})
	f.put(codec.Connection{ID: "a-moved", DesiredState: schema.Started, WSURL: "ws://up/x", LeaseOwner: "a",
		LeaseExpiresAtMs: schema.LeaseHeldByMember, LeaseVersion: 9, MovedAtMs: 1234})
	rd := &Reader{DB: f.db, Table: f.table}
	ids, units, err := rd.OwnedBy(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(ids)
	if want := []string{"a-c000", "a-c001", "a-moved", "a-released"}; !slices.Equal(ids, want) || units <= 0 {
		t.Fatalf("ids %v (want %v), units %v", ids, want, units)
	}
	got, units, err := rd.Read(context.Background(), append(ids, "missing"))
	if err != nil || units <= 0 {
		t.Fatalf("read: %v, units %v", err, units)
	}
	want := map[string]Candidate{
		"a-c000":     {Found: true, Owner: "a", Held: true, Started: true, LeaseVersion: 7},
		"a-c001":     {Found: true, Owner: "a", Held: true, Started: true, LeaseVersion: 7},
		"a-moved":    {Found: true, Owner: "a", Held: true, Started: true, LeaseVersion: 9, MovedAtMs: 1234},
		"a-released": {Found: true, Owner: "a", Started: true, LeaseVersion: 3},
		"missing":    {},
	}
	for id, w := range want {
		if got[id] != w {
			t.Errorf("%s: %+v, want %+v", id, got[id], w)
		}
	}
	t.Logf("read units: %v for %d keys", units, len(want))
}

func TestReaderRejectsBadInput(t *testing.T) {
	rd := &Reader{DB: nil, Table: "t"}
	if _, _, err := rd.OwnedBy(context.Background(), ""); err == nil {
		t.Error("empty worker id accepted")
	}
	many := make([]string, BatchLimit+1)
	for i := range many {
		many[i] = fmt.Sprint("c", i)
	}
	if _, _, err := rd.Read(context.Background(), many); err == nil {
		t.Error("over the batch limit accepted")
	}
	if _, _, err := rd.Read(context.Background(), []string{"bad id"}); err == nil {
		t.Error("bad id accepted")
	}
}

// The registry's loads only trigger a round; the round plans on the index's counts,
// so a stale registry load never makes a worker that already holds its share a
// target.
func TestRoundPlansOnIndexCounts(t *testing.T) {
	f := newFleet(t, map[string]int{"a": 20, "b": 20, "c": 0}, 100)
	f.workers["b"].Load = 0 // b's registry item predates its acquisitions
	f.apply = false
	r := f.rounds(Config{Plan: rebalance.Config{MaxFraction: 1}})
	rep := r.Check(context.Background(), t0, f.list(), "worker joined")
	if rep.Conns != 40 {
		t.Fatalf("planned on %d connections, want the index's 40", rep.Conns)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range f.moves {
		if m.To != "c" {
			t.Errorf("move %s to %s: only c is below its band", m.ID, m.To)
		}
	}
	if len(f.moves) != rep.Plan.Min || rep.Plan.Min != 12 { // 40/3: band [12, 14]; c needs 12
		t.Errorf("%d moves, minimum %d", len(f.moves), rep.Plan.Min)
	}
}

// When the donor the first plan names has only cooling connections, another worker
// above its band's floor gives what the bands allow it to: a holds 23 (over its
// band [18, 22]), all cooling; b holds 22; c holds 15. b gives 2 to c, and a's
// excess waits for its cooling to end.
func TestRoundFindsAnotherDonorPastCooling(t *testing.T) {
	f := newFleet(t, map[string]int{"a": 23, "b": 22, "c": 15}, 100)
	for i := range 23 {
		f.put(codec.Connection{ID: fmt.Sprintf("a-c%03d", i), DesiredState: schema.Started, WSURL: "ws://up/x",
			LeaseOwner: "a", LeaseExpiresAtMs: schema.LeaseHeldByMember, LeaseVersion: 7,
			MovedAtMs: t0.Add(-time.Minute).UnixMilli()})
	}
	f.apply = false
	r := f.rounds(Config{})
	rep := r.Check(context.Background(), t0, f.list(), "heartbeat")
	if rep.Accepted() != 2 || rep.Plan.Min != 3 || !rep.Plan.Cooling {
		t.Fatalf("%+v", rep)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, m := range f.moves {
		if from := f.owner[m.ID+"@"+fmt.Sprint(i+1)]; from != "b" || m.To != "c" {
			t.Errorf("move %s from %s to %s, want b → c", m.ID, from, m.To)
		}
	}
}
