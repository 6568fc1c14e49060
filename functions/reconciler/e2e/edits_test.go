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
