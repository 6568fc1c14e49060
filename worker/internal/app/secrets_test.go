package app

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/shared/wakeup"
)

// The whole path of the attack: an item written to the table names a secret in a
// header and points ws_url at a listener the writer controls. The worker acquires it,
// never connects to the listener, and the item says status invalid naming the
// secret and the host, never the value. A connection on the same worker whose secret
// allows its upstream streams.
func TestTableWriterCannotSendASecretElsewhere(t *testing.T) {
	const value = "prod-db-pass-2290"
	e := newEnv(t, rate)
	file := filepath.Join(t.TempDir(), "secrets.json")
	if err := os.WriteFile(file, []byte(`{
		"db": {"value": "`+value+`", "allowed_hosts": ["db-feed.example.com"]},
		"feed": {"value": "feed-token-1", "allowed_hosts": ["127.0.0.1"]}
	}`), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	accepted := 0
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			accepted++
			mu.Unlock()
			c.Close()
		}
	})
	defer func() { ln.Close(); wg.Wait() }()

	put := func(id, url string, hdr string) {
		t.Helper()
		e.up.Touch(id)
		_, err := e.db.DB.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: &e.db.Table,
			Item: codec.EncodeConnection(codec.Connection{ID: id, DesiredState: schema.Started, WSURL: url,
				Spec: schema.Spec{Headers: map[string]string{"Authorization": hdr}}})})
		if err != nil {
			t.Fatal(err)
		}
	}
	put("steal", "ws://"+ln.Addr().String()+"/x", "Bearer {{secret:db}}")
	put("good", e.up.URL("good"), "Bearer {{secret:feed}}")
	w := e.worker("w1", opts{secrets: file})
	for _, r := range e.wake(w, wakeup.NeedsOwner, 0, "steal", "good") {
		if r.Result != wakeup.Acquired {
			t.Fatalf("wake: %+v", r)
		}
	}
	waitFor(t, 5*time.Second, "status invalid on the item", func() bool { return e.get("steal").Status == schema.StatusInvalid })
	waitFor(t, 5*time.Second, "the allowed connection streaming", func() bool { return w.sink.count("good") >= 20 })
	c := e.get("steal")
	if !strings.Contains(c.StatusError, "secret db") || !strings.Contains(c.StatusError, ln.Addr().String()) ||
		strings.Contains(c.StatusError, value) {
		t.Fatalf("status_error %q: want the secret and the host, not the value", c.StatusError)
	}
	if n := w.sink.count("steal"); n != 0 {
		t.Fatalf("%d messages delivered for the refused connection", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if accepted != 0 {
		t.Fatalf("the worker connected to the table writer's listener %d times", accepted)
	}
}
