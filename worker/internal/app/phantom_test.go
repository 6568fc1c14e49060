package app

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/shared/wakeup"
)

// putPhantom writes connection id as a console "Create item" naming owner would:
// a whole item with a lease nobody acquired.
func (e *env) putPhantom(id, owner string, version int64, state schema.State) {
	e.t.Helper()
	e.up.Touch(id)
	c := codec.Connection{ID: id, DesiredState: state, WSURL: e.up.URL(id), LeaseOwner: owner, LeaseVersion: version,
		LeaseExpiresAtMs: schema.LeaseHeldByMember, Status: "streaming", LastSeq: 0}
	_, err := e.db.DB.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: &e.db.Table, Item: codec.EncodeConnection(c)})
	if err != nil {
		e.t.Fatal(err)
	}
}

// Items that name a live worker which runs no session for them (phantom leases: a
// console "Create item", a lost handoff commit, an ambiguous acquire) are found by
// that worker's reconciliation of the lease_owner index at its backstop pass: a
// STARTED one is streamed once it has named the worker unchanged for the quarantine
// (so that a holder it displaced has stopped), a STOPPED one is released at once.
func TestPhantomLeasesAreTakenUp(t *testing.T) {
	e := newEnv(t, rate)
	const backstop = 2 * interval
	w := e.worker("w1", opts{backstop: backstop})
	written := time.Now()
	phantomVersion := time.Now().UnixMilli()
	e.putPhantom("c1", "w1", phantomVersion, schema.Started)
	e.putPhantom("c2", "w1", time.Now().UnixMilli(), schema.Stopped)
	took := waitFor(t, 10*time.Second, "phantom streamed", func() bool { return w.sink.count("c1") >= 10 })
	// The quarantine (owner/reconcile.go: backstop + 3 intervals, or the fence
	// deadline + 1 interval) from the first sighting, which comes within one backstop
	// pass (+ one tick) of the write, adopted at the first tick after it; plus the
	// dial.
	quarantine := max(backstop+3*interval, deadline+interval)
	if limit := quarantine + backstop + 2*interval + time.Second; took > limit {
		t.Fatalf("phantom streamed %s after it was written; want within %s", took, limit)
	}
	if took < quarantine {
		t.Fatalf("phantom streamed %s after it was written, before the quarantine %s", took, quarantine)
	}
	if c := e.get("c1"); c.LeaseOwner != "w1" || !strings.Contains(strings.Join(w.Manager.Owned(), ","), "c1") {
		t.Fatalf("c1 %+v, owned %v", c, w.Manager.Owned())
	}
	// Taken up under a new version: no earlier session delivered under it.
	if c := e.get("c1"); c.LeaseVersion <= phantomVersion {
		t.Fatalf("adopted at version %d, not above the phantom's %d", c.LeaseVersion, phantomVersion)
	}
	if vs := w.sink.versions("c1"); vs[phantomVersion] != 0 {
		t.Fatalf("delivered under the phantom's own version: %v", vs)
	}
	waitFor(t, time.Until(written.Add(3*backstop+2*time.Second)), "STOPPED phantom released", func() bool { return !e.get("c2").Owned() })
	if e.up.Stats("c2").Clients != 0 || w.sink.count("c2") != 0 {
		t.Fatal("a STOPPED phantom was streamed")
	}
	if w.Metrics.ReconcileQueries.Load() == 0 || w.Metrics.PhantomsAdopted.Load() != 1 || w.Metrics.PhantomsReleased.Load() != 1 {
		t.Fatalf("queries %d, adopted %d, released %d", w.Metrics.ReconcileQueries.Load(), w.Metrics.PhantomsAdopted.Load(),
			w.Metrics.PhantomsReleased.Load())
	}
	t.Logf("phantom streamed after %s (backstop %s); %d index queries, %.1f read units",
		took, backstop, w.Metrics.ReconcileQueries.Load(), float64(w.Metrics.ReconcileReadUnits.Load())/1000)
}

// ambiguous is a transport to the table that, once armed, applies the next
// UpdateItem of conn but drops its response, and fails the GetItem that reads it back: an
// acquire that landed, unknown to the worker.
type ambiguous struct {
	conn  string
	mu    sync.Mutex
	armed bool
	gets  int
}

func (a *ambiguous) RoundTrip(r *http.Request) (*http.Response, error) {
	op := r.Header.Get("X-Amz-Target")
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, err
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	mine := bytes.Contains(body, []byte(schema.ConnKey(a.conn)))
	a.mu.Lock()
	if mine && strings.HasSuffix(op, ".GetItem") && a.gets > 0 {
		a.gets--
		a.mu.Unlock()
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	}
	drop := a.armed && mine && strings.HasSuffix(op, ".UpdateItem")
	if drop {
		a.armed = false
	}
	a.mu.Unlock()
	resp, err := http.DefaultTransport.RoundTrip(r)
	if err != nil || !drop {
		return resp, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return nil, &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
}

// An acquire whose write landed but whose response and read-back were lost answers
// failed, and the table names the worker: the worker finds its own write after the
// next membership renew and streams it, without waiting for the reconciliation.
func TestAmbiguousAcquireIsTakenUp(t *testing.T) {
	e := newEnv(t, rate)
	tr := &ambiguous{conn: "c1"}
	w := e.worker("w1", opts{transport: tr}) // backstop 1 minute: out of the way
	e.putConn("c1", schema.Started)
	tr.mu.Lock()
	tr.armed, tr.gets = true, 1
	tr.mu.Unlock()
	res := e.wake(w, wakeup.NeedsOwner, 0, "c1")
	if res[0].Result != wakeup.Failed {
		t.Fatalf("ambiguous acquire answered %+v", res[0])
	}
	if c := e.get("c1"); c.LeaseOwner != "w1" {
		t.Fatalf("the acquire did not land: %+v", c)
	}
	took := waitFor(t, 5*time.Second, "streamed", func() bool { return w.sink.count("c1") >= 10 })
	if took > 3*interval+time.Second {
		t.Fatalf("ambiguous acquire taken up after %s; renew every %s", took, interval)
	}
	if w.Metrics.PhantomsAdopted.Load() != 0 {
		t.Fatal("taken up by the reconciliation, not the resolution")
	}
}

// lease_owner set by hand to another live worker. With the version unchanged, the
// holder's next owner write takes its lease back (shared/lease: its own version under
// another owner belongs to no other session), so it never stops and the named worker,
// whose adopt is conditioned on the item still naming it, never delivers. With a
// higher version written too (an image nobody acquired), the holder stops at that
// write (ErrLost) and the named worker adopts the lease after its quarantine under a
// new version. Either way the two never deliver at once.
func TestOwnerHandedToAnotherLiveWorkerNeverOverlaps(t *testing.T) {
	quarantine := max(2*interval+3*interval, deadline+interval)
	t.Run("version unchanged: the holder takes it back", func(t *testing.T) {
		e, l, w1, w2, v1 := handedStart(t)
		e.update("c1", "SET #o = :o", map[string]types.AttributeValue{":o": codec.S("w2")}, map[string]string{"#o": schema.AttrLeaseOwner})
		edited := time.Now()
		took := waitFor(t, 5*time.Second, "c1 naming w1 again", func() bool { return e.get("c1").LeaseOwner == "w1" })
		// Past the named worker's quarantine and the pass that would adopt.
		time.Sleep(time.Until(edited.Add(quarantine + 2*2*interval + 2*interval)))
		if c := e.get("c1"); c.LeaseOwner != "w1" || c.LeaseVersion != v1 {
			t.Fatalf("c1 %s at %d, want w1 at its own version %d", c.LeaseOwner, c.LeaseVersion, v1)
		}
		if n := l.count("c1", "w2"); n != 0 {
			t.Fatalf("w2 delivered %d messages of a lease it never held", n)
		}
		before := l.count("c1", "w1")
		waitFor(t, 5*time.Second, "w1 still streaming", func() bool { return l.count("c1", "w1") >= before+20 })
		if w1.Metrics.LeasesLost.Load() != 0 || w2.Metrics.PhantomsAdopted.Load() != 0 {
			t.Fatalf("w1 leases lost %d, w2 phantoms adopted %d", w1.Metrics.LeasesLost.Load(), w2.Metrics.PhantomsAdopted.Load())
		}
		t.Logf("w1 took its lease back %s after the edit and never stopped", took.Round(time.Millisecond))
	})
	t.Run("higher version: the holder stops, the named worker adopts", func(t *testing.T) {
		e, l, w1, w2, v1 := handedStart(t)
		edited := time.Now()
		e.update("c1", "SET #o = :o, #v = :v", map[string]types.AttributeValue{":o": codec.S("w2"), ":v": codec.N(v1 + 1000)},
			map[string]string{"#o": schema.AttrLeaseOwner, "#v": schema.AttrLeaseVersion})
		took := waitFor(t, 10*time.Second, "w2 streaming", func() bool { return l.count("c1", "w2") >= 20 })
		var lastW1, firstW2 time.Time
		for _, d := range l.get("c1") {
			switch {
			case d.worker == "w1":
				lastW1 = d.at
			case d.worker == "w2" && firstW2.IsZero():
				firstW2 = d.at
				if d.version <= v1+1000 {
					t.Errorf("w2 delivered under version %d, not above the edited %d", d.version, v1+1000)
				}
			}
		}
		if !lastW1.Before(firstW2) {
			t.Fatalf("two deliverers: w1 delivered until %s, w2 from %s", lastW1.Format(time.StampMilli), firstW2.Format(time.StampMilli))
		}
		if firstW2.Sub(edited) < quarantine {
			t.Fatalf("w2 delivered %s after the edit, before its quarantine %s", firstW2.Sub(edited), quarantine)
		}
		if w1.Metrics.LeasesLost.Load() != 1 || w2.Metrics.PhantomsAdopted.Load() != 1 {
			t.Fatalf("w1 leases lost %d, w2 phantoms adopted %d", w1.Metrics.LeasesLost.Load(), w2.Metrics.PhantomsAdopted.Load())
		}
		t.Logf("w1 stopped %s after the edit; w2 delivered from %s after it (%s with nobody delivering); streaming again after %s",
			lastW1.Sub(edited).Round(time.Millisecond), firstW2.Sub(edited).Round(time.Millisecond),
			firstW2.Sub(lastW1).Round(time.Millisecond), took.Round(time.Millisecond))
	})
}

// handedStart starts two handoff workers with a fast backstop, w1 streaming c1, and
// returns them with c1's version.
func handedStart(t *testing.T) (*env, *ledger, *worker, *worker, int64) {
	e := newEnv(t, rate)
	l := &ledger{}
	w1 := e.handoffWorker("w1", l, opts{backstop: 2 * interval})
	w2 := e.handoffWorker("w2", l, opts{backstop: 2 * interval})
	e.putConn("c1", schema.Started)
	if r := e.wake(w1, wakeup.NeedsOwner, 0, "c1"); r[0].Result != wakeup.Acquired {
		t.Fatalf("wake: %+v", r)
	}
	waitFor(t, 5*time.Second, "w1 streaming", func() bool { return l.count("c1", "w1") >= 50 })
	return e, l, w1, w2, e.get("c1").LeaseVersion
}

// A stale released image (no owner, expiry 0, a lower version: the item as it was
// before the holder's acquire) written back while the holder streams, and a worker
// starting right then: its start-up pass must not take the lease, which only looks
// free (the holder takes it back at its next checkpoint); before the pass required
// the reconciler's unheld mark, it did, and both delivered until that checkpoint.
func TestStartupPassLeavesAStaleReleasedImage(t *testing.T) {
	e := newEnv(t, rate)
	var l ledger
	w1 := e.handoffWorker("w1", &l, opts{checkpoint: 3 * time.Second})
	e.putConn("c1", schema.Started)
	if r := e.wake(w1, wakeup.NeedsOwner, 0, "c1"); r[0].Result != wakeup.Acquired {
		t.Fatalf("wake: %+v", r)
	}
	waitFor(t, 5*time.Second, "w1 streaming", func() bool { return l.count("c1", "w1") >= 50 })
	c := e.get("c1")
	stale := codec.EncodeConnection(codec.Connection{ID: "c1", DesiredState: schema.Started, WSURL: c.WSURL,
		LeaseVersion: c.LeaseVersion - 1000, Status: "released"})
	stale[schema.AttrLeaseExpires] = codec.N(0)
	if _, err := e.db.DB.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: &e.db.Table, Item: stale}); err != nil {
		t.Fatal(err)
	}
	w2 := e.handoffWorker("w2", &l, opts{startup: true})
	waitFor(t, 10*time.Second, "c1 named by w1 again, or taken by w2", func() bool {
		return e.get("c1").LeaseOwner == "w1" || w2.Metrics.Acquisitions.Load() != 0
	})
	if n := l.count("c1", "w2"); n != 0 || w2.Metrics.Acquisitions.Load() != 0 {
		t.Fatalf("w2 took the stale image in its start-up pass: %d messages, %d acquisitions", n, w2.Metrics.Acquisitions.Load())
	}
	if w1.Metrics.LeasesLost.Load() != 0 {
		t.Fatal("w1 lost its lease to a stale image")
	}
}
