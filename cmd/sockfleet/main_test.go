package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/sockfleet/sockfleet/shared/ddb/ddbtest"
	"github.com/sockfleet/sockfleet/shared/kinesalite/kinesistest"
	"github.com/sockfleet/sockfleet/shared/registry"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

func TestMain(m *testing.M) {
	code := m.Run()
	ddbtest.Stop()
	kinesistest.Stop()
	os.Exit(code)
}

// cmd runs the CLI as a user would, through the standard AWS environment settings.
func setup(t *testing.T) (*ddbtest.Env, func(args ...string) (string, error)) {
	e := ddbtest.New(t)
	for _, kv := range e.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	return e, func(args ...string) (string, error) {
		var out bytes.Buffer
		err := run(context.Background(), args, e.Table, &out)
		return out.String(), err
	}
}

func TestConnectionLifecycle(t *testing.T) {
	e, cmd := setup(t)
	steps := []struct {
		args []string
		want string // in the output, or in the error if fails
		fail bool
	}{
		{[]string{"conn", "add", "c1", "ws://127.0.0.1:9/streams/c1"}, "added c1 (STARTED)", false},
		{[]string{"conn", "add", "c2", "wss://up.example/x", "--stopped"}, "added c2 (STOPPED)", false},
		{[]string{"conn", "add", "c1", "ws://h/x"}, "already exists", true},
		{[]string{"conn", "add", "c3", "http://h/x"}, "scheme must be ws or wss", true},
		{[]string{"conn", "add", "CONN#c3", "ws://h/x"}, "'#'", true},
		{[]string{"conn", "start", "nope"}, "no connection nope", true},
		{[]string{"conn", "stop", "c1"}, "c1: desired_state = STOPPED", false},
		{[]string{"conn", "start", "c2"}, "c2: desired_state = STARTED", false},
		{[]string{"conn", "url", "c2", "ws://"}, "no host", true},
		{[]string{"conn", "url", "c2", "wss://other.example/y"}, "c2: ws_url = wss://other.example/y", false},
		{[]string{"conn", "rm", "nope"}, "no connection nope", true},
		{[]string{"conn", "rm", "c1"}, "removed c1", false},
		{[]string{"conn", "frobnicate"}, "unknown command", true},
		{[]string{"conn", "add", "only-id"}, "conn add ID URL", true},
	}
	for _, s := range steps {
		out, err := cmd(s.args...)
		got := out
		if err != nil {
			got = err.Error()
		}
		if (err != nil) != s.fail || !strings.Contains(got, s.want) {
			t.Fatalf("%v: out=%q err=%v; want fail=%v and %q", s.args, out, err, s.fail, s.want)
		}
	}
	out, err := cmd("conn", "ls")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "c2") || !strings.Contains(out, "STARTED") || strings.Contains(out, "c1 ") {
		t.Fatalf("ls:\n%s", out)
	}
	// An operator's bad console edit shows up, and does not break the listing.
	bad := codec.EncodeConnection(codec.Connection{ID: "bad", DesiredState: "PAUSED", WSURL: "ws://h/x"})
	if _, err := e.DB.PutItem(context.Background(), putInput(e.Table, bad)); err != nil {
		t.Fatal(err)
	}
	out, err = cmd("conn", "ls")
	if err != nil || !strings.Contains(out, "INVALID: connection bad: invalid desired_state \"PAUSED\"") {
		t.Fatalf("ls with a bad item: %v\n%s", err, out)
	}
}

func TestWorkersListing(t *testing.T) {
	e, cmd := setup(t)
	r := registry.Registry{DB: e.DB, Table: e.Table}
	now := time.Now()
	_ = r.Put(context.Background(), codec.Worker{ID: "w-live", Addr: "127.0.0.1:1", Capacity: 10, Load: 3, HeartbeatExpiresAtMs: now.Add(time.Minute).UnixMilli()})
	_ = r.Put(context.Background(), codec.Worker{ID: "w-dead", Addr: "127.0.0.1:2", Capacity: 10, HeartbeatExpiresAtMs: now.Add(-time.Minute).UnixMilli()})
	out, err := cmd("workers")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "w-live") || !strings.Contains(out, "3/10") || !strings.Contains(out, "LAPSED") {
		t.Fatalf("workers:\n%s", out)
	}
}

func TestUnreachableEndpointAndMissingTable(t *testing.T) {
	_, cmd := setup(t)
	if err := run(context.Background(), []string{"conn", "ls"}, "no-such-table", &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "table no-such-table not found") {
		t.Fatalf("missing table: %v", err)
	}
	t.Setenv("AWS_ENDPOINT_URL_DYNAMODB", "http://127.0.0.1:1")
	_, err := cmd("conn", "ls")
	if err == nil || !strings.Contains(err.Error(), "cannot reach DynamoDB") {
		t.Fatalf("unreachable endpoint: %v", err)
	}
	if _, err := cmd("watch", "--interval", "1ms"); !errors.Is(err, errUsage) {
		t.Fatalf("bad interval: %v", err)
	}
}

func putInput(table string, it codec.Item) *dynamodb.PutItemInput {
	return &dynamodb.PutItemInput{TableName: &table, Item: it}
}
