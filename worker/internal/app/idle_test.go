package app

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/shared/wakeup"
	"github.com/sockfleet/sockfleet/worker/internal/metrics"
)

// lockedBuffer collects the worker's EMF lines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// lastGauge is the last value of EMF metric name written, and whether there was one.
func (b *lockedBuffer) lastGauge(t *testing.T, name string) (float64, bool) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	v, ok := 0.0, false
	sc := bufio.NewScanner(bytes.NewReader(b.buf.Bytes()))
	for sc.Scan() {
		var line map[string]any
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("EMF line %q: %v", sc.Text(), err)
		}
		if x, has := line[name].(float64); has {
			v, ok = x, true
		}
	}
	return v, ok
}

func (e *env) putFar(id string, lastSeq int64, sp schema.Spec) {
	e.t.Helper()
	e.up.Touch(id)
	_, err := e.db.DB.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: &e.db.Table,
		Item: codec.EncodeConnection(codec.Connection{ID: id, DesiredState: schema.Started, WSURL: e.up.URL(id), LastSeq: lastSeq, Spec: sp})})
	if err != nil {
		e.t.Fatal(err)
	}
}

// A resume point the upstream never reaches (an upstream that restarted its
// numbering far below the checkpoint) ends in status idle under the fleet's
// idle_timeout, on a connection whose item sets none: written to the item once for
// the episode, and seen by the fleet alarm's EMF gauge. A connection's own
// idle_timeout overrides the fleet's.
func TestFleetIdleTimeoutEndsAnUnreachedResumePoint(t *testing.T) {
	e := newEnv(t, rate) // the feed's head moves at 200/s, far below the resume point
	const far = 1_000_000_000
	e.putFar("far", far, schema.Spec{})
	e.putFar("own", far, schema.Spec{IdleTimeout: time.Hour})
	emf := &lockedBuffer{}
	w := e.worker("w1", opts{idle: time.Second, stderr: emf})
	for _, r := range e.wake(w, wakeup.NeedsOwner, 0, "far", "own") {
		if r.Result != wakeup.Acquired {
			t.Fatalf("wake: %+v", r)
		}
	}
	waitFor(t, 5*time.Second, "status idle in the item", func() bool { return e.get("far").Status == schema.StatusIdle })
	c := e.get("far")
	if !strings.Contains(c.StatusError, "asked to resume after 1000000000") {
		t.Fatalf("status_error %q", c.StatusError)
	}
	if got := e.up.Stats("far").Connects; got != 1 {
		t.Fatalf("%d connects: the fleet default must not reconnect", got)
	}
	waitFor(t, 5*time.Second, "the idle gauge in EMF", func() bool {
		v, ok := emf.lastGauge(t, schema.MetricIdle)
		return ok && v == 1
	})
	if v, ok := emf.lastGauge(t, schema.MetricQuotaWaiting); !ok || v != 0 {
		t.Fatalf("quota gauge %v (written %v)", v, ok)
	}

	// Once per idle episode: several idle checks and checkpoint rounds later, the item
	// was not written again (idle costs nothing per connection-hour). The worker's
	// checkpoint count covers "own" too, whose one write of its streaming status may
	// land late on a loaded machine: count from after it.
	waitFor(t, 5*time.Second, "own's status written", func() bool { return e.get("own").Status == "streaming" })
	n0, before := w.Metrics.Checkpoints.Load(), e.get("far")
	time.Sleep(3 * time.Second) // three idle_timeouts, 7 checkpoint intervals
	if n := w.Metrics.Checkpoints.Load(); n != n0 {
		t.Fatalf("%d checkpoints while idle", n-n0)
	}
	if after := e.get("far"); after.StatusAtMs != before.StatusAtMs || after.Status != schema.StatusIdle {
		t.Fatalf("idle item rewritten: %+v then %+v", before, after)
	}
	if got := w.Metrics.Idle.Load(); got != 1 {
		t.Fatalf("%d idle episodes, want 1", got)
	}
	if c := e.get("own"); c.Status != "streaming" {
		t.Fatalf("own idle_timeout 1h: status %q %q", c.Status, c.StatusError)
	}
}

// The gauges go out once per renew interval, and the loop ends with its context.
func TestGaugesEveryRenewInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf lockedBuffer
		a := &App{Metrics: new(metrics.Counters), emf: &metrics.EMF{W: &buf}}
		a.cfg.RenewInterval = 3 * time.Second
		a.Metrics.IdleNow.Store(4)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { a.emitGauges(ctx); close(done) }()
		time.Sleep(10*time.Second - time.Millisecond) // ticks at 3, 6 and 9 s
		synctest.Wait()
		cancel()
		<-done
		buf.mu.Lock()
		lines := bytes.Count(buf.buf.Bytes(), []byte("\n"))
		buf.mu.Unlock()
		if v, ok := buf.lastGauge(t, schema.MetricIdle); lines != 3 || !ok || v != 4 {
			t.Fatalf("%d lines in 10s, idle %v (%v), want 3 lines of 4", lines, v, ok)
		}
	})
}

// A spec edit on an idle connection (no data, so no checkpoint ever reads the item,
// and no stream record wakes the owner: the filters pass no spec edit) is applied
// by the backstop read: the owner releases it to restart with the new spec.
func TestSpecEditOnIdleConnectionIsApplied(t *testing.T) {
	e := newEnv(t, 0) // the upstream never sends
	e.putConn("c1", schema.Started)
	w := e.worker("w1", opts{idle: time.Second, backstop: 2 * interval})
	if r := e.wake(w, wakeup.NeedsOwner, 0, "c1"); r[0].Result != wakeup.Acquired {
		t.Fatalf("wake: %+v", r)
	}
	waitFor(t, 5*time.Second, "status idle in the item", func() bool { return e.get("c1").Status == schema.StatusIdle })
	// The operator fixes the subscription in the console.
	e.update("c1", "SET #k = :v", map[string]types.AttributeValue{":v": codec.S("10m")},
		map[string]string{"#k": schema.AttrMaxLifetime})
	waitFor(t, 5*time.Second, "released to restart with the new spec", func() bool {
		c := e.get("c1")
		return c.LeaseExpiresAtMs == 0 && c.Status == "restarting"
	})
}
