package lease_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/lease"
	"github.com/sockfleet/sockfleet/shared/local/ddbtest"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

func TestMain(m *testing.M) { ddbtest.Main(m) }

// fixture is a table with helpers to write and read raw items.
type fixture struct {
	t   *testing.T
	env *ddbtest.Env
	ctx context.Context
}

func newFixture(t *testing.T) *fixture {
	return &fixture{t: t, env: ddbtest.New(t), ctx: context.Background()}
}

// store returns a lease store whose clock is offset from real time by skew.
func (f *fixture) store(db lease.DynamoDB, skew time.Duration) *lease.Store {
	f.t.Helper()
	if db == nil {
		db = f.env.DB
	}
	s, err := lease.New(db, lease.Config{
		Table: f.env.Table, Duration: 10 * time.Second, SkewMargin: 2 * time.Second,
		Now: func() time.Time { return time.Now().Add(skew) },
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return s
}

func (f *fixture) put(c codec.Connection) {
	f.t.Helper()
	f.putRaw(codec.EncodeConnection(c))
}

func (f *fixture) putRaw(it codec.Item) {
	f.t.Helper()
	if _, err := f.env.DB.PutItem(f.ctx, &dynamodb.PutItemInput{TableName: &f.env.Table, Item: it}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) raw(id string) codec.Item {
	f.t.Helper()
	out, err := f.env.DB.GetItem(f.ctx, &dynamodb.GetItemInput{TableName: &f.env.Table, ConsistentRead: aws.Bool(true),
		Key: map[string]types.AttributeValue{schema.AttrPK: codec.S(schema.ConnKey(id))}})
	if err != nil {
		f.t.Fatal(err)
	}
	return out.Item
}

func (f *fixture) get(id string) codec.Connection {
	f.t.Helper()
	it := f.raw(id)
	if it == nil {
		f.t.Fatalf("item %s does not exist", id)
	}
	c, err := codec.DecodeConnection(it)
	if err != nil {
		f.t.Fatalf("decode %s: %v", id, err)
	}
	return c
}

func (f *fixture) count() int {
	f.t.Helper()
	out, err := f.env.DB.Scan(f.ctx, &dynamodb.ScanInput{TableName: &f.env.Table, Select: types.SelectCount})
	if err != nil {
		f.t.Fatal(err)
	}
	return int(out.Count)
}

func started(id string) codec.Connection {
	return codec.Connection{ID: id, DesiredState: schema.Started, WSURL: "wss://up.example/streams/" + id, LastSeq: 7}
}

func nowMs() int64 { return time.Now().UnixMilli() }

func TestAcquire(t *testing.T) {
	f := newFixture(t)
	s := f.store(nil, 0)
	f.put(started("a"))

	before := nowMs()
	l, err := s.Acquire(f.ctx, "a", "w1")
	if err != nil {
		t.Fatal(err)
	}
	// A fresh item's first version is the wall-clock floor (see the HLC test).
	if l.Version < before || l.Version > nowMs() || l.Owner != "w1" || l.WSURL != "wss://up.example/streams/a" || l.LastSeq != 7 {
		t.Fatalf("lease %+v", l)
	}
	c := f.get("a")
	if c.LeaseOwner != "w1" || c.LeaseVersion != l.Version || c.LeaseExpiresAtMs != l.ExpiresAtMs {
		t.Fatalf("item %+v does not match lease %+v", c, l)
	}
	if d := l.ExpiresAtMs - nowMs(); d < 9_000 || d > 10_500 {
		t.Errorf("expiry %d ms from now, want about the 10 s lease", d)
	}

	// Released: the next acquire bumps the version.
	if err := s.Release(f.ctx, l, lease.Progress{LastSeq: 9}); err != nil {
		t.Fatal(err)
	}
	l2, err := s.Acquire(f.ctx, "a", "w2")
	if err != nil || l2.Version <= l.Version || l2.LastSeq != 9 {
		t.Fatalf("acquire after release: %+v, %v", l2, err)
	}
}

func TestAcquireRefusals(t *testing.T) {
	f := newFixture(t)
	s := f.store(nil, 0)
	live := started("held")
	live.LeaseOwner, live.LeaseExpiresAtMs, live.LeaseVersion = "w9", nowMs()+60_000, 4
	f.put(live)
	stopped := started("stopped")
	stopped.DesiredState = schema.Stopped
	f.put(stopped)
	lower := codec.EncodeConnection(started("lower"))
	lower[schema.AttrDesiredState] = codec.S("started")
	f.putRaw(lower)
	noState := codec.EncodeConnection(started("nostate"))
	delete(noState, schema.AttrDesiredState)
	f.putRaw(noState)
	justExpired := started("fresh-expired") // expired, but within the skew margin
	justExpired.LeaseOwner, justExpired.LeaseExpiresAtMs, justExpired.LeaseVersion = "w9", nowMs()-500, 2
	f.put(justExpired)

	cases := []struct {
		id   string
		want error
	}{
		{"missing", lease.ErrNotFound},
		{"held", lease.ErrHeld},
		{"stopped", lease.ErrNotStarted},
		{"lower", lease.ErrNotStarted},
		{"nostate", lease.ErrNotStarted},
		{"fresh-expired", lease.ErrHeld},
		{"CONN#held", lease.ErrInvalid}, // the seed's double prefix
		{"", lease.ErrInvalid},
	}
	for _, tc := range cases {
		t.Run(tc.id, func(t *testing.T) {
			before := f.raw(tc.id)
			_, err := s.Acquire(f.ctx, tc.id, "w1")
			if !errors.Is(err, tc.want) {
				t.Fatalf("Acquire(%q) = %v, want %v", tc.id, err, tc.want)
			}
			if after := f.raw(tc.id); !reflect.DeepEqual(before, after) {
				t.Errorf("a refused acquire changed the item:\nbefore %v\nafter  %v", before, after)
			}
		})
	}
	if n := f.count(); n != 5 {
		t.Errorf("%d items in the table, want 5: a refused acquire created an item", n)
	}
	if _, err := s.Acquire(f.ctx, "held", "bad worker"); !errors.Is(err, lease.ErrInvalid) {
		t.Errorf("bad worker id: %v", err)
	}
}

func TestAcquireExpiredBeyondMargin(t *testing.T) {
	f := newFixture(t)
	s := f.store(nil, 0)
	c := started("x")
	c.LeaseOwner, c.LeaseExpiresAtMs, c.LeaseVersion = "dead", nowMs()-2_500, 5
	f.put(c)
	l, err := s.Acquire(f.ctx, "x", "w1")
	if err != nil || l.Version <= 5 {
		t.Fatalf("acquire of a lease expired beyond the margin: %+v, %v", l, err)
	}
}

func TestAcquireUnusableItemIsGivenBack(t *testing.T) {
	f := newFixture(t)
	s := f.store(nil, 0)
	for id, url := range map[string]string{"nohost": "ws:///streams/x", "http": "http://up.example/x", "huge": "wss://h/" + strings.Repeat("a", 3000)} {
		it := codec.EncodeConnection(started(id))
		it[schema.AttrWSURL] = codec.S(url)
		f.putRaw(it)
		_, err := s.Acquire(f.ctx, id, "w1")
		if !errors.Is(err, lease.ErrInvalid) || !strings.Contains(err.Error(), "ws_url") {
			t.Fatalf("%s: Acquire = %v, want ErrInvalid naming ws_url", id, err)
		}
		got, _ := codec.DecodeConnection(f.raw(id))
		if got.Owned() || got.Status != "invalid" || !strings.Contains(got.StatusError, "ws_url") {
			t.Errorf("%s: item after refused acquire %+v; want unowned with the reason in status", id, got)
		}
	}
}

func TestRenew(t *testing.T) {
	f := newFixture(t)
	s := f.store(nil, 0)
	f.put(started("r"))
	l, err := s.Acquire(f.ctx, "r", "w1")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	c, err := s.Renew(f.ctx, l, lease.Progress{LastSeq: 100, Status: "streaming"})
	if err != nil {
		t.Fatal(err)
	}
	if c.LastSeq != 100 || c.LeaseExpiresAtMs <= l.ExpiresAtMs || c.DesiredState != schema.Started || c.Status != "streaming" {
		t.Fatalf("renewed item %+v", c)
	}
	// Renew reports the operator's changes.
	if _, err := f.env.DB.UpdateItem(f.ctx, &dynamodb.UpdateItemInput{TableName: &f.env.Table,
		Key:                       map[string]types.AttributeValue{schema.AttrPK: codec.S("CONN#r")},
		UpdateExpression:          aws.String("SET desired_state = :s, ws_url = :u"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":s": codec.S("STOPPED"), ":u": codec.S("ws://new/x")}}); err != nil {
		t.Fatal(err)
	}
	c, err = s.Renew(f.ctx, l, lease.Progress{LastSeq: 101})
	if err != nil || c.DesiredState != schema.Stopped || c.WSURL != "ws://new/x" || c.LastSeq != 101 || c.Status != "streaming" {
		t.Fatalf("renew after flip: %+v, %v", c, err)
	}
	// Deleted item: not found, and no phantom item.
	if _, err := f.env.DB.DeleteItem(f.ctx, &dynamodb.DeleteItemInput{TableName: &f.env.Table,
		Key: map[string]types.AttributeValue{schema.AttrPK: codec.S("CONN#r")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Renew(f.ctx, l, lease.Progress{LastSeq: 102}); !errors.Is(err, lease.ErrNotFound) {
		t.Fatalf("renew of deleted item: %v, want ErrNotFound", err)
	}
	if err := s.Release(f.ctx, l, lease.Progress{LastSeq: 102}); !errors.Is(err, lease.ErrNotFound) {
		t.Fatalf("release of deleted item: %v, want ErrNotFound", err)
	}
	if f.raw("r") != nil {
		t.Fatal("renew or release re-created a deleted item")
	}
}

func TestRelease(t *testing.T) {
	f := newFixture(t)
	s := f.store(nil, 0)
	f.put(started("r"))
	l, _ := s.Acquire(f.ctx, "r", "w1")
	if err := s.Release(f.ctx, Lease(l, "w2", l.Version), lease.Progress{LastSeq: 1}); !errors.Is(err, lease.ErrLost) {
		t.Fatalf("release by another worker: %v", err)
	}
	if err := s.Release(f.ctx, l, lease.Progress{LastSeq: 55}); err != nil {
		t.Fatal(err)
	}
	c := f.get("r")
	if c.Owned() || c.LeaseOwner != "" || c.LeaseExpiresAtMs != 0 || c.LastSeq != 55 || c.LeaseVersion != l.Version || c.Status != "released" {
		t.Fatalf("released item %+v", c)
	}
	// Releasing twice is not an error the caller must handle specially: it is lost.
	if err := s.Release(f.ctx, l, lease.Progress{LastSeq: 56}); !errors.Is(err, lease.ErrLost) {
		t.Fatalf("second release: %v", err)
	}
	if f.get("r").LastSeq != 55 {
		t.Fatal("a refused release moved the checkpoint")
	}
}

// Lease copies l with another owner and version.
func Lease(l lease.Lease, owner string, v int64) lease.Lease {
	l.Owner, l.Version = owner, v
	return l
}

func TestFencingAfterTakeover(t *testing.T) {
	f := newFixture(t)
	old := f.store(nil, 0)
	f.put(started("f"))
	l1, err := old.Acquire(f.ctx, "f", "w1")
	if err != nil {
		t.Fatal(err)
	}
	// w2's clock is past w1's expiry plus the margin: a takeover.
	taker := f.store(nil, 13*time.Second)
	l2, err := taker.Acquire(f.ctx, "f", "w2")
	if err != nil || l2.Version <= l1.Version {
		t.Fatalf("takeover: %+v, %v", l2, err)
	}
	before := f.raw("f")
	if _, err := old.Renew(f.ctx, l1, lease.Progress{LastSeq: 8}); !errors.Is(err, lease.ErrLost) {
		t.Errorf("old owner's renew: %v, want ErrLost", err)
	}
	if _, err := old.Renew(f.ctx, l1, lease.Progress{LastSeq: 999, Status: "streaming"}); !errors.Is(err, lease.ErrLost) {
		t.Errorf("old owner's checkpoint: %v, want ErrLost", err)
	}
	if err := old.Release(f.ctx, l1, lease.Progress{LastSeq: 999}); !errors.Is(err, lease.ErrLost) {
		t.Errorf("old owner's release: %v, want ErrLost", err)
	}
	// The same worker id with the old version is fenced too (a restarted w1, say).
	if _, err := old.Renew(f.ctx, Lease(l1, "w2", l1.Version), lease.Progress{LastSeq: 1}); !errors.Is(err, lease.ErrLost) {
		t.Errorf("stale version under the new owner's name: %v, want ErrLost", err)
	}
	if after := f.raw("f"); !reflect.DeepEqual(before, after) {
		t.Fatalf("fenced writes changed the item:\nbefore %v\nafter  %v", before, after)
	}
	if _, err := taker.Renew(f.ctx, l2, lease.Progress{LastSeq: 8}); err != nil {
		t.Fatalf("new owner's renew: %v", err)
	}
}

func TestClockSkewWithinMarginCannotTakeLiveLease(t *testing.T) {
	f := newFixture(t)
	owner := f.store(nil, 0)
	f.put(started("k"))
	l, err := owner.Acquire(f.ctx, "k", "w1")
	if err != nil {
		t.Fatal(err)
	}
	untilExpiry := time.Duration(l.ExpiresAtMs-nowMs()) * time.Millisecond
	// The owner's lease is live for about 10 s. A worker whose clock runs ahead puts
	// the expiry in its past, but by less than the 2 s margin: it must not take over.
	ahead := f.store(nil, untilExpiry+1500*time.Millisecond)
	if _, err := ahead.Acquire(f.ctx, "k", "w2"); !errors.Is(err, lease.ErrHeld) {
		t.Fatalf("acquire with a clock %s ahead: %v, want ErrHeld", untilExpiry+1500*time.Millisecond, err)
	}
	if err := ahead.ReleaseExpired(f.ctx, "k", "w1", l.Version, time.Now().Add(untilExpiry+1500*time.Millisecond)); !errors.Is(err, lease.ErrHeld) {
		t.Fatalf("sweep with a clock ahead: %v, want ErrHeld", err)
	}
	if _, err := owner.Renew(f.ctx, l, lease.Progress{LastSeq: 1}); err != nil {
		t.Fatalf("the owner lost its lease to a skewed clock: %v", err)
	}
}

func TestReleaseExpired(t *testing.T) {
	f := newFixture(t)
	s := f.store(nil, 0)
	now := time.Now()
	mk := func(id, owner string, v, exp int64) {
		c := started(id)
		c.LeaseOwner, c.LeaseVersion, c.LeaseExpiresAtMs = owner, v, exp
		f.put(c)
	}
	mk("old", "w1", 3, now.UnixMilli()-3_000)
	mk("margin", "w1", 3, now.UnixMilli()-1_000)
	mk("live", "w1", 3, now.UnixMilli()+5_000)
	mk("retaken", "w2", 4, now.UnixMilli()-3_000)
	cases := []struct {
		id, owner string
		v         int64
		want      error
	}{
		{"old", "w1", 3, nil},
		{"old", "w1", 3, nil}, // again: already released by us, not an error
		{"margin", "w1", 3, lease.ErrHeld},
		{"live", "w1", 3, lease.ErrHeld},
		{"retaken", "w1", 3, lease.ErrLost},
		{"live", "w1", 2, lease.ErrLost},
		{"missing", "w1", 1, lease.ErrNotFound},
	}
	for _, tc := range cases {
		err := s.ReleaseExpired(f.ctx, tc.id, tc.owner, tc.v, now)
		if !errors.Is(err, tc.want) && (tc.want != nil || err != nil) {
			t.Errorf("ReleaseExpired(%s, %s, %d) = %v, want %v", tc.id, tc.owner, tc.v, err, tc.want)
		}
	}
	if c := f.get("old"); c.Owned() || c.LeaseVersion != 3 || c.LastSeq != 7 {
		t.Errorf("swept item %+v", c)
	}
	if c := f.get("live"); c.LeaseOwner != "w1" {
		t.Errorf("live lease was swept: %+v", c)
	}
	if f.raw("missing") != nil {
		t.Error("the sweep created an item")
	}
}

func TestReleaseAllOwnedBy(t *testing.T) {
	f := newFixture(t)
	s := f.store(nil, 0)
	for i := range 30 {
		f.put(started(fmt.Sprint("c", i)))
	}
	for i := range 30 {
		w := "dead"
		if i%3 == 0 {
			w = "alive"
		}
		if _, err := s.Acquire(f.ctx, fmt.Sprint("c", i), w); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.ReleaseAllOwnedBy(f.ctx, "dead")
	if err != nil || len(got) != 20 {
		t.Fatalf("released %d (%v), want 20", len(got), err)
	}
	for i := range 30 {
		c := f.get(fmt.Sprint("c", i))
		if i%3 == 0 && c.LeaseOwner != "alive" || i%3 != 0 && c.Owned() {
			t.Errorf("c%d after crash release: %+v", i, c)
		}
	}
	again, err := s.ReleaseAllOwnedBy(f.ctx, "dead")
	if err != nil || len(again) != 0 {
		t.Fatalf("duplicate crash event released %v, %v", again, err)
	}
	if _, err := s.ReleaseAllOwnedBy(f.ctx, "WORKER#x"); !errors.Is(err, lease.ErrInvalid) {
		t.Fatalf("bad worker id: %v", err)
	}
}

// TestAcquireRace: 8 workers compete for 50 items over 20 rounds; every round each
// item must have exactly one winner, and every loser must see ErrHeld.
func TestAcquireRace(t *testing.T) {
	f := newFixture(t)
	s := f.store(nil, 0)
	const workers, items, rounds = 8, 50, 20
	for i := range items {
		f.put(started(fmt.Sprint("i", i)))
	}
	last := map[string]int64{}
	for round := range rounds {
		var mu sync.Mutex
		winners := map[string][]lease.Lease{}
		var wg sync.WaitGroup
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				order := rand.Perm(items)
				for _, i := range order {
					id := fmt.Sprint("i", i)
					l, err := s.Acquire(f.ctx, id, fmt.Sprint("w", w))
					switch {
					case err == nil:
						mu.Lock()
						winners[id] = append(winners[id], l)
						mu.Unlock()
					case !errors.Is(err, lease.ErrHeld):
						t.Errorf("round %d: %s: %v", round, id, err)
					}
				}
			}()
		}
		wg.Wait()
		for i := range items {
			id := fmt.Sprint("i", i)
			ws := winners[id]
			if len(ws) != 1 {
				t.Fatalf("round %d: %s had %d winners: %+v", round, id, len(ws), ws)
			}
			if ws[0].Version <= last[id] {
				t.Fatalf("round %d: %s version %d, not above the previous %d", round, id, ws[0].Version, last[id])
			}
			last[id] = ws[0].Version
			if err := s.Release(f.ctx, ws[0], lease.Progress{LastSeq: int64(round)}); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// dropper is a transport that forwards each request to the engine and then, for the
// selected operations, throws the response away: the write is applied, the caller
// never hears. It can also fail requests outright.
type dropper struct {
	mu   sync.Mutex
	drop map[string]int // operation -> responses left to drop
	fail map[string]int // operation -> requests left to fail with a 500, not forwarded
	down atomic.Bool    // refuse everything without forwarding
	seen atomic.Int64
}

func (d *dropper) RoundTrip(r *http.Request) (*http.Response, error) {
	if d.down.Load() {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	}
	op := r.Header.Get("X-Amz-Target")
	op = op[strings.LastIndex(op, ".")+1:]
	d.mu.Lock()
	fail := d.fail[op]
	if fail > 0 {
		d.fail[op] = fail - 1
	}
	d.mu.Unlock()
	if fail > 0 {
		return &http.Response{StatusCode: 500, Header: http.Header{"Content-Type": {"application/x-amz-json-1.0"}}, Request: r,
			Body: io.NopCloser(strings.NewReader(`{"__type":"com.amazonaws.dynamodb.v20120810#InternalServerError","message":"injected"}`))}, nil
	}
	resp, err := http.DefaultTransport.RoundTrip(r)
	if err != nil {
		return resp, err
	}
	d.mu.Lock()
	n := d.drop[op]
	if n > 0 {
		d.drop[op] = n - 1
	}
	d.mu.Unlock()
	if n > 0 {
		d.seen.Add(1)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return nil, &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
	}
	return resp, nil
}

func TestAmbiguousWritesReportTheTrueOutcome(t *testing.T) {
	for _, attempts := range []int{1, 3} {
		// attempts 1: the SDK gives up at once and the store reads the item back.
		// attempts 3: the SDK retries a write that was applied; the retry's condition
		// fails on our own write, and the store must recognise it as ours.
		t.Run(fmt.Sprintf("sdk-attempts-%d", attempts), func(t *testing.T) {
			f := newFixture(t)
			d := &dropper{drop: map[string]int{}}
			db := f.env.Client(d, func(o *dynamodb.Options) { o.RetryMaxAttempts = attempts })
			s := f.store(db, 0)
			f.put(started("amb"))

			d.drop["UpdateItem"] = 1
			l, err := s.Acquire(f.ctx, "amb", "w1")
			if err != nil {
				t.Fatalf("acquire whose response was dropped: %v", err)
			}
			if c := f.get("amb"); c.LeaseOwner != "w1" || c.LeaseVersion != l.Version || l.Version == 0 {
				t.Fatalf("acquire reported %+v, item is %+v", l, c)
			}

			d.drop["UpdateItem"] = 1
			c, err := s.Renew(f.ctx, l, lease.Progress{LastSeq: 42})
			if err != nil || c.LastSeq != 42 {
				t.Fatalf("renew whose response was dropped: %+v, %v", c, err)
			}

			// A dropped acquire that lost: another worker holds the lease; the
			// store must report ErrHeld, not success.
			other := f.store(f.env.DB, 0)
			f.put(started("amb2"))
			if _, err := other.Acquire(f.ctx, "amb2", "w2"); err != nil {
				t.Fatal(err)
			}
			d.drop["UpdateItem"] = 1
			if _, err := s.Acquire(f.ctx, "amb2", "w1"); !errors.Is(err, lease.ErrHeld) {
				t.Fatalf("dropped losing acquire: %v, want ErrHeld", err)
			}

			d.drop["UpdateItem"] = 1
			if err := s.Release(f.ctx, l, lease.Progress{LastSeq: 43}); err != nil {
				t.Fatalf("release whose response was dropped: %v", err)
			}
			if c := f.get("amb"); c.Owned() || c.LastSeq != 43 {
				t.Fatalf("after release: %+v", c)
			}
			if d.seen.Load() != 4 {
				t.Fatalf("dropped %d responses, want 4", d.seen.Load())
			}
		})
	}
}

// A write that failed before it was applied is ErrUnavailable: the caller keeps its
// lease (renew, release) or knows nobody took it (acquire). It is never reported as
// lost or held, which would make a worker drop a connection it still owns.
func TestFailedWritesAreUnavailableNotLost(t *testing.T) {
	f := newFixture(t)
	d := &dropper{drop: map[string]int{}, fail: map[string]int{}}
	s := f.store(f.env.Client(d, func(o *dynamodb.Options) { o.RetryMaxAttempts = 1 }), 0)
	f.put(started("a"))
	f.put(started("b"))
	d.fail["UpdateItem"] = 1
	if _, err := s.Acquire(f.ctx, "a", "w1"); !errors.Is(err, lease.ErrUnavailable) {
		t.Fatalf("failed acquire: %v, want ErrUnavailable", err)
	}
	l, err := s.Acquire(f.ctx, "b", "w1")
	if err != nil {
		t.Fatal(err)
	}
	d.fail["UpdateItem"] = 1
	if _, err := s.Renew(f.ctx, l, lease.Progress{LastSeq: 5}); !errors.Is(err, lease.ErrUnavailable) {
		t.Fatalf("failed renew: %v, want ErrUnavailable", err)
	}
	d.fail["UpdateItem"] = 1
	if err := s.Release(f.ctx, l, lease.Progress{LastSeq: 5}); !errors.Is(err, lease.ErrUnavailable) {
		t.Fatalf("failed release: %v, want ErrUnavailable", err)
	}
	if c := f.get("b"); c.LeaseOwner != "w1" || c.LastSeq != 7 {
		t.Fatalf("item after failed writes: %+v", c)
	}
	if _, err := s.Renew(f.ctx, l, lease.Progress{LastSeq: 6}); err != nil {
		t.Fatalf("the lease must still be ours: %v", err)
	}
}

func TestUnreachableIsUnavailable(t *testing.T) {
	f := newFixture(t)
	d := &dropper{drop: map[string]int{}}
	s := f.store(f.env.Client(d, func(o *dynamodb.Options) { o.RetryMaxAttempts = 1 }), 0)
	f.put(started("u"))
	l, err := s.Acquire(f.ctx, "u", "w1")
	if err != nil {
		t.Fatal(err)
	}
	d.down.Store(true)
	_, err = s.Renew(f.ctx, l, lease.Progress{LastSeq: 1})
	if !errors.Is(err, lease.ErrUnavailable) {
		t.Fatalf("renew with the table unreachable: %v, want ErrUnavailable", err)
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) {
		t.Errorf("a transport error type leaked through: %T", opErr)
	}
	if _, err := s.Acquire(f.ctx, "u", "w2"); !errors.Is(err, lease.ErrUnavailable) {
		t.Fatalf("acquire with the table unreachable: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	bad := []lease.Config{
		{},
		{Table: "t", Duration: -time.Second},
		{Table: "t", Duration: time.Second, SkewMargin: 2 * time.Second},
	}
	for _, c := range bad {
		if _, err := lease.New(nil, c); err == nil {
			t.Errorf("config %+v accepted", c)
		}
	}
	s, err := lease.New(nil, lease.Config{Table: "t"})
	if err != nil || s.Config().Duration != lease.DefaultDuration || s.Config().SkewMargin != lease.DefaultSkewMargin {
		t.Fatalf("defaults: %+v, %v", s.Config(), err)
	}
}

// A bad per-connection spec is an unusable item like a bad ws_url: given back at
// once, with status_error naming the attribute; a good one comes with the lease.
func TestAcquireBadSpecIsGivenBack(t *testing.T) {
	f := newFixture(t)
	s := f.store(nil, 0)
	it := codec.EncodeConnection(started("badspec"))
	it[schema.AttrKeepalive] = &types.AttributeValueMemberM{Value: codec.Item{schema.FieldMessage: codec.S("ping")}}
	f.putRaw(it)
	_, err := s.Acquire(f.ctx, "badspec", "w1")
	if !errors.Is(err, lease.ErrInvalid) || !strings.Contains(err.Error(), "keepalive: interval") {
		t.Fatalf("Acquire = %v, want ErrInvalid naming keepalive's interval", err)
	}
	got, _ := codec.DecodeConnection(f.raw("badspec"))
	if got.Owned() || got.Status != "invalid" || !strings.Contains(got.StatusError, "keepalive: interval") {
		t.Errorf("item after refused acquire %+v; want unowned with the reason in status", got)
	}

	good := started("goodspec")
	good.Spec = schema.Spec{Subprotocols: []string{"v2"}, Start: schema.StartEarliest}
	f.put(good)
	l, err := s.Acquire(f.ctx, "goodspec", "w1")
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Spec.Subprotocols) != 1 || l.Spec.Start != schema.StartEarliest {
		t.Fatalf("lease spec %+v", l.Spec)
	}
}

// The sequence epoch travels with the checkpoint: renews and the release write it,
// and the next acquire returns it, so the next owner labels messages alike.
func TestEpochIsCheckpointed(t *testing.T) {
	f := newFixture(t)
	s := f.store(nil, 0)
	f.put(started("ep"))
	l, err := s.Acquire(f.ctx, "ep", "w1")
	if err != nil {
		t.Fatal(err)
	}
	if c, err := s.Renew(f.ctx, l, lease.Progress{LastSeq: 3, Epoch: 1}); err != nil || c.Epoch != 1 || c.LastSeq != 3 {
		t.Fatalf("renew: %+v, %v", c, err)
	}
	if err := s.Release(f.ctx, l, lease.Progress{LastSeq: 9, Epoch: 2, Status: "seq_reset", Error: "sequence reset", Stop: true}); err != nil {
		t.Fatal(err)
	}
	// A halted stream's release stops the item: nobody takes it up until the operator does.
	if c := f.get("ep"); c.Epoch != 2 || c.LastSeq != 9 || c.Status != "seq_reset" || c.DesiredState != schema.Stopped {
		t.Fatalf("released item %+v", c)
	}
	if _, err := s.Acquire(f.ctx, "ep", "w2"); err == nil {
		t.Fatal("a halted item was acquired")
	}
	f.put(codec.Connection{ID: "ep", DesiredState: schema.Started, WSURL: "wss://up.example/streams/ep", LastSeq: 9, Epoch: 2})
	l, err = s.Acquire(f.ctx, "ep", "w2")
	if err != nil || l.Epoch != 2 || l.LastSeq != 9 {
		t.Fatalf("acquire: %+v, %v", l, err)
	}
}
