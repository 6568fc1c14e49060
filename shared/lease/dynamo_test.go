package lease_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/sockfleet/sockfleet/shared/lease"
)

// dropper is a transport that forwards each request to the engine and then, for the
// selected operations, throws the response away: the write is applied, the caller
// never hears. It can also fail requests outright.
type dropper struct {
	mu   sync.Mutex
	drop map[string]int // operation -> responses left to drop
	fail map[string]int // operation -> requests left to fail with a 500, not forwarded
	down atomic.Bool    // refuse everything without forwarding
	seen atomic.Int64
}

func (d *dropper) RoundTrip(r *http.Request) (*http.Response, error) {
	if d.down.Load() {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	}
	op := r.Header.Get("X-Amz-Target")
	op = op[strings.LastIndex(op, ".")+1:]
	d.mu.Lock()
	fail := d.fail[op]
	if fail > 0 {
		d.fail[op] = fail - 1
	}
	d.mu.Unlock()
	if fail > 0 {
		return &http.Response{StatusCode: 500, Header: http.Header{"Content-Type": {"application/x-amz-json-1.0"}}, Request: r,
			Body: io.NopCloser(strings.NewReader(`{"__type":"com.amazonaws.dynamodb.v20120810#InternalServerError","message":"injected"}`))}, nil
	}
	resp, err := http.DefaultTransport.RoundTrip(r)
	if err != nil {
		return resp, err
	}
	d.mu.Lock()
	n := d.drop[op]
	if n > 0 {
		d.drop[op] = n - 1
	}
	d.mu.Unlock()
	if n > 0 {
		d.seen.Add(1)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return nil, &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
	}
	return resp, nil
}

func TestAmbiguousWritesReportTheTrueOutcome(t *testing.T) {
	for _, attempts := range []int{1, 3} {
		// attempts 1: the SDK gives up at once and the store reads the item back.
		// attempts 3: the SDK retries a write that was applied; the retry's condition
		// fails on our own write, and the store must recognise it as ours.
		t.Run(fmt.Sprintf("sdk-attempts-%d", attempts), func(t *testing.T) {
			f := newFixture(t)
			d := &dropper{drop: map[string]int{}}
			db := f.env.Client(d, func(o *dynamodb.Options) { o.RetryMaxAttempts = attempts })
			s := f.store(db, 0)
			f.put(started("amb"))

			d.drop["UpdateItem"] = 1
			l, err := s.Acquire(f.ctx, "amb", "w1")
			if err != nil {
				t.Fatalf("acquire whose response was dropped: %v", err)
			}
			if c := f.get("amb"); c.LeaseOwner != "w1" || c.LeaseVersion != l.Version || l.Version == 0 {
				t.Fatalf("acquire reported %+v, item is %+v", l, c)
			}

			d.drop["UpdateItem"] = 1
			c, err := s.Renew(f.ctx, l, lease.Progress{LastSeq: 42})
			if err != nil || c.LastSeq != 42 {
				t.Fatalf("renew whose response was dropped: %+v, %v", c, err)
			}

			// A dropped acquire that lost: another worker holds the lease; the
			// store must report ErrHeld, not success.
			other := f.store(f.env.DB, 0)
			f.put(started("amb2"))
			if _, err := other.Acquire(f.ctx, "amb2", "w2"); err != nil {
				t.Fatal(err)
			}
			d.drop["UpdateItem"] = 1
			if _, err := s.Acquire(f.ctx, "amb2", "w1"); !errors.Is(err, lease.ErrHeld) {
				t.Fatalf("dropped losing acquire: %v, want ErrHeld", err)
			}

			d.drop["UpdateItem"] = 1
			if err := s.Release(f.ctx, l, lease.Progress{LastSeq: 43}); err != nil {
				t.Fatalf("release whose response was dropped: %v", err)
			}
			if c := f.get("amb"); c.Owned() || c.LastSeq != 43 {
				t.Fatalf("after release: %+v", c)
			}
			if d.seen.Load() != 4 {
				t.Fatalf("dropped %d responses, want 4", d.seen.Load())
			}
		})
	}
}

// A write that failed before it was applied is ErrUnavailable: the caller keeps its
// lease (renew, release) or knows nobody took it (acquire). It is never reported as
// lost or held, which would make a worker drop a connection it still owns.
func TestFailedWritesAreUnavailableNotLost(t *testing.T) {
	f := newFixture(t)
	d := &dropper{drop: map[string]int{}, fail: map[string]int{}}
	s := f.store(f.env.Client(d, func(o *dynamodb.Options) { o.RetryMaxAttempts = 1 }), 0)
	f.put(started("a"))
	f.put(started("b"))
	d.fail["UpdateItem"] = 1
	if _, err := s.Acquire(f.ctx, "a", "w1"); !errors.Is(err, lease.ErrUnavailable) {
		t.Fatalf("failed acquire: %v, want ErrUnavailable", err)
	}
	l, err := s.Acquire(f.ctx, "b", "w1")
	if err != nil {
		t.Fatal(err)
	}
	d.fail["UpdateItem"] = 1
	if _, err := s.Renew(f.ctx, l, lease.Progress{LastSeq: 5}); !errors.Is(err, lease.ErrUnavailable) {
		t.Fatalf("failed renew: %v, want ErrUnavailable", err)
	}
	d.fail["UpdateItem"] = 1
	if err := s.Release(f.ctx, l, lease.Progress{LastSeq: 5}); !errors.Is(err, lease.ErrUnavailable) {
		t.Fatalf("failed release: %v, want ErrUnavailable", err)
	}
	if c := f.get("b"); c.LeaseOwner != "w1" || c.LastSeq != 7 {
		t.Fatalf("item after failed writes: %+v", c)
	}
	if _, err := s.Renew(f.ctx, l, lease.Progress{LastSeq: 6}); err != nil {
		t.Fatalf("the lease must still be ours: %v", err)
	}
}

func TestUnreachableIsUnavailable(t *testing.T) {
	f := newFixture(t)
	d := &dropper{drop: map[string]int{}}
	s := f.store(f.env.Client(d, func(o *dynamodb.Options) { o.RetryMaxAttempts = 1 }), 0)
	f.put(started("u"))
	l, err := s.Acquire(f.ctx, "u", "w1")
	if err != nil {
		t.Fatal(err)
	}
	d.down.Store(true)
	_, err = s.Renew(f.ctx, l, lease.Progress{LastSeq: 1})
	if !errors.Is(err, lease.ErrUnavailable) {
		t.Fatalf("renew with the table unreachable: %v, want ErrUnavailable", err)
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) {
		t.Errorf("a transport error type leaked through: %T", opErr)
	}
	if _, err := s.Acquire(f.ctx, "u", "w2"); !errors.Is(err, lease.ErrUnavailable) {
		t.Fatalf("acquire with the table unreachable: %v", err)
	}
}

// An acquire whose write landed but whose response and read-back were both lost
// cannot say who holds the lease. It says so with AmbiguousAcquire, carrying the
// stamp that tells the write apart, so the caller can find it later: the item names
// the caller with status "acquired" at that stamp.
func TestAmbiguousAcquireCarriesItsStamp(t *testing.T) {
	f := newFixture(t)
	d := &dropper{drop: map[string]int{"UpdateItem": 1}, fail: map[string]int{"GetItem": 1}}
	s := f.store(f.env.Client(d, func(o *dynamodb.Options) { o.RetryMaxAttempts = 1 }), 0)
	f.put(started("amb"))
	_, err := s.Acquire(f.ctx, "amb", "w1")
	var amb *lease.AmbiguousAcquire
	if !errors.As(err, &amb) || !errors.Is(err, lease.ErrUnavailable) {
		t.Fatalf("acquire with its response and read-back lost: %v, want AmbiguousAcquire wrapping ErrUnavailable", err)
	}
	if c := f.get("amb"); c.LeaseOwner != "w1" || c.Status != lease.StatusAcquired || c.StatusAtMs != amb.StampMs {
		t.Fatalf("item %+v does not show the write stamped %d", c, amb.StampMs)
	}
}
