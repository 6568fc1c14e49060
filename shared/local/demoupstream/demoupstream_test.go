package demoupstream

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

type frame struct {
	Seq     int64  `json:"seq"`
	TS      int64  `json:"ts"`
	Payload string `json:"payload"`
}

func dial(t *testing.T, url string) *websocket.Conn {
	t.Helper()
	c, _, err := websocket.DefaultDialer.Dial(url, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func readFrame(t *testing.T, c *websocket.Conn) frame {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, data, err := c.ReadMessage()
	if err != nil {
		t.Fatal(err)
	}
	var f frame
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatalf("frame %q: %v", data, err)
	}
	return f
}

func listen(t *testing.T, cfg Config) *Server {
	t.Helper()
	s, err := Listen("127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return s
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestResumeAndPayload(t *testing.T) {
	s := listen(t, Config{Rate: -1, Size: 10})
	c := dial(t, s.URL("a")+"?from=41")
	for want := int64(42); want < 52; want++ {
		f := readFrame(t, c)
		if f.Seq != want || len(f.Payload) != 10 {
			t.Fatalf("got %+v, want seq %d with a 10-byte payload", f, want)
		}
	}
}

func TestRateAndReplayWhileAway(t *testing.T) {
	s := listen(t, Config{Rate: 200, Size: 1})
	s.Touch("r")
	time.Sleep(100 * time.Millisecond) // messages accumulate with nobody connected
	c := dial(t, s.URL("r"))
	if f := readFrame(t, c); f.Seq != 1 {
		t.Fatalf("first seq %d, want 1 (replayed from the buffer)", f.Seq)
	}
	if h := s.Stats("r").Head; h < 10 {
		t.Fatalf("head %d after 100ms at 200/s", h)
	}
}

func TestBufferBoundsResume(t *testing.T) {
	s := listen(t, Config{Rate: 1000, Buffer: 10})
	s.Touch("b")
	time.Sleep(100 * time.Millisecond)
	c := dial(t, s.URL("b"))
	f := readFrame(t, c)
	if f.Seq < 50 {
		t.Fatalf("first seq %d: a resume must not reach back more than the buffer", f.Seq)
	}
}

func TestClientsAndEvents(t *testing.T) {
	s := listen(t, Config{Rate: 0})
	a := dial(t, s.URL("x"))
	b := dial(t, s.URL("x")+"?from=7")
	waitFor(t, "two clients", func() bool { return s.Stats("x").Clients == 2 })
	a.Close()
	waitFor(t, "one client", func() bool { return s.Stats("x").Clients == 1 })
	st := s.Stats("x")
	if st.MaxClients != 2 || st.Connects != 2 {
		t.Fatalf("stats %+v, want max 2 and 2 connects", st)
	}
	s.ResetMax("x")
	if got := s.Stats("x").MaxClients; got != 1 {
		t.Fatalf("max after reset %d, want 1", got)
	}
	var kinds []EventKind
	var froms []int64
	for _, e := range s.Events() {
		kinds = append(kinds, e.Kind)
		if e.Kind == Connect {
			froms = append(froms, e.From)
		}
	}
	if len(kinds) != 3 || kinds[2] != Disconnect || len(froms) != 2 || froms[0]+froms[1] != 7 {
		t.Fatalf("events %v froms %v", kinds, froms)
	}
	_ = b
}

func TestFaults(t *testing.T) {
	s := listen(t, Config{Rate: 1000})
	t.Run("refuse", func(t *testing.T) {
		s.Refuse("f", http.StatusForbidden)
		_, resp, err := websocket.DefaultDialer.Dial(s.URL("f"), nil)
		if err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
			t.Fatalf("dial err %v resp %v, want 403", err, resp)
		}
		if s.Stats("f").Refused != 1 {
			t.Fatal("refusal not counted")
		}
		s.Refuse("f", 0)
		dial(t, s.URL("f")).Close()
	})
	t.Run("drop", func(t *testing.T) {
		c := dial(t, s.URL("d"))
		readFrame(t, c)
		waitFor(t, "connected", func() bool { return s.Stats("d").Clients == 1 })
		if n := s.Drop("d"); n != 1 {
			t.Fatalf("dropped %d", n)
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		for {
			if _, _, err := c.ReadMessage(); err != nil {
				break
			}
		}
	})
	t.Run("close code", func(t *testing.T) {
		c := dial(t, s.URL("p"))
		readFrame(t, c)
		s.CloseWith("p", websocket.ClosePolicyViolation, "go away")
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		var err error
		for err == nil {
			_, _, err = c.ReadMessage()
		}
		if !websocket.IsCloseError(err, websocket.ClosePolicyViolation) {
			t.Fatalf("got %v, want close 1008", err)
		}
	})
	t.Run("garbage", func(t *testing.T) {
		c := dial(t, s.URL("g"))
		readFrame(t, c)
		s.Garbage("g", 1)
		sawGarbage := false
		for i := 0; i < 2000 && !sawGarbage; i++ {
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, data, err := c.ReadMessage()
			if err != nil {
				t.Fatal(err)
			}
			sawGarbage = !json.Valid(data)
		}
		if !sawGarbage {
			t.Fatal("no garbage frame")
		}
	})
	t.Run("stall", func(t *testing.T) {
		c := dial(t, s.URL("s"))
		readFrame(t, c)
		s.Stall("s", true)
		pong := make(chan struct{}, 1)
		c.SetPongHandler(func(string) error { pong <- struct{}{}; return nil })
		if err := c.WriteControl(websocket.PingMessage, nil, time.Now().Add(time.Second)); err != nil {
			t.Fatal(err)
		}
		// Drain what was in flight, then expect silence: no frames, no pong.
		_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		for {
			if _, _, err := c.ReadMessage(); err != nil {
				break
			}
		}
		select {
		case <-pong:
			t.Fatal("a stalled upstream answered a ping")
		default:
		}
	})
}

func TestControlEndpoints(t *testing.T) {
	s := listen(t, Config{Rate: 0})
	base := "http://" + s.Addr()
	post := func(path string) int {
		resp, err := http.Post(base+path, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if c := post("/control/refuse?stream=z&status=503"); c != http.StatusNoContent {
		t.Fatalf("refuse: %d", c)
	}
	_, resp, _ := websocket.DefaultDialer.Dial(s.URL("z"), nil)
	if resp == nil || resp.StatusCode != 503 {
		t.Fatalf("want 503 after /control/refuse, got %v", resp)
	}
	if c := post("/control/accept?stream=z"); c != http.StatusNoContent {
		t.Fatalf("accept: %d", c)
	}
	dial(t, s.URL("z"))
	if c := post("/control/refuse?status=abc"); c != http.StatusBadRequest {
		t.Fatalf("bad status: %d", c)
	}
	r, err := http.Get(base + "/control/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	var stats map[string]Stats
	if err := json.NewDecoder(r.Body).Decode(&stats); err != nil {
		t.Fatal(err)
	}
	if stats["z"].Refused != 1 || stats["z"].Connects != 1 {
		t.Fatalf("stats %+v", stats["z"])
	}
}

// A LiveHead server ignores the resume point: every socket starts at the live head
// whatever it asked for, its frames carry "n" and no "seq", and each socket's
// disconnect event gives the span of numbers it was sent.
func TestLiveHead(t *testing.T) {
	s := listen(t, Config{Rate: 200, Size: 4, LiveHead: true})
	s.Touch("l")
	waitFor(t, "a head of 20", func() bool { return s.Stats("l").Head >= 20 })
	for _, from := range []string{"", "?from=3", "?from=1000000"} {
		head := s.Stats("l").Head
		c := dial(t, s.URL("l")+from)
		var got []int64
		for range 3 {
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, data, err := c.ReadMessage()
			if err != nil {
				t.Fatal(err)
			}
			n, ok := Number(data)
			if !ok || strings.Contains(string(data), `"seq"`) {
				t.Fatalf("frame %s: want a number in n and no seq", data)
			}
			got = append(got, n)
		}
		if got[0] <= head || got[0] > s.Stats("l").Head || got[1] != got[0]+1 || got[2] != got[0]+2 {
			t.Fatalf("from %q: numbers %v at a head of %d: want the live head on, in order", from, got, head)
		}
		c.Close()
	}
	waitFor(t, "no clients", func() bool { return s.Stats("l").Clients == 0 })
	var spans int
	for _, e := range s.Events() {
		if e.Kind != Disconnect {
			continue
		}
		spans++
		if e.FirstSeq == 0 || e.Sent != e.LastSeq-e.FirstSeq+1 {
			t.Fatalf("disconnect %+v: want the span of numbers sent", e)
		}
	}
	if spans != 3 {
		t.Fatalf("%d disconnects, want 3", spans)
	}
	if n, ok := Number(Message(5, 1, 1)); ok {
		t.Fatalf("Number of a seq frame = %d, want none", n)
	}
}

func TestCount(t *testing.T) {
	spans := []Span{{First: 10, Last: 14}, {First: 13, Last: 15}, {First: 20, Last: 21}}
	got := Count(spans, []int64{10, 11, 13, 14, 13, 15, 20, 21, 21})
	if got.Sent != 8 || got.Delivered != 9 || got.Duplicates != 2 || got.Unsent != 4 ||
		len(got.Missing) != 1 || got.Missing[0] != 12 {
		t.Fatalf("tally %+v: want 8 sent, 9 delivered, 2 duplicates, 4 unsent (16-19), 12 missing", got)
	}
	if z := Count(nil, nil); z.Sent != 0 || z.Unsent != 0 || len(z.Missing) != 0 {
		t.Fatalf("empty tally %+v", z)
	}
}
