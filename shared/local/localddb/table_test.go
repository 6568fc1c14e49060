package localddb_test

import (
	"context"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/sockfleet/sockfleet/shared/local/ddbtest"
	"github.com/sockfleet/sockfleet/shared/local/localddb"
	"github.com/sockfleet/sockfleet/shared/schema"
)

func TestMain(m *testing.M) { ddbtest.Main(m) }

func TestEnsureTableMatchesSchema(t *testing.T) {
	e := ddbtest.New(t)
	ctx := context.Background()
	created, err := localddb.EnsureTable(ctx, e.DB, e.Table)
	if err != nil || created {
		t.Fatalf("second EnsureTable: created=%v err=%v, want false, nil", created, err)
	}
	out, err := e.DB.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(e.Table)})
	if err != nil {
		t.Fatal(err)
	}
	d := out.Table
	if got := string(d.StreamSpecification.StreamViewType); got != schema.Table.StreamView {
		t.Errorf("stream view %q, want %q", got, schema.Table.StreamView)
	}
	if d.LatestStreamArn == nil {
		t.Error("no stream ARN")
	}
	if len(d.GlobalSecondaryIndexes) != len(schema.Table.Indexes) {
		t.Fatalf("%d indexes, want %d", len(d.GlobalSecondaryIndexes), len(schema.Table.Indexes))
	}
	byName := map[string]string{}
	for _, g := range d.GlobalSecondaryIndexes {
		byName[*g.IndexName] = string(g.Projection.ProjectionType)
	}
	for _, ix := range schema.Table.Indexes {
		if byName[ix.Name] != string(ix.Projection) {
			t.Errorf("index %s projection %q, want %q", ix.Name, byName[ix.Name], ix.Projection)
		}
	}
	ttl, err := e.DB.DescribeTimeToLive(ctx, &dynamodb.DescribeTimeToLiveInput{TableName: aws.String(e.Table)})
	if err != nil {
		t.Fatal(err)
	}
	if ttl.TimeToLiveDescription == nil || aws.ToString(ttl.TimeToLiveDescription.AttributeName) != schema.AttrTTL {
		t.Errorf("TTL %+v, want attribute %s", ttl.TimeToLiveDescription, schema.AttrTTL)
	}
}

func TestEnsurePollingIndex(t *testing.T) {
	e := ddbtest.New(t)
	ctx := context.Background()
	for range 2 { // idempotent
		if err := localddb.EnsurePollingIndex(ctx, e.DB, e.Table); err != nil {
			t.Fatal(err)
		}
	}
	out, err := e.DB.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(e.Table)})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, g := range out.Table.GlobalSecondaryIndexes {
		found = found || aws.ToString(g.IndexName) == schema.PollingIndex.Name
	}
	if !found {
		t.Fatal("polling index not created")
	}
}
