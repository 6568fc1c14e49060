package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/sockfleet/sockfleet/shared/dynoxide"
	"github.com/sockfleet/sockfleet/shared/fleet"
	"github.com/sockfleet/sockfleet/shared/lease"
	"github.com/sockfleet/sockfleet/shared/schema"
)

// lockedBuffer is written by the fleet while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestRunStreamsDemoConnectionsAndDrainsOnStop runs what `make run` runs, with free
// ports and a temporary folder: the demo connections stream, and stopping drains every
// worker, so the file-backed table, reopened, shows every lease released with its
// checkpoint.
func TestRunStreamsDemoConnectionsAndDrainsOnStop(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the local fleet")
	}
	dir := t.TempDir()
	bins, err := fleet.Build(filepath.Join(dir, "bin"))
	if err != nil {
		t.Fatal(err)
	}
	o := options{
		dir: dir, table: schema.DefaultTableName, bin: filepath.Join(dir, "bin"), rie: bins.RIE,
		dbPort: freePort(t), workers: 2, basePort: freePort(t), demos: 3, rate: 20, sweep: time.Minute,
		lambdaAddr: fmt.Sprintf("127.0.0.1:%d", freePort(t)), upstream: fmt.Sprintf("127.0.0.1:%d", freePort(t)),
	}
	ctx, cancel := context.WithCancel(context.Background())
	var out lockedBuffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, o, &out, slog.New(slog.DiscardHandler)) }()

	db := dynamodb.New(dynamodb.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(fmt.Sprintf("http://127.0.0.1:%d", o.dbPort)),
		Credentials: credentials.NewStaticCredentialsProvider("local", "local", ""),
	})
	store, err := lease.New(db, lease.Config{Table: o.table})
	if err != nil {
		t.Fatal(err)
	}
	// Fleets on one machine take turns (the Lambda emulator's port is fixed), so the
	// clock starts once this one is up and has printed its banner.
	for wait := time.Now().Add(10 * time.Minute); !strings.Contains(out.String(), "sockfleet is running locally"); {
		select {
		case err := <-done:
			t.Fatalf("run ended early: %v\n%s", err, out.String())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(wait) {
			cancel()
			t.Fatal("the local fleet did not start within 10 minutes")
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		owned := 0
		for i := 1; i <= o.demos; i++ {
			if c, err := store.Get(ctx, fmt.Sprintf("demo-%d", i)); err == nil && c.Owned() && c.LastSeq > 0 {
				owned++
			}
		}
		if owned == o.demos {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("run ended early: %v\n%s", err, out.String())
		default:
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("demo connections not streaming with checkpoints after 30s (%d of %d)\n%s", owned, o.demos, out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !strings.Contains(out.String(), "sockfleet is running locally") || !strings.Contains(out.String(), "sockfleet watch") {
		t.Errorf("the banner does not say what runs and what to try:\n%s", out.String())
	}

	cancel() // Ctrl-C
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("stopping took over 60s")
	}

	// The state is on disk: reopen it and find every lease given back with its checkpoint.
	engine, err := dynoxide.Start(dynoxide.Options{Port: o.dbPort, DBPath: filepath.Join(dir, "dynoxide.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer engine.Stop()
	for i := 1; i <= o.demos; i++ {
		c, err := store.Get(context.Background(), fmt.Sprintf("demo-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if c.Owned() || c.LastSeq == 0 || c.Status != "released" {
			t.Errorf("after stop, %s is %+v; want released with its checkpoint", c.ID, c)
		}
	}
}
