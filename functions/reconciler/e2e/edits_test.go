package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

func (s *stack) raw(id string) codec.Item {
	s.t.Helper()
	out, err := s.e.DB.GetItem(context.Background(), &dynamodb.GetItemInput{TableName: &s.e.Table, ConsistentRead: aws.Bool(true),
		Key: map[string]types.AttributeValue{schema.AttrPK: codec.S(schema.ConnKey(id))}})
	if err != nil {
		s.t.Fatal(err)
	}
	return out.Item
}

func (s *stack) putRaw(it codec.Item) {
	s.t.Helper()
	if _, err := s.e.DB.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: &s.e.Table, Item: it}); err != nil {
		s.t.Fatal(err)
	}
}

// A lowercase "started" on a new item is neither filtered away silently nor run: the
// reconciler writes the problem on the item. The fix then streams.
func TestOperatorTypoIsSaidOnTheItemThenFixed(t *testing.T) {
	s := newStack(t)
	it := codec.EncodeConnection(codec.Connection{ID: "typo", DesiredState: "started", WSURL: s.up.URL("typo")})
	s.putRaw(it)
	const want = `invalid desired_state "started": want STARTED or STOPPED`
	s.waitFor("problem written on the item", 5*time.Second, func() bool {
		c, _ := codec.DecodeConnection(s.raw("typo"))
		return c.Status == "invalid" && c.StatusError == want
	})
	if s.streaming("typo") {
		t.Fatal("an unusable item streams")
	}
	s.setState("typo", schema.Started)
	took := s.waitFor("streaming after the fix", 5*time.Second, func() bool { return s.streaming("typo") })
	t.Logf("fix → streaming in %s", took)
}

// A console save of an old, released image (a lower lease_version, no owner) while a
// worker streams the connection: the reconciler must not hand it to a second worker
// while the holder still streams. The holder is asked, takes its lease back, and goes
// on; the item says what happened.
func TestStaleReleasedImageIsTakenBackByTheHolder(t *testing.T) {
	s := newStack(t)
	s.put("c", schema.Started)
	s.waitFor("streaming", 2*time.Second, func() bool { return s.streaming("c") })
	before := s.raw("c")
	held, _ := codec.DecodeConnection(before)
	stale := codec.EncodeConnection(codec.Connection{ID: "c", DesiredState: schema.Started, WSURL: s.up.URL("c"),
		LeaseVersion: held.LeaseVersion - 60_000, Status: "released", StatusAtMs: time.Now().Add(-time.Minute).UnixMilli()})
	s.putRaw(stale)
	s.waitFor("the holder took its lease back", 5*time.Second, func() bool {
		c, _ := codec.DecodeConnection(s.raw("c"))
		return c.LeaseOwner == held.LeaseOwner && c.LeaseVersion == held.LeaseVersion
	})
	time.Sleep(time.Second) // a second worker, if one were woken, would be streaming by now
	if st := s.up.Stats("c"); st.MaxClients > 1 || st.Clients != 1 {
		t.Errorf("upstream clients %+v: want one, never two", st)
	}
	if lr, _ := s.raw("c")[schema.AttrLastRepair].(*types.AttributeValueMemberS); lr == nil || !strings.Contains(lr.Value, "stale image") {
		t.Errorf("last_repair %v: want the stale image said", lr)
	}
}

// The console's edit of an advisory number into a String (nudged_at_ms saved as
// type S): when the connection is started again, no worker is woken for it more
// than once, the item says invalid naming the attribute and its type, and nothing
// loops (a loop of acquire, give back, release would rewrite status_at_ms each
// time, so the orphan alarm would never see the item age).
func TestMistypedAdvisoryAttributeDoesNotLoop(t *testing.T) {
	s := newStack(t)
	s.put("c", schema.Started)
	s.waitFor("streaming", 2*time.Second, func() bool { return s.streaming("c") })
	_, err := s.e.DB.UpdateItem(context.Background(), &dynamodb.UpdateItemInput{
		TableName: &s.e.Table, Key: map[string]types.AttributeValue{schema.AttrPK: codec.S(schema.ConnKey("c"))},
		UpdateExpression:          aws.String("SET #n = :n"),
		ExpressionAttributeNames:  map[string]string{"#n": schema.AttrNudgedAt},
		ExpressionAttributeValues: map[string]types.AttributeValue{":n": codec.S("1764680000000")},
	})
	if err != nil {
		t.Fatal(err)
	}
	s.setState("c", schema.Stopped)
	s.waitFor("stopped", 5*time.Second, func() bool { return !s.streaming("c") && s.owner("c") == "" })
	before := s.wakeups("c")
	s.setState("c", schema.Started)
	s.waitFor("invalid on the item", 5*time.Second, func() bool {
		c, _ := codec.DecodeConnection(s.raw("c"))
		return c.Status == "invalid"
	})
	c, _ := codec.DecodeConnection(s.raw("c"))
	if !strings.Contains(c.StatusError, schema.AttrNudgedAt) || !strings.Contains(c.StatusError, "type S") {
		t.Fatalf("status_error %q: want the attribute and its type named", c.StatusError)
	}
	// A marker connection goes through the same stream and reconciler: once it
	// streams, a loop on c would have gone round too.
	s.put("m", schema.Started)
	s.waitFor("marker streaming", 5*time.Second, func() bool { return s.streaming("m") })
	after, _ := codec.DecodeConnection(s.raw("c"))
	if n := s.wakeups("c") - before; n > 1 {
		t.Errorf("%d wakeups for c after the start; want at most one", n)
	}
	if after.StatusAtMs != c.StatusAtMs || after.Status != "invalid" || after.Owned() {
		t.Errorf("item rewritten or owned after it was reported invalid: %+v then %+v", c, after)
	}
	if s.streaming("c") {
		t.Error("an invalid item streams")
	}
}

// wakeups counts the wakeups sent for id.
func (s *stack) wakeups(id string) int {
	s.sender.mu.Lock()
	defer s.sender.mu.Unlock()
	n := 0
	for _, c := range s.sender.calls {
		if strings.HasSuffix(c, "/"+id) {
			n++
		}
	}
	return n
}
