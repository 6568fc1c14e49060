package demoupstream

import (
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"
)

// Rules make the demo upstream behave like the strict production feeds a
// connection's spec is for. Every rule is off when zero. Broken rules are answered
// as those feeds do: a refused handshake, or a close frame with a 4xxx code.
type Rules struct {
	// Header and HeaderValue: a handshake without exactly this header is refused 401.
	Header, HeaderValue string
	// Subprotocol: a handshake that does not offer it is refused 400; it is selected.
	Subprotocol string
	// Subscribe: nothing is sent until the client sends a text frame containing
	// Subscribe, answered with Subscribed; a client that has not within
	// SubscribeWithin is closed with CloseNoSubscribe (as Coinbase does after 5 s).
	Subscribe       string
	Subscribed      string
	SubscribeWithin time.Duration
	// Keepalive: a client that sends no text frame containing Keepalive for
	// KeepaliveWithin is closed with CloseNoKeepalive (as Deepgram does after 10 s).
	// Each keepalive is answered with Pong, if set.
	Keepalive       string
	KeepaliveWithin time.Duration
	Pong            string
	// MaxLifetime caps each socket's life (as Binance does at 24 h): Announce is sent
	// AnnounceBefore the end (if set), then the socket is closed with 1001.
	MaxLifetime    time.Duration
	Announce       string
	AnnounceBefore time.Duration
}

// Close codes of broken rules.
const (
	CloseNoSubscribe = 4001
	CloseNoKeepalive = 4002
)

// checkHandshake returns the status to refuse r with, or 0.
func (r Rules) checkHandshake(req *http.Request) int {
	if r.Header != "" && req.Header.Get(r.Header) != r.HeaderValue {
		return http.StatusUnauthorized
	}
	if r.Subprotocol != "" {
		ok := false
		for _, p := range websocket.Subprotocols(req) {
			ok = ok || p == r.Subprotocol
		}
		if !ok {
			return http.StatusBadRequest
		}
	}
	return 0
}

// ruled is one client's rule state, fed by its reader.
type ruled struct {
	rules      Rules
	c          *client
	subscribed chan struct{}
	once       sync.Once
	mu         sync.Mutex
	lastKA     time.Time
}

func newRuled(r Rules, c *client) *ruled {
	return &ruled{rules: r, c: c, subscribed: make(chan struct{}), lastKA: time.Now()}
}

// seen handles one frame from the client.
func (u *ruled) seen(s *Server, data []byte) {
	text := string(data)
	if u.rules.Subscribe != "" && strings.Contains(text, u.rules.Subscribe) {
		u.once.Do(func() {
			if u.rules.Subscribed != "" {
				_ = s.writeFrame(u.c, []byte(u.rules.Subscribed))
			}
			close(u.subscribed)
		})
	}
	if u.rules.Keepalive != "" && strings.Contains(text, u.rules.Keepalive) {
		u.mu.Lock()
		u.lastKA = time.Now()
		u.mu.Unlock()
		if u.rules.Pong != "" {
			_ = s.writeFrame(u.c, []byte(u.rules.Pong))
		}
	}
}

// enforce closes the client when it breaks a timed rule or reaches its lifetime.
// It returns when the client ends.
func (u *ruled) enforce(s *Server) {
	r, c := u.rules, u.c
	start := time.Now()
	closeWith := func(code int, text string) {
		_ = c.conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, text), time.Now().Add(time.Second))
		c.end()
	}
	var subDeadline, life, announce <-chan time.Time
	if r.Subscribe != "" && r.SubscribeWithin > 0 {
		t := time.NewTimer(r.SubscribeWithin)
		defer t.Stop()
		subDeadline = t.C
	}
	if r.MaxLifetime > 0 {
		t := time.NewTimer(r.MaxLifetime)
		defer t.Stop()
		life = t.C
		if r.Announce != "" {
			a := time.NewTimer(r.MaxLifetime - r.AnnounceBefore)
			defer a.Stop()
			announce = a.C
		}
	}
	sub := u.subscribed
	var ka <-chan time.Time
	if r.Keepalive != "" && r.KeepaliveWithin > 0 {
		t := time.NewTicker(r.KeepaliveWithin / 10)
		defer t.Stop()
		ka = t.C
	}
	for {
		select {
		case <-c.stop:
			return
		case <-sub:
			subDeadline, sub = nil, nil
		case <-subDeadline:
			closeWith(CloseNoSubscribe, "no subscribe in time")
			return
		case <-announce:
			_ = s.writeFrame(c, []byte(r.Announce))
		case <-life:
			closeWith(websocket.CloseGoingAway, "lifetime "+time.Since(start).Truncate(time.Millisecond).String())
			return
		case <-ka:
			u.mu.Lock()
			late := time.Since(u.lastKA) > r.KeepaliveWithin
			u.mu.Unlock()
			if late {
				closeWith(CloseNoKeepalive, "no keepalive in time")
				return
			}
		}
	}
}

// waitSubscribed blocks until the client subscribed (or no rule asks it to). It
// returns errEnded if the client ends first.
func (u *ruled) waitSubscribed() error {
	if u.rules.Subscribe == "" {
		return nil
	}
	select {
	case <-u.c.stop:
		return errEnded
	case <-u.subscribed:
		return nil
	}
}
