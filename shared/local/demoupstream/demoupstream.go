// Package demoupstream is a WebSocket server of numbered streams, used as the
// upstream in local runs, end-to-end tests and benchmarks.
//
// A client dials ws://HOST:PORT/streams/{id}?from=N and receives JSON text frames
// {"seq":S,"ts":MS,"payload":"..."} with S = N+1, N+2, … ("from" is the last sequence
// the client already has; absent means 0). Each stream produces messages at Rate per
// second from the moment it is first used, whether or not anyone is connected, and a
// resume may reach back Buffer messages (older requests start at the oldest kept one,
// as a real upstream with a bounded buffer would). Messages are a pure function of
// (stream, seq), so replay costs no memory.
//
// With LiveHead the server is an upstream that cannot replay: it ignores "from" and
// every socket starts at the live head (the next message produced after the
// handshake), and frames carry their number as {"n":N,"ts":MS,"payload":"..."}, with
// no "seq" for a client to align on. A client that loses its place then loses
// messages, and only the numbers in the payloads (Number) show which.
//
// For tests it records connects and disconnects per stream (MaxClients over 1 means
// two clients streamed the same stream at once: double ownership), and it can be told
// to drop clients, close them with a code, refuse handshakes, stall, or send garbage,
// through the Go API or the HTTP control endpoints under /control/.
//
// It also serves an exchange's REST side (token.go): tokens and listenKeys minted
// over POST, a listenKey keepalive, and order-book style snapshots; with
// RequireToken a handshake without a live token is refused with 401.
package demoupstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"
)

// Config configures a Server.
type Config struct {
	// Rate is messages per second per stream. 0: streams are idle (never send);
	// negative: as fast as the client reads.
	Rate float64
	// Size is the payload length in bytes.
	Size int
	// Buffer is how many past messages a resume may reach back. Default 1,000,000.
	Buffer int64
	// ClientTimeout, if set, drops a client that answers no ping for this long, as a
	// real upstream drops a dead peer. Without it a frozen client (a paused process)
	// keeps its socket open and looks connected until TCP gives up.
	ClientTimeout time.Duration
	// Rules, if set, make the server enforce what strict upstreams enforce (see Rules).
	Rules Rules
	// LiveHead: ignore the resume point and stream every socket from the live head,
	// with frames numbered in "n" (see LiveMessage). Needs Rate > 0 to mean anything;
	// with an unbounded or zero rate a socket starts at 1.
	LiveHead bool
	// HandshakeDelay: the server answers a handshake only after this long, as a far
	// upstream's dial takes (TLS, the handshake's round trips).
	HandshakeDelay time.Duration
	// RequireToken: a handshake must carry ?token=T or ?listenKey=K minted by POST
	// /bullet or POST /listenKey and not expired (401 otherwise), and a socket closes
	// when its token lapses (token.go).
	RequireToken bool
	// TokenTTL is how long a minted token lives (and what PUT /listenKey extends it
	// by); default 1 h.
	TokenTTL time.Duration
}

// EventKind names what happened in an Event.
type EventKind string

// Event kinds.
const (
	Connect    EventKind = "connect"
	Disconnect EventKind = "disconnect"
	Refused    EventKind = "refused"
)

// Event is one entry of the connection log.
type Event struct {
	Time     time.Time `json:"time"`
	Stream   string    `json:"stream"`
	Kind     EventKind `json:"kind"`
	From     int64     `json:"from,omitempty"`      // connect: the resume point asked for
	Clients  int       `json:"clients"`             // clients of the stream after the event
	Status   int       `json:"status,omitempty"`    // refused: the HTTP status
	Remote   string    `json:"remote,omitempty"`    // the client's address
	Sent     int64     `json:"sent,omitempty"`      // disconnect: messages sent on that socket
	FirstSeq int64     `json:"first_seq,omitempty"` // disconnect: first sequence sent
	LastSeq  int64     `json:"last_seq,omitempty"`  // disconnect: last sequence sent
}

// Stats is one stream's counters.
type Stats struct {
	Clients    int   `json:"clients"`
	MaxClients int   `json:"max_clients"`
	Connects   int   `json:"connects"`
	Refused    int   `json:"refused"`
	Head       int64 `json:"head"` // last sequence produced so far (-1: unbounded rate)
	// Sockets: handshakes accepted and not yet ended, connected or not (0: every
	// socket's disconnect is in the events).
	Sockets int `json:"sockets"`
}

// Server is the demo upstream. Create it with New; serve it with Listen or use it as
// an http.Handler.
type Server struct {
	cfg Config
	up  websocket.Upgrader
	mux *http.ServeMux

	mu      sync.Mutex
	streams map[string]*stream
	events  []Event
	closed  bool
	refuse  int // status to refuse every handshake with; 0: accept
	// retryAfter is the Retry-After header of every refused handshake; "": none.
	retryAfter string
	wg         sync.WaitGroup

	tokens                                     map[string]*token // token.go
	minted, refreshes, snapshots, expiredClose int

	ln  net.Listener
	hs  *http.Server
	err chan error
}

type stream struct {
	t0       time.Time
	clients  map[*client]bool
	max      int
	connects int
	refused  int
	refuse   int  // status to refuse handshakes with; 0: accept
	stalled  bool // stop reading and writing
	stallCh  chan struct{}
	garbage  int   // frames of garbage to send before the next message
	oversize int   // payload size of the next message, when over 0 (a frame over a client's read limit)
	gen      int   // +1 on every ResetNumbering: clients restart at seq 1
	snapLag  int64 // snapshots lag this far behind the head (token.go)
	skip     int64 // sequences to skip before the next message (a forward gap)
	reset    bool
	sockets  int // handshakes accepted and not yet ended
}

type client struct {
	wmu    sync.Mutex // one writer of data frames at a time
	conn   *websocket.Conn
	stop   chan struct{} // closed to end the client
	once   sync.Once
	remote string
}

func (c *client) end() { c.once.Do(func() { close(c.stop) }) }

// New returns a server.
func New(cfg Config) *Server {
	if cfg.Buffer == 0 {
		cfg.Buffer = 1_000_000
	}
	s := &Server{cfg: cfg, streams: map[string]*stream{}, mux: http.NewServeMux()}
	s.up = websocket.Upgrader{ReadBufferSize: 1024, WriteBufferSize: 4096, WriteBufferPool: &sync.Pool{}}
	if p := cfg.Rules.Subprotocol; p != "" {
		s.up.Subprotocols = []string{p}
	}
	s.mux.HandleFunc("GET /streams/{id}", s.serveStream)
	s.mux.HandleFunc("POST /bullet", s.serveBullet)
	s.mux.HandleFunc("POST /listenKey", s.serveListenKey)
	s.mux.HandleFunc("PUT /listenKey", s.serveKeepalive)
	s.mux.HandleFunc("GET /snapshot/{id}", s.serveSnapshot)
	s.mux.HandleFunc("POST /control/drop", s.ctl(func(id string, q ctlQuery) error { s.Drop(id); return nil }))
	s.mux.HandleFunc("POST /control/close", s.ctl(func(id string, q ctlQuery) error {
		code, err := q.int("code", websocket.ClosePolicyViolation)
		if err == nil {
			s.CloseWith(id, code, q.Get("text"))
		}
		return err
	}))
	s.mux.HandleFunc("POST /control/refuse", s.ctl(func(id string, q ctlQuery) error {
		code, err := q.int("status", http.StatusServiceUnavailable)
		if err == nil {
			s.Refuse(id, code)
		}
		return err
	}))
	s.mux.HandleFunc("POST /control/accept", s.ctl(func(id string, q ctlQuery) error { s.Refuse(id, 0); return nil }))
	s.mux.HandleFunc("POST /control/stall", s.ctl(func(id string, q ctlQuery) error {
		on, err := q.int("on", 1)
		if err == nil {
			s.Stall(id, on != 0)
		}
		return err
	}))
	s.mux.HandleFunc("POST /control/garbage", s.ctl(func(id string, q ctlQuery) error {
		n, err := q.int("n", 1)
		if err == nil {
			s.Garbage(id, n)
		}
		return err
	}))
	s.mux.HandleFunc("GET /control/stats", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, s.AllStats())
	})
	s.mux.HandleFunc("GET /control/events", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, s.Events())
	})
	return s
}

// ServeHTTP serves /streams/{id} and /control/….
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Listen serves on addr ("127.0.0.1:0" picks a port) until Close.
func Listen(addr string, cfg Config) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("demo upstream: %w", err)
	}
	s := New(cfg)
	s.ln = ln
	s.hs = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	s.err = make(chan error, 1)
	go func() { s.err <- s.hs.Serve(ln) }()
	return s, nil
}

// Addr is the listening address (host:port), after Listen.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// URL is the WebSocket URL of stream id, after Listen.
func (s *Server) URL(id string) string { return "ws://" + s.Addr() + "/streams/" + id }

// Close stops listening, ends every client and waits for their goroutines.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	for _, st := range s.streams {
		for c := range st.clients {
			c.end()
		}
	}
	s.mu.Unlock()
	var err error
	if s.hs != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err = s.hs.Shutdown(ctx)
		if serr := <-s.err; !errors.Is(serr, http.ErrServerClosed) && err == nil {
			err = serr
		}
	}
	s.wg.Wait()
	return err
}

// stream returns id's stream, creating it (and starting its clock) on first use.
// Call with s.mu held.
func (s *Server) stream(id string) *stream {
	st := s.streams[id]
	if st == nil {
		st = &stream{t0: time.Now(), clients: map[*client]bool{}, stallCh: make(chan struct{})}
		s.streams[id] = st
	}
	return st
}

// Touch starts id's clock now if it has not started, so messages accumulate for a
// client that connects later.
func (s *Server) Touch(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stream(id)
}

// head is the last sequence produced at now (MaxInt64 for an unbounded rate).
func (s *Server) head(st *stream, now time.Time) int64 {
	switch {
	case s.cfg.Rate < 0:
		return math.MaxInt64
	case s.cfg.Rate == 0:
		return 0
	}
	return int64(now.Sub(st.t0).Seconds() * s.cfg.Rate)
}

// dueAt is when seq is produced on a stream whose clock started at t0.
func (s *Server) dueAt(t0 time.Time, seq int64) time.Time {
	if s.cfg.Rate <= 0 {
		return t0
	}
	return t0.Add(time.Duration(float64(seq) / s.cfg.Rate * float64(time.Second)))
}

// Message returns the frame of seq on stream id; ts is its production time in ms.
func Message(seq, ts int64, size int) []byte { return encode(`{"seq":`, seq, ts, size) }

// LiveMessage is Message as a LiveHead server sends it: the number is "n", not "seq".
func LiveMessage(n, ts int64, size int) []byte { return encode(`{"n":`, n, ts, size) }

func encode(open string, seq, ts int64, size int) []byte {
	b := make([]byte, 0, 48+size)
	b = append(b, open...)
	b = strconv.AppendInt(b, seq, 10)
	b = append(b, `,"ts":`...)
	b = strconv.AppendInt(b, ts, 10)
	b = append(b, `,"payload":"`...)
	c := byte('a' + seq%26)
	for i := 0; i < size; i++ {
		b = append(b, c)
	}
	return append(b, '"', '}')
}

// ProducedAt reads the production time (ts, unix ms) of a Message frame; ok is false
// for any other frame.
func ProducedAt(frame []byte) (ts int64, ok bool) {
	var m struct {
		TS *int64 `json:"ts"`
	}
	if json.Unmarshal(frame, &m) != nil || m.TS == nil {
		return 0, false
	}
	return *m.TS, true
}

// Number reads the number of a frame a LiveHead server sent (LiveMessage's "n");
// ok is false for any other frame.
func Number(frame []byte) (n int64, ok bool) {
	var m struct {
		N *int64 `json:"n"`
	}
	if json.Unmarshal(frame, &m) != nil || m.N == nil {
		return 0, false
	}
	return *m.N, true
}

func (s *Server) serveStream(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	from := int64(0)
	if v := r.URL.Query().Get("from"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			http.Error(w, "from: want a non-negative integer", http.StatusBadRequest)
			return
		}
		from = n
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		http.Error(w, "closing", http.StatusServiceUnavailable)
		return
	}
	st := s.stream(id)
	code := max(st.refuse, s.refuse)
	if code == 0 {
		code = s.cfg.Rules.checkHandshake(r)
	}
	if code == 0 {
		code = s.checkToken(r)
	}
	if code != 0 {
		st.refused++
		s.log(Event{Stream: id, Kind: Refused, Status: code, Clients: len(st.clients), Remote: r.RemoteAddr})
		if s.retryAfter != "" {
			w.Header().Set("Retry-After", s.retryAfter)
		}
		s.mu.Unlock()
		http.Error(w, "refused by test control", code)
		return
	}
	s.wg.Add(1) // under mu, so Close cannot miss it
	st.sockets++
	s.mu.Unlock()
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		st.sockets--
		s.mu.Unlock()
	}()

	if d := s.cfg.HandshakeDelay; d > 0 {
		time.Sleep(d) // a far upstream's dial: the head moves on meanwhile
	}
	conn, err := s.up.Upgrade(w, r, nil)
	if err != nil {
		return // the upgrader has answered
	}
	c := &client{conn: conn, stop: make(chan struct{}), remote: r.RemoteAddr}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		conn.Close()
		return
	}
	st.clients[c] = true
	st.connects++
	st.max = max(st.max, len(st.clients))
	s.log(Event{Stream: id, Kind: Connect, From: from, Clients: len(st.clients), Remote: c.remote})
	s.mu.Unlock()

	stopWatch := s.watchToken(c, tokenOf(r))
	sent, first, last := s.serveClient(id, st, c, from)
	stopWatch()

	s.mu.Lock()
	delete(st.clients, c)
	s.log(Event{Stream: id, Kind: Disconnect, Clients: len(st.clients), Remote: c.remote, Sent: sent, FirstSeq: first, LastSeq: last})
	s.mu.Unlock()
}

// serveClient writes messages after from (LiveHead: from the live head) until the
// client goes away or is ended. A reader goroutine answers pings and notices the
// close. It returns how many messages it sent, and the first and last sequence.
func (s *Server) serveClient(id string, st *stream, c *client, from int64) (sent, first, last int64) {
	var rwg sync.WaitGroup
	defer rwg.Wait()
	defer c.conn.Close()
	c.conn.SetPingHandler(func(data string) error {
		s.mu.Lock()
		stalled := st.stalled
		s.mu.Unlock()
		if stalled {
			return nil // a hung upstream answers nothing
		}
		err := c.conn.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(time.Second))
		if errors.Is(err, websocket.ErrCloseSent) {
			return nil
		}
		return err
	})
	if to := s.cfg.ClientTimeout; to > 0 {
		_ = c.conn.SetReadDeadline(time.Now().Add(to))
		c.conn.SetPongHandler(func(string) error { return c.conn.SetReadDeadline(time.Now().Add(to)) })
		rwg.Go(func() {
			t := time.NewTicker(to / 3)
			defer t.Stop()
			for {
				select {
				case <-c.stop:
					return
				case <-t.C:
					if c.conn.WriteControl(websocket.PingMessage, nil, time.Now().Add(to)) != nil {
						c.end()
						return
					}
				}
			}
		})
	}
	u := newRuled(s.cfg.Rules, c)
	rwg.Go(func() {
		defer c.end()
		for {
			if s.waitUnstalled(st, c) != nil {
				return
			}
			_, data, err := c.conn.ReadMessage()
			if err != nil {
				return
			}
			u.seen(s, data)
		}
	})
	rwg.Go(func() { u.enforce(s) })
	if u.waitSubscribed() != nil {
		return sent, first, last
	}
	s.mu.Lock()
	next := from + 1
	if s.cfg.LiveHead {
		next = 1
		if s.cfg.Rate > 0 {
			next = s.head(st, time.Now()) + 1 // what is produced from now on; never what was
		}
	}
	if h := s.head(st, time.Now()); s.cfg.Rate > 0 && next < h-s.cfg.Buffer {
		next = h - s.cfg.Buffer // older messages are gone
	}
	if st.reset && next > s.head(st, time.Now())+1 {
		next = 1 // a restarted upstream knows nothing of the old numbering: it starts at its oldest
	}
	gen := st.gen
	s.mu.Unlock()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		if s.waitUnstalled(st, c) != nil {
			return sent, first, last
		}
		s.mu.Lock()
		garbage := st.garbage > 0
		if garbage {
			st.garbage--
		}
		if st.gen != gen {
			gen, next = st.gen, 1
		}
		if st.skip > 0 {
			next, st.skip = next+st.skip, 0 // a forward gap: those are never sent
		}
		stallCh, t0 := st.stallCh, st.t0
		s.mu.Unlock()
		if garbage {
			if err := s.writeFrame(c, []byte("\x00not json {{{")); err != nil {
				return sent, first, last
			}
			continue
		}
		if s.cfg.Rate == 0 {
			select {
			case <-c.stop:
				return sent, first, last
			case <-stallCh:
				continue // stall state changed; re-check garbage and stall
			}
		}
		now := time.Now()
		if due := s.dueAt(t0, next); due.After(now) {
			timer.Reset(due.Sub(now))
			select {
			case <-c.stop:
				return sent, first, last
			case <-timer.C:
			}
			continue
		}
		ts := now.UnixMilli()
		if s.cfg.Rate > 0 {
			ts = s.dueAt(t0, next).UnixMilli()
		}
		size := s.cfg.Size
		s.mu.Lock()
		if st.oversize > 0 {
			size, st.oversize = st.oversize, 0
		}
		s.mu.Unlock()
		msg := Message
		if s.cfg.LiveHead {
			msg = LiveMessage
		}
		if err := s.writeFrame(c, msg(next, ts, size)); err != nil {
			return sent, first, last
		}
		if sent == 0 {
			first = next
		}
		sent, last = sent+1, next
		next++
		select {
		case <-c.stop:
			return sent, first, last
		default:
		}
	}
}

func (s *Server) writeFrame(c *client, b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = c.conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
	return c.conn.WriteMessage(websocket.TextMessage, b)
}

var errEnded = errors.New("client ended")

// waitUnstalled blocks while st is stalled; it returns errEnded if c ends meanwhile.
func (s *Server) waitUnstalled(st *stream, c *client) error {
	for {
		s.mu.Lock()
		stalled, ch := st.stalled, st.stallCh
		s.mu.Unlock()
		if !stalled {
			select {
			case <-c.stop:
				return errEnded
			default:
				return nil
			}
		}
		select {
		case <-c.stop:
			return errEnded
		case <-ch:
		}
	}
}

// log appends e; call with s.mu held.
func (s *Server) log(e Event) {
	e.Time = time.Now()
	s.events = append(s.events, e)
}

// each runs f on stream id, or on every stream if id is "". Call with s.mu held.
func (s *Server) each(id string, f func(*stream)) {
	if id != "" {
		f(s.stream(id))
		return
	}
	for _, st := range s.streams {
		f(st)
	}
}

// Drop closes the sockets of id's clients abruptly, without a close frame ("" for
// every stream). It returns how many it dropped.
func (s *Server) Drop(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	s.each(id, func(st *stream) {
		for c := range st.clients {
			c.conn.NetConn().Close()
			c.end()
			n++
		}
	})
	return n
}

// CloseWith sends id's clients a close frame with code and text, then closes them.
// Code 1008 (policy violation) is what a client should treat as permanent.
func (s *Server) CloseWith(id string, code int, text string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	msg := websocket.FormatCloseMessage(code, text)
	s.each(id, func(st *stream) {
		for c := range st.clients {
			_ = c.conn.WriteControl(websocket.CloseMessage, msg, time.Now().Add(time.Second))
			c.end()
			n++
		}
	})
	return n
}

// Refuse makes handshakes to id ("" for all streams) fail with HTTP status; 0 accepts again.
func (s *Server) Refuse(id string, status int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if id == "" {
		s.refuse = status
		return
	}
	s.stream(id).refuse = status
}

// RetryAfter sets the Retry-After header refused handshakes carry, as a rate-limiting
// upstream's 429 does ("": none).
func (s *Server) RetryAfter(v string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.retryAfter = v
}

// Stall makes id's clients ("" for all) stop reading and writing — pings go
// unanswered, as with a hung upstream — until Stall(id, false).
func (s *Server) Stall(id string, on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.each(id, func(st *stream) {
		if st.stalled != on {
			st.stalled = on
			close(st.stallCh)
			st.stallCh = make(chan struct{})
		}
	})
}

// Garbage makes id's clients ("" for all) send n frames that are not JSON before their
// next message. With several clients, they share the n frames.
func (s *Server) Garbage(id string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.each(id, func(st *stream) {
		st.garbage += n
		close(st.stallCh) // wake idle writers
		st.stallCh = make(chan struct{})
	})
}

// ResetNumbering restarts id's numbering at 1, as an upstream that lost its state
// does: connected clients get seq 1 next, and a client asking to resume beyond the
// new head starts at 1 too.
func (s *Server) ResetNumbering(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stream(id)
	st.t0, st.gen, st.reset = time.Now(), st.gen+1, true
	close(st.stallCh) // wake idle writers
	st.stallCh = make(chan struct{})
}

// Skip makes the next message of one of id's clients jump n sequences ahead: a
// forward gap, as an upstream that lost messages makes.
func (s *Server) Skip(id string, n int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stream(id).skip = n
}

// Oversize makes id's next message carry a payload of size bytes (it takes its
// sequence number like any other), to exceed a client's read limit.
func (s *Server) Oversize(id string, size int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stream(id).oversize = size
}

// Stats returns id's counters.
func (s *Server) Stats(id string) Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.streams[id]
	if st == nil {
		return Stats{}
	}
	return s.stats(st)
}

func (s *Server) stats(st *stream) Stats {
	h := s.head(st, time.Now())
	if h == math.MaxInt64 {
		h = -1
	}
	return Stats{Clients: len(st.clients), MaxClients: st.max, Connects: st.connects, Refused: st.refused, Head: h, Sockets: st.sockets}
}

// AllStats returns every stream's counters.
func (s *Server) AllStats() map[string]Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]Stats, len(s.streams))
	for id, st := range s.streams {
		out[id] = s.stats(st)
	}
	return out
}

// TotalClients is the number of clients connected now, over all streams.
func (s *Server) TotalClients() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, st := range s.streams {
		n += len(st.clients)
	}
	return n
}

// ResetMax sets id's MaxClients to its current client count, to watch a new phase.
func (s *Server) ResetMax(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stream(id)
	st.max = len(st.clients)
}

// Events returns a copy of the connection log.
func (s *Server) Events() []Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Event(nil), s.events...)
}

type ctlQuery struct{ url.Values }

func (q ctlQuery) int(name string, def int) (int, error) {
	v := q.Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", name, err)
	}
	return n, nil
}

// ctl wraps a control action on ?stream=ID (absent: every stream).
func (s *Server) ctl(f func(id string, q ctlQuery) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if err := f(strings.TrimSpace(q.Get("stream")), ctlQuery{q}); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}
}
