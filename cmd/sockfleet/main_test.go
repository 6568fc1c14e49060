package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/sockfleet/sockfleet/shared/local/ddbtest"
	"github.com/sockfleet/sockfleet/shared/local/kinesalite/kinesistest"
	"github.com/sockfleet/sockfleet/shared/registry"
	"github.com/sockfleet/sockfleet/shared/schema"
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

// conn add writes the spec the flags and the spec file describe, exactly as the
// worker's codec reads it, and never prints a header value.
func TestConnAddSpec(t *testing.T) {
	e, cmd := setup(t)
	file := filepath.Join(t.TempDir(), "spec.json")
	if err := os.WriteFile(file, []byte(`{"subprotocols":["v1"],"keepalive":{"message":"{\"type\":\"KeepAlive\"}","interval":"8s"},
		"open_messages":[{"binary":"AQID"}],"start":"earliest"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := cmd("conn", "add", "s1", "wss://up.example/feed", "--spec", file,
		"--header", "Authorization=Bearer {{secret:feeds/token}}", "--header", "X-Literal=lit-value-7",
		"--subprotocol", "v2", "--open-message", `{"type":"subscribe","after":{seq}}`, "--open-expect-field", "type=subscribed",
		"--open-timeout", "5s", "--max-lifetime", "23h", "--idle-timeout", "5m", "--idle-reconnect", "--seq-reset", "halt")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "lit-value-7") || strings.Contains(out, "{{secret") || !strings.Contains(out, "headers Authorization,X-Literal") {
		t.Fatalf("output %q", out)
	}
	res, err := e.DB.GetItem(context.Background(), &dynamodb.GetItemInput{TableName: &e.Table,
		Key: codec.Item{schema.AttrPK: codec.S(schema.ConnKey("s1"))}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := codec.DecodeConnection(res.Item)
	if err != nil {
		t.Fatal(err)
	}
	sp := c.Spec
	if sp.Headers["Authorization"] != "Bearer {{secret:feeds/token}}" || len(sp.Subprotocols) != 1 || sp.Subprotocols[0] != "v2" ||
		len(sp.OpenMessages) != 1 || sp.OpenMessages[0].ExpectField != "type=subscribed" || sp.OpenMessages[0].Timeout != 5*time.Second ||
		sp.Keepalive == nil || sp.Keepalive.Interval != 8*time.Second || sp.MaxLifetime != 23*time.Hour || sp.Start != "earliest" ||
		!sp.IdleReconnect || sp.SeqReset != "halt" {
		t.Fatalf("stored spec %+v", sp)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--header", "NoEquals"}, "--header wants NAME=VALUE"},
		{[]string{"--open-expect", "x"}, "must follow an --open-message"},
		{[]string{"--max-lifetime", "soon"}, `--max-lifetime "soon"`},
		{[]string{"--max-lifetime", "10ms"}, "max_lifetime: 10ms: at least 1s"},
		{[]string{"--keepalive", "ping"}, "keepalive: interval 0s"},
		{[]string{"--header", "Sec-WebSocket-Protocol=v2"}, "set by the WebSocket handshake"},
		{[]string{"--start", "newest"}, `start: "newest"`},
		{[]string{"--frobnicate", "1"}, "unknown flag --frobnicate"},
		{[]string{"--spec", file + ".missing"}, "--spec"},
		{[]string{"--seq-reset"}, "--seq-reset needs a value"},
	} {
		args := append([]string{"conn", "add", "bad", "ws://h/x"}, tc.args...)
		if _, err := cmd(args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error with %q", tc.args, err, tc.want)
		}
	}
	bad := filepath.Join(t.TempDir(), "bad.json")
	for doc, want := range map[string]string{
		`{"headers":{"A":1}}`:                 "headers.A: type N, want S",
		`{"open_messages":[{"binary":"%%"}]}`: "not base64",
		`{"colour":"red"}`:                    `unknown field "colour"`,
		`[1]`:                                 "not a JSON object",
	} {
		if err := os.WriteFile(bad, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := cmd("conn", "add", "bad", "ws://h/x", "--spec", bad); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("spec %s: %v, want %q", doc, err, want)
		}
	}
	// Nothing was written for any refused add.
	res, err = e.DB.GetItem(context.Background(), &dynamodb.GetItemInput{TableName: &e.Table,
		Key: codec.Item{schema.AttrPK: codec.S(schema.ConnKey("bad"))}})
	if err != nil || res.Item != nil {
		t.Fatalf("a refused add wrote %v (%v)", res.Item, err)
	}
}

// A --spec file may carry token_request and snapshot; the output names the requests
// (query redacted), never a header value or the body.
func TestConnAddTokenAndSnapshotSpec(t *testing.T) {
	e, cmd := setup(t)
	file := filepath.Join(t.TempDir(), "spec.json")
	if err := os.WriteFile(file, []byte(`{"token_request":{"method":"POST","url":"https://api.example.com/bullet?sig=q-secret-4",
		"headers":{"X-Key":"lit-key-9"},"body":"body-8","expires":"data.expires_in"},
		"seq_path":"sequence","snapshot":{"url":"https://api.example.com/book","seq_path":"sequence","on_gap":"resync"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := cmd("conn", "add", "k1", "{{token:data.endpoint}}?token={{token:data.token}}", "--spec", file)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "token_request POST https://api.example.com/bullet?REDACTED") || !strings.Contains(out, "snapshot GET https://api.example.com/book") {
		t.Fatalf("output %q", out)
	}
	for _, v := range []string{"q-secret-4", "lit-key-9", "body-8"} {
		if strings.Contains(out, v) {
			t.Fatalf("output %q shows %s", out, v)
		}
	}
	res, err := e.DB.GetItem(context.Background(), &dynamodb.GetItemInput{TableName: &e.Table,
		Key: codec.Item{schema.AttrPK: codec.S(schema.ConnKey("k1"))}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := codec.DecodeConnection(res.Item)
	if err != nil || c.Spec.TokenRequest == nil || c.Spec.Snapshot == nil || c.Spec.Snapshot.OnGap != schema.OnGapResync {
		t.Fatalf("stored %+v, %v", c.Spec, err)
	}
}
