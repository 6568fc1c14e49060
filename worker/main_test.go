package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/sockfleet/sockfleet/shared/lease"
	"github.com/sockfleet/sockfleet/shared/local/ddbtest"
	"github.com/sockfleet/sockfleet/shared/local/demoupstream"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/shared/wakeup"
)

// The test binary doubles as the worker binary when this variable is set, so the
// test runs the real main: environment, wiring, signals, exit code.
const beWorker = "SOCKFLEET_TEST_BE_WORKER"

func TestMain(m *testing.M) {
	if os.Getenv(beWorker) != "" {
		main()
		os.Exit(0)
	}
	ddbtest.Main(m)
}

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func TestProcessStreamsAndDrainsOnSIGTERM(t *testing.T) {
	e := ddbtest.New(t)
	up, err := demoupstream.Listen("127.0.0.1:0", demoupstream.Config{Rate: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	ctx := context.Background()
	// Free, with the mark the reconciler's sweep leaves on a connection nobody took,
	// an hour old: what the start-up pass takes.
	p1 := codec.EncodeConnection(codec.Connection{ID: "p1", DesiredState: schema.Started, WSURL: up.URL("p1")})
	p1[schema.AttrUnheldSince] = codec.N(time.Now().Add(-time.Hour).UnixMilli())
	if _, err := e.DB.PutItem(ctx, &dynamodb.PutItemInput{TableName: &e.Table, Item: p1}); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	secret := "process-test-secret-0123"
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), e.Environ()...)
	cmd.Env = append(cmd.Env, beWorker+"=1",
		schema.EnvTable+"="+e.Table, schema.EnvWorkerID+"=proc", schema.EnvListenAddr+"="+addr,
		schema.EnvLease+"=3s", schema.EnvRenewInterval+"=400ms", schema.EnvRenewDeadline+"=2s",
		schema.EnvSkewMargin+"=500ms", schema.EnvSeqPath+"=seq", schema.EnvWakeupSecret+"="+secret)
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	first, last := make(chan string, 1), make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		var l string
		for n := 0; sc.Scan(); n++ {
			l = sc.Text()
			if n == 0 {
				first <- l
			}
		}
		last <- l
	}()

	// The start-up pass takes the unowned STARTED connection; the sink is stdout.
	select {
	case l := <-first:
		if !strings.Contains(l, `"conn":"p1","seq":1,`) {
			t.Fatalf("first stdout line %q", l)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no message on stdout")
	}
	// The health check subcommand sees a healthy worker.
	hc := exec.Command(os.Args[0], "healthcheck")
	hc.Env = append(os.Environ(), beWorker+"=1", schema.EnvListenAddr+"="+addr)
	if out, err := hc.CombinedOutput(); err != nil {
		t.Fatalf("healthcheck: %v %s", err, out)
	}
	// A wakeup reaches it (already owned).
	resp, err := (&wakeup.Client{Secret: []byte(secret)}).Send(ctx, addr,
		wakeup.Request{Conns: []wakeup.Conn{{ID: "p1", LeaseVersion: 1, Reason: wakeup.NeedsOwner}}})
	if err != nil || resp.Results[0].Result != wakeup.AlreadyOwned {
		t.Fatalf("wakeup: %+v %v", resp, err)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	lastLine := <-last
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit: %v", err)
	}
	store, _ := lease.New(e.DB, lease.Config{Table: e.Table})
	c, err := store.Get(ctx, "p1")
	if err != nil {
		t.Fatal(err)
	}
	if c.LeaseExpiresAtMs != 0 || !strings.Contains(lastLine, fmt.Sprintf(`"seq":%d,`, c.LastSeq)) {
		t.Fatalf("after SIGTERM: item %+v, last line %q", c, lastLine)
	}
	// The stopped worker fails its health check.
	hc = exec.Command(os.Args[0], "healthcheck")
	hc.Env = append(os.Environ(), beWorker+"=1", schema.EnvListenAddr+"="+addr)
	hc.Stderr = io.Discard
	if hc.Run() == nil {
		t.Fatal("healthcheck passed with no worker running")
	}
}

// TestCheckConfig: checkconfig accepts a valid environment and names the variable of
// a bad one, as a start would, without starting anything.
func TestCheckConfig(t *testing.T) {
	base := map[string]string{schema.EnvWakeupSecret: "check-config-secret-0123", schema.EnvWorkerID: "w1"}
	for _, tc := range []struct {
		name, key, value string
		code             int
		want             string
	}{
		{"valid", schema.EnvResume, "none", 0, ""},
		{"bad duration", schema.EnvLease, "banana", 2, schema.EnvLease},
		{"bad sink", schema.EnvSink, "ftp://x", 2, "sink"},
		{"bad mode", schema.EnvMode, "sometimes", 2, schema.EnvMode},
		{"allowed sinks", schema.EnvSinksAllowed, "feeds-a, arn:aws:kinesis:eu-west-1:123456789012:stream/feeds-b file:/tmp/x.jsonl", 0, ""},
		{"bad allowed sink", schema.EnvSinksAllowed, "feeds-a,feeds/b", 2, schema.EnvSinksAllowed + ": feeds/b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{tc.key: tc.value}
			for k, v := range base {
				env[k] = v
			}
			var out strings.Builder
			code := checkConfig(func(k string) string { return env[k] }, &out)
			if code != tc.code || !strings.Contains(strings.ToLower(out.String()), strings.ToLower(tc.want)) {
				t.Errorf("checkconfig with %s=%s: exit %d, %q; want exit %d naming %q", tc.key, tc.value, code, out.String(), tc.code, tc.want)
			}
		})
	}
}
