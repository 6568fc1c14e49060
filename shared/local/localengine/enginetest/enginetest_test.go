package enginetest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sockfleet/sockfleet/shared/local/localengine"
)

// The engine in these tests is this test binary, re-run as a loopback listener.
const portEnv = "SOCKFLEET_ENGINETEST_PORT"

func TestMain(m *testing.M) {
	if port := os.Getenv(portEnv); port != "" {
		l, err := net.Listen("tcp", "127.0.0.1:"+port)
		if err != nil {
			os.Exit(4)
		}
		for {
			c, err := l.Accept()
			if err != nil {
				os.Exit(5)
			}
			c.Close()
		}
	}
	os.Exit(m.Run())
}

func listener() (*localengine.Proc, error) {
	return localengine.Start(localengine.Spec{Name: "fake", Ready: 30 * time.Second, Command: func(port int) *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d", portEnv, port))
		return cmd
	}})
}

// Tests asking at once share one engine, started once; Stop ends it.
func TestEngineStartsOnce(t *testing.T) {
	var starts atomic.Int32
	e := New(func() (*localengine.Proc, error) { starts.Add(1); return listener() })
	var wg sync.WaitGroup
	eps := make([]string, 4)
	for i := range eps {
		wg.Go(func() {
			ep, err := e.Endpoint()
			if err != nil {
				t.Error(err)
			}
			eps[i] = ep
		})
	}
	wg.Wait()
	if n := starts.Load(); n != 1 {
		t.Fatalf("%d starts, want 1", n)
	}
	for _, ep := range eps[1:] {
		if ep != eps[0] {
			t.Fatalf("endpoints %v, want one", eps)
		}
	}
	addr := strings.TrimPrefix(eps[0], "http://")
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("engine not listening: %v", err)
	}
	c.Close()
	e.Stop()
	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Fatal("engine still listening after Stop")
	}
}

// A failed start is not retried: every test of the binary gets its error.
func TestEngineStartError(t *testing.T) {
	var starts atomic.Int32
	boom := errors.New("engine not installed")
	e := New(func() (*localengine.Proc, error) { starts.Add(1); return nil, boom })
	for range 3 {
		if ep, err := e.Endpoint(); ep != "" || !errors.Is(err, boom) {
			t.Fatalf("Endpoint = %q, %v; want the start error", ep, err)
		}
	}
	if n := starts.Load(); n != 1 {
		t.Fatalf("%d starts, want 1", n)
	}
	e.Stop()
}

// Stop before any test asked for the engine does nothing.
func TestStopNeverStarted(t *testing.T) {
	e := New(func() (*localengine.Proc, error) { t.Fatal("started by Stop"); return nil, nil })
	e.Stop()
}

func TestSanitize(t *testing.T) {
	for _, tc := range []struct {
		name string
		max  int
		want string
	}{
		{"TestX/sub_case-1.2", 100, "TestX_sub_case-1.2"},
		{"Test π #3", 100, "Test____3"},
		{"TestLong", 4, "Test"},
	} {
		if got := Sanitize(tc.name, tc.max); got != tc.want {
			t.Errorf("Sanitize(%q, %d) = %q, want %q", tc.name, tc.max, got, tc.want)
		}
	}
}
