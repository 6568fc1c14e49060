package stream

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

func TestParseQuota(t *testing.T) {
	q, err := ParseQuota("300/5m")
	if err != nil || q.N != 300 || q.W != 5*time.Minute {
		t.Fatalf("ParseQuota = %+v, %v", q, err)
	}
	if q, err := ParseQuota(""); q != nil || err != nil {
		t.Fatalf("empty: %+v, %v", q, err)
	}
	for _, bad := range []string{"300", "x/5m", "0/5m", "-1/5m", "300/", "300/-5m", "300/soon", "200000/1s"} {
		if _, err := ParseQuota(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// In no window of W are more than N dials admitted per host, other hosts are not
// held back, and the last of 2N+1 waiting dials is admitted 2W after the first.
func TestQuotaNeverExceedsItsWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := &Quota{N: 5, W: time.Minute}
		start := time.Now()
		var mu sync.Mutex
		var admitted []time.Time
		var wg sync.WaitGroup
		for range 11 {
			wg.Go(func() {
				done, _, err := q.Wait(context.Background(), "a.example")
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				admitted = append(admitted, time.Now())
				mu.Unlock()
				done() // an instant handshake
			})
		}
		if done, waited, _ := q.Wait(context.Background(), "b.example"); waited {
			t.Error("another host waited")
		} else {
			done()
		}
		wg.Wait()
		for i, a := range admitted {
			n := 0
			for _, b := range admitted {
				if !b.Before(a) && b.Before(a.Add(q.W)) {
					n++
				}
			}
			if n > q.N {
				t.Fatalf("%d dials in the window starting at admission %d", n, i)
			}
		}
		if got := time.Since(start); got != 2*time.Minute {
			t.Fatalf("all admitted after %s, want 2m0s", got)
		}
	})
}

func TestQuotaWaitEndsWithContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := &Quota{N: 1, W: time.Hour}
		done, _, _ := q.Wait(context.Background(), "h")
		done()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if _, waited, err := q.Wait(ctx, "h"); !waited || err == nil {
			t.Fatalf("Wait = %v, %v; want a cancelled wait", waited, err)
		}
	})
}

// A dial holds its slot until it ends, and the window runs from its end: a slow
// handshake cannot make the next window's dials reach the upstream inside this one.
func TestQuotaCountsFromTheDialsEnd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := &Quota{N: 1, W: time.Minute}
		start := time.Now()
		done, _, _ := q.Wait(context.Background(), "h")
		admitted := make(chan time.Duration)
		go func() {
			d, _, _ := q.Wait(context.Background(), "h")
			admitted <- time.Since(start)
			d()
		}()
		time.Sleep(10 * time.Second) // the first handshake takes 10 s
		done()
		if got := <-admitted; got != 70*time.Second {
			t.Fatalf("second dial admitted after %s, want 1m10s (a window after the first one ended)", got)
		}
	})
}
