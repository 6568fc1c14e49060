package connquota

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/local/ddbtest"
	"github.com/sockfleet/sockfleet/shared/schema"
)

func TestMain(m *testing.M) { ddbtest.Main(m) }

const host = "stream.example.com"

func newStore(t *testing.T) (*Store, *ddbtest.Env) {
	env := ddbtest.New(t)
	return &Store{DB: env.DB, Table: env.Table}, env
}

func stored(t *testing.T, env *ddbtest.Env) map[string]types.AttributeValue {
	t.Helper()
	out, err := env.DB.GetItem(context.Background(), &dynamodb.GetItemInput{
		TableName: &env.Table, Key: key(host), ConsistentRead: aws.Bool(true)})
	if err != nil {
		t.Fatal(err)
	}
	return out.Item
}

func num(t *testing.T, it map[string]types.AttributeValue, name string) int64 {
	t.Helper()
	n, ok := it[name].(*types.AttributeValueMemberN)
	if !ok {
		t.Fatalf("%s: %#v", name, it[name])
	}
	v, _ := strconv.ParseInt(n.Value, 10, 64)
	return v
}

// N per window, then a wait until the window's end; the next window counts afresh.
func TestAdmitCountsPerWindow(t *testing.T) {
	s, env := newStore(t)
	ctx := context.Background()
	now := time.UnixMilli(1_800_000_000_000 + 10_000) // 10 s into a 1-minute window
	end := time.UnixMilli(1_800_000_000_000 + 60_000)
	for i := range 3 {
		v, err := s.Admit(ctx, host, 3, time.Minute, now.Add(time.Duration(i)*time.Second))
		if err != nil || !v.Admitted {
			t.Fatalf("dial %d: %+v, %v", i, v, err)
		}
	}
	v, err := s.Admit(ctx, host, 3, time.Minute, now.Add(5*time.Second))
	if err != nil || v.Admitted || !v.Retry.Equal(end) || !v.HeldUntil.IsZero() {
		t.Fatalf("4th dial: %+v, %v; want a retry at %s", v, err, end)
	}
	it := stored(t, env)
	if num(t, it, schema.AttrQuotaDials) != 3 || num(t, it, schema.AttrQuotaWindow) != 1_800_000_000_000 {
		t.Fatalf("item %v", it)
	}
	if ttl := num(t, it, schema.AttrTTL); ttl < end.Unix()+3600 {
		t.Fatalf("ttl %d before the window's end + 1h", ttl)
	}
	v, err = s.Admit(ctx, host, 3, time.Minute, end)
	if err != nil || !v.Admitted {
		t.Fatalf("next window: %+v, %v", v, err)
	}
	if it := stored(t, env); num(t, it, schema.AttrQuotaDials) != 1 {
		t.Fatalf("next window's count: %v", it)
	}
	// A clock behind the item's window waits for its own window's end.
	v, err = s.Admit(ctx, host, 3, time.Minute, end.Add(-time.Second))
	if err != nil || v.Admitted || !v.Retry.Equal(end) {
		t.Fatalf("behind: %+v, %v", v, err)
	}
}

// Many workers (clients of their own) racing for one window: exactly N get in.
func TestAdmitHoldsAcrossClients(t *testing.T) {
	_, env := newStore(t)
	const n, workers, each = 7, 4, 10
	now := time.UnixMilli(1_800_000_000_000)
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		s := &Store{DB: env.Client(nil), Table: env.Table}
		for range each {
			wg.Go(func() {
				v, err := s.Admit(context.Background(), host, n, time.Minute, now)
				if err != nil {
					t.Error(err)
				}
				if v.Admitted {
					admitted.Add(1)
				}
			})
		}
	}
	wg.Wait()
	if got := admitted.Load(); got != n {
		t.Fatalf("admitted %d of %d, want %d", got, workers*each, n)
	}
}

// A hold stops every admission until it ends, with or without a quota; a shorter
// hold never shortens it, and one beyond MaxHold is capped.
func TestHold(t *testing.T) {
	s, env := newStore(t)
	ctx := context.Background()
	now := time.UnixMilli(1_800_000_000_000)
	until := now.Add(7 * time.Second)
	if err := s.Hold(ctx, host, until, now); err != nil {
		t.Fatal(err)
	}
	if err := s.Hold(ctx, host, now.Add(2*time.Second), now); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{0, 5} {
		v, err := s.Admit(ctx, host, n, time.Minute, now.Add(6*time.Second))
		if err != nil || v.Admitted || !v.HeldUntil.Equal(until) {
			t.Fatalf("n=%d during the hold: %+v, %v; want held until %s", n, v, err, until)
		}
		v, err = s.Admit(ctx, host, n, time.Minute, until)
		if err != nil || !v.Admitted {
			t.Fatalf("n=%d after the hold: %+v, %v", n, v, err)
		}
	}
	if err := s.Hold(ctx, host, now.Add(72*time.Hour), now); err != nil {
		t.Fatal(err)
	}
	it := stored(t, env)
	if got := num(t, it, schema.AttrBlockedUntil); got != now.Add(MaxHold).UnixMilli() {
		t.Fatalf("blocked until %d, want capped at %d", got, now.Add(MaxHold).UnixMilli())
	}
	if ttl := num(t, it, schema.AttrTTL); ttl < now.Add(MaxHold+time.Hour).Unix() {
		t.Fatalf("ttl %d would remove the item within an hour of its hold's end", ttl)
	}
}

// An operator's mistyped attributes cannot wedge a host: the next window repairs them.
func TestMistypedItemIsRepaired(t *testing.T) {
	s, env := newStore(t)
	_, err := env.DB.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: &env.Table, Item: map[string]types.AttributeValue{
		schema.AttrPK:           &types.AttributeValueMemberS{Value: schema.QuotaKey(host)},
		schema.AttrQuotaWindow:  &types.AttributeValueMemberS{Value: "yesterday"},
		schema.AttrQuotaDials:   &types.AttributeValueMemberN{Value: "99"},
		schema.AttrBlockedUntil: &types.AttributeValueMemberS{Value: "never"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	v, err := s.Admit(context.Background(), host, 2, time.Minute, time.UnixMilli(1_800_000_000_000))
	if err != nil || !v.Admitted {
		t.Fatalf("%+v, %v", v, err)
	}
	if it := stored(t, env); num(t, it, schema.AttrQuotaDials) != 1 {
		t.Fatalf("item %v", it)
	}
}

func TestAdmitRefusesBadInput(t *testing.T) {
	s := &Store{} // never reached: the input is checked first
	for _, tc := range []struct {
		host string
		n    int
		w    time.Duration
	}{{"", 1, time.Second}, {host, -1, time.Second}, {host, 1, 0}} {
		if _, err := s.Admit(context.Background(), tc.host, tc.n, tc.w, time.Now()); err == nil {
			t.Errorf("Admit(%q, %d, %s): no error", tc.host, tc.n, tc.w)
		}
	}
	if err := s.Hold(context.Background(), "", time.Now(), time.Now()); err == nil {
		t.Error("Hold without a host: no error")
	}
}
