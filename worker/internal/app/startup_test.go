package app

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sockfleet/sockfleet/shared/schema"
)

// bulkGate is a transport to the table that holds every write to a connection item
// after the first one (the acquire) until the request gives up, as a table swamped by
// a start-up's checkpoints would, and passes everything else. It records when each
// membership renew (an UpdateItem of the worker item) was sent.
type bulkGate struct {
	open   atomic.Bool
	mu     sync.Mutex
	writes map[string]int // connection key: UpdateItem calls seen
	held   int
	renews []time.Time
}

func (g *bulkGate) RoundTrip(r *http.Request) (*http.Response, error) {
	if !strings.HasSuffix(r.Header.Get("X-Amz-Target"), ".UpdateItem") || r.Body == nil {
		return http.DefaultTransport.RoundTrip(r)
	}
	b, err := io.ReadAll(r.Body)
	r.Body.Close()
	if err != nil {
		return nil, err
	}
	r.Body = io.NopCloser(bytes.NewReader(b))
	key, isConn := connKey(b)
	g.mu.Lock()
	if !isConn && bytes.Contains(b, []byte(schema.WorkerPrefix)) {
		g.renews = append(g.renews, time.Now())
	}
	hold := false
	if isConn {
		g.writes[key]++
		hold = g.writes[key] > 1 && !g.open.Load()
		if hold {
			g.held++
		}
	}
	g.mu.Unlock()
	for hold && !g.open.Load() { // until the request gives up or the test opens the gate
		select {
		case <-r.Context().Done():
			return nil, r.Context().Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return http.DefaultTransport.RoundTrip(r)
}

// connKey finds the connection key an UpdateItem body names.
func connKey(body []byte) (string, bool) {
	i := bytes.Index(body, []byte(`"`+schema.ConnPrefix))
	if i < 0 {
		return "", false
	}
	j := bytes.IndexByte(body[i+1:], '"')
	if j < 0 {
		return "", false
	}
	return string(body[i+1 : i+1+j]), true
}

// maxRenewGap is the longest time between two membership renews sent since from.
func (g *bulkGate) maxRenewGap(from time.Time) (time.Duration, int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	var gap time.Duration
	n := 0
	prev := from
	for _, at := range g.renews {
		if at.Before(from) {
			continue
		}
		gap = max(gap, at.Sub(prev))
		prev = at
		n++
	}
	return max(gap, time.Since(prev)), n
}

// Finding (worker-bench at 10,000 connections in stream mode): the membership renew
// shared one loop with the checkpoints, so a checkpoint pass over thousands of
// connections that all changed status at start-up, on a slow table, delayed the next
// renew past the fence deadline, and the worker fenced itself. The renew now has its
// own loop: with every checkpoint held until it times out, passes taking longer than
// the fence deadline, the renews keep their interval and nothing is fenced.
func TestRenewNotDelayedByBulkWrites(t *testing.T) {
	const n = 240 // checkpoint passes of n/32 rounds x interval = 3s, beyond the 2s fence
	e := newEnv(t, 0)
	for i := range n {
		e.putUnheld(fmt.Sprintf("c%03d", i))
	}
	g := &bulkGate{writes: map[string]int{}}
	w := e.worker("w1", opts{max: n, startup: true, transport: g})
	t.Cleanup(func() { g.open.Store(true) }) // before the worker's own clean-up stops it
	waitFor(t, 30*time.Second, "every connection acquired", func() bool { return len(w.Manager.Owned()) == n })
	from := time.Now()
	time.Sleep(3 * deadline)
	gap, renews := g.maxRenewGap(from)
	g.mu.Lock()
	held := g.held
	g.mu.Unlock()
	if held < n {
		t.Fatalf("only %d checkpoints held: the bulk work did not happen", held)
	}
	if f := w.Metrics.SelfFences.Load(); f != 0 {
		t.Fatalf("%d self-fences while checkpoints were slow", f)
	}
	if len(w.Manager.Owned()) != n {
		t.Fatalf("owned %d of %d", len(w.Manager.Owned()), n)
	}
	if gap > interval+deadline/2 || renews < 3 {
		t.Fatalf("longest gap between renews %s (%d renews), interval %s", gap, renews, interval)
	}
	t.Logf("%d checkpoints held; %d renews, longest gap %s", held, renews, gap)
	g.open.Store(true)
	if err := w.stop(); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if c := e.get(fmt.Sprintf("c%03d", i)); c.Owned() {
			t.Fatalf("not released: %+v", c)
		}
	}
}
