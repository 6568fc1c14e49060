package lease_test

import (
	"context"
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

// Lease copies l with another owner and version.
func Lease(l lease.Lease, owner string, v int64) lease.Lease {
	l.Owner, l.Version = owner, v
	return l
}
