package stream

import (
	"testing"
	"time"

	"github.com/sockfleet/sockfleet/shared/local/demoupstream"
)

func TestBeatsNext(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	for _, c := range []struct {
		name string
		b    beats
		want time.Time
	}{
		{"ping only", beats{ping: at(54)}, at(54)},
		{"keepalive first", beats{ping: at(54), keepalive: at(10)}, at(10)},
		{"pong first", beats{ping: at(54), keepalive: at(10), pong: at(5)}, at(5)},
		{"idle first", beats{ping: at(54), keepalive: at(10), idle: at(2)}, at(2)},
		{"unset duties never due", beats{ping: at(54), keepalive: time.Time{}, pong: time.Time{}, idle: time.Time{}}, at(54)},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := c.b.next(); !got.Equal(c.want) {
				t.Fatalf("next = %s, want %s", got, c.want)
			}
		})
	}
}

// An upstream that sends nothing keeps its socket: the writer's timer pings it, and
// each pong moves the read deadline (PongWait 1 s, pings every 200 ms), so the one
// socket outlives several PongWaits without a redial.
func TestPingsKeepAnIdleSocket(t *testing.T) {
	up := upstream(t, demoupstream.Config{Rate: 0})
	cfg := testConfig(t, &memSink{}, "seq")
	s := New(cfg, "quiet", up.URL("quiet"), 0)
	stop := run(s)
	waitFor(t, 5*time.Second, "connected", func() bool { return up.Stats("quiet").Connects == 1 })
	time.Sleep(3 * cfg.PongWait)
	st := s.Status()
	stop(ErrGraceful)
	if n := up.Stats("quiet").Connects; n != 1 || cfg.Metrics.Reconnects.Load() != 0 {
		t.Fatalf("%d connects, %d reconnects over 3 pong waits of silence, want 1 and 0 (status %+v)",
			n, cfg.Metrics.Reconnects.Load(), st)
	}
	if st.State != "streaming" {
		t.Fatalf("status %+v, want streaming", st)
	}
}
