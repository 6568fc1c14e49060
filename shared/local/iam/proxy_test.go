package iam

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/dynamodbstreams"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	ktypes "github.com/aws/aws-sdk-go-v2/service/kinesis/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
	"github.com/sockfleet/sockfleet/shared/local/ddbtest"
	"github.com/sockfleet/sockfleet/shared/local/kinesalite/kinesistest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	ddbtest.Stop()
	kinesistest.Stop()
	os.Exit(code)
}

// proxyFor starts a proxy enforcing the fixture in front of target, for table.
func proxyFor(t *testing.T, target, table, kinesisStream string) *Proxy {
	t.Helper()
	tpl := fixture(t)
	env := LocalEnv(map[string]string{"Table": table, "Messages": kinesisStream})
	keys, err := tpl.TableKeys("Table")
	if err != nil {
		t.Fatal(err)
	}
	roles := map[string]*Policy{}
	for _, r := range []string{"WorkerRole", "FunctionRole"} {
		if roles[r], err = tpl.Policy(r, env); err != nil {
			t.Fatal(err)
		}
	}
	p, err := NewProxy(ProxyConfig{
		Target: target, Mapper: &Mapper{Env: env, Tables: map[string]TableKeys{table: keys}},
		Roles: roles, Admins: []string{"local"}, Log: slog.New(slog.NewTextHandler(t.Output(), nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func creds(key string) aws.CredentialsProvider {
	return credentials.NewStaticCredentialsProvider(key, "secret", "")
}

// denied checks err is AWS's AccessDeniedException, HTTP 400, with message want.
func denied(t *testing.T, err error, want string) {
	t.Helper()
	var api smithy.APIError
	if !errors.As(err, &api) || api.ErrorCode() != "AccessDeniedException" {
		t.Fatalf("error %v, want AccessDeniedException", err)
	}
	if api.ErrorMessage() != want {
		t.Errorf("message\n %q\nwant\n %q", api.ErrorMessage(), want)
	}
	var re *smithyhttp.ResponseError
	if !errors.As(err, &re) || re.HTTPStatusCode() != http.StatusBadRequest {
		t.Errorf("error %v: want HTTP 400", err)
	}
}

func TestProxyDynamoDB(t *testing.T) {
	e := ddbtest.New(t)
	p := proxyFor(t, e.Endpoint, e.Table, "msgs")
	ctx := context.Background()
	client := func(key string) *dynamodb.Client {
		return dynamodb.New(dynamodb.Options{Region: "us-east-1", BaseEndpoint: aws.String(p.Endpoint()), Credentials: creds(key)})
	}
	worker, admin := client("WorkerRole"), client("local")
	item := func(pk string) map[string]types.AttributeValue {
		return map[string]types.AttributeValue{"Pk": &types.AttributeValueMemberS{Value: pk}}
	}
	arn := "arn:aws:dynamodb:us-east-1:000000000000:table/" + e.Table
	principal := "arn:aws:sts::000000000000:assumed-role/WorkerRole/local"

	if _, err := worker.PutItem(ctx, &dynamodb.PutItemInput{TableName: &e.Table, Item: item("CONN#1")}); err != nil {
		t.Fatalf("allowed PutItem: %v", err)
	}
	out, err := worker.GetItem(ctx, &dynamodb.GetItemInput{TableName: &e.Table, Key: item("CONN#1")})
	if err != nil || len(out.Item) == 0 {
		t.Fatalf("allowed GetItem: %v, %v", out, err)
	}
	_, err = worker.Scan(ctx, &dynamodb.ScanInput{TableName: &e.Table})
	denied(t, err, "User: "+principal+" is not authorized to perform: dynamodb:Scan on resource: "+arn+
		" because no identity-based policy allows the dynamodb:Scan action")

	_, err = worker.PutItem(ctx, &dynamodb.PutItemInput{TableName: &e.Table, Item: item("FORBIDDEN")})
	denied(t, err, "User: "+principal+" is not authorized to perform: dynamodb:PutItem on resource: "+arn+
		" with an explicit deny in an identity-based policy")
	// Not forwarded: the denied write never happened.
	if out, err := admin.GetItem(ctx, &dynamodb.GetItemInput{TableName: &e.Table, Key: item("FORBIDDEN"), ConsistentRead: aws.Bool(true)}); err != nil || len(out.Item) != 0 {
		t.Errorf("the denied PutItem reached the engine: %v, %v", out.Item, err)
	}
	if _, err := admin.Scan(ctx, &dynamodb.ScanInput{TableName: &e.Table}); err != nil {
		t.Errorf("the administrator's Scan: %v", err)
	}
	_, err = client("nobody").GetItem(ctx, &dynamodb.GetItemInput{TableName: &e.Table, Key: item("CONN#1")})
	var api smithy.APIError
	if !errors.As(err, &api) || api.ErrorCode() != "UnrecognizedClientException" {
		t.Errorf("an unknown access key: %v, want UnrecognizedClientException", err)
	}

	ds := p.Denials()
	if len(ds) != 3 || ds[0].Role != "WorkerRole" || ds[0].Action != "dynamodb:Scan" || ds[0].Resource != arn {
		t.Errorf("denials %+v", ds)
	}
}

// TestProxyStreams: the stream is read as the function role, GetRecords included,
// which names only a shard iterator.
func TestProxyStreams(t *testing.T) {
	e := ddbtest.New(t)
	p := proxyFor(t, e.Endpoint, e.Table, "msgs")
	ctx := context.Background()
	sc := dynamodbstreams.New(dynamodbstreams.Options{Region: "us-east-1", BaseEndpoint: aws.String(p.Endpoint()), Credentials: creds("FunctionRole")})
	ls, err := sc.ListStreams(ctx, &dynamodbstreams.ListStreamsInput{TableName: &e.Table})
	if err != nil || len(ls.Streams) == 0 {
		t.Fatalf("ListStreams: %v, %v", ls, err)
	}
	ds, err := sc.DescribeStream(ctx, &dynamodbstreams.DescribeStreamInput{StreamArn: ls.Streams[0].StreamArn})
	if err != nil || len(ds.StreamDescription.Shards) == 0 {
		t.Fatalf("DescribeStream: %v, %v", ds, err)
	}
	it, err := sc.GetShardIterator(ctx, &dynamodbstreams.GetShardIteratorInput{
		StreamArn: ls.Streams[0].StreamArn, ShardId: ds.StreamDescription.Shards[0].ShardId, ShardIteratorType: "TRIM_HORIZON",
	})
	if err != nil {
		t.Fatalf("GetShardIterator: %v", err)
	}
	recs, err := sc.GetRecords(ctx, &dynamodbstreams.GetRecordsInput{ShardIterator: it.ShardIterator})
	if err != nil {
		t.Fatalf("GetRecords: %v", err)
	}
	if recs.NextShardIterator != nil {
		if _, err := sc.GetRecords(ctx, &dynamodbstreams.GetRecordsInput{ShardIterator: recs.NextShardIterator}); err != nil {
			t.Fatalf("GetRecords with the next iterator: %v", err)
		}
	}
	// The worker role has no stream permission.
	wc := dynamodbstreams.New(dynamodbstreams.Options{Region: "us-east-1", BaseEndpoint: aws.String(p.Endpoint()), Credentials: creds("WorkerRole")})
	_, err = wc.DescribeStream(ctx, &dynamodbstreams.DescribeStreamInput{StreamArn: ls.Streams[0].StreamArn})
	denied(t, err, "User: arn:aws:sts::000000000000:assumed-role/WorkerRole/local is not authorized to perform: dynamodb:DescribeStream on resource: "+
		*ls.Streams[0].StreamArn+" because no identity-based policy allows the dynamodb:DescribeStream action")
}

func TestProxyKinesis(t *testing.T) {
	k := kinesistest.New(t, 1)
	p := proxyFor(t, k.Endpoint, "conns", k.Stream)
	ctx := context.Background()
	c := kinesis.New(kinesis.Options{Region: "us-east-1", BaseEndpoint: aws.String(p.Endpoint()), Credentials: creds("WorkerRole")})
	rec := []ktypes.PutRecordsRequestEntry{{Data: []byte("x"), PartitionKey: aws.String("k")}}
	if _, err := c.PutRecords(ctx, &kinesis.PutRecordsInput{StreamName: &k.Stream, Records: rec}); err != nil {
		t.Fatalf("allowed PutRecords: %v", err)
	}
	_, err := c.DescribeStreamSummary(ctx, &kinesis.DescribeStreamSummaryInput{StreamName: &k.Stream})
	denied(t, err, "User: arn:aws:sts::000000000000:assumed-role/WorkerRole/local is not authorized to perform: kinesis:DescribeStreamSummary on resource: "+
		"arn:aws:kinesis:us-east-1:000000000000:stream/"+k.Stream+" because no identity-based policy allows the kinesis:DescribeStreamSummary action")
	if ds := p.Denials(); len(ds) != 1 || !strings.HasPrefix(ds[0].Action, "kinesis:") {
		t.Errorf("denials %+v", ds)
	}
}
