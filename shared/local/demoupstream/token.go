package demoupstream

import (
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"strconv"
	"time"

	"github.com/gorilla/websocket"
)

// The REST side of an exchange-style upstream, served always (see Config.RequireToken
// for enforcing it on the WebSocket):
//
//   - POST /bullet mints a token, KuCoin style: {"code":"200000","data":{"token":T,
//     "expires_in":SECONDS,"instanceServers":[{"endpoint":"ws://HOST/streams"}]}}; a
//     client dials ENDPOINT/{id}?token=T.
//   - POST /listenKey mints a key, Binance style: {"listenKey":K}; a client dials
//     /streams/{id}?listenKey=K, and PUT /listenKey?listenKey=K keeps it alive for
//     another TokenTTL (400 {"code":-1125,…} for a key unknown or expired).
//   - GET /snapshot/{id} is an order-book style snapshot of stream id:
//     {"seq":S,"stream":ID,"book":"…"} where S is the last sequence produced (less
//     the stream's snapshot lag, see SnapshotLag), so deltas after S follow it.

// token is a minted token or listenKey.
type token struct{ expires time.Time }

func newTokenValue() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (s *Server) tokenTTL() time.Duration {
	if s.cfg.TokenTTL > 0 {
		return s.cfg.TokenTTL
	}
	return time.Hour
}

// mint stores a new token valid for TokenTTL.
func (s *Server) mint() (string, time.Duration) {
	v, ttl := newTokenValue(), s.tokenTTL()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tokens == nil {
		s.tokens = map[string]*token{}
	}
	s.tokens[v] = &token{expires: time.Now().Add(ttl)}
	s.minted++
	return v, ttl
}

func (s *Server) serveBullet(w http.ResponseWriter, r *http.Request) {
	v, ttl := s.mint()
	writeJSON(w, map[string]any{"code": "200000", "data": map[string]any{
		"token": v, "expires_in": int64(ttl / time.Second),
		"instanceServers": []any{map[string]any{"endpoint": "ws://" + r.Host + "/streams", "protocol": "websocket"}},
	}})
}

func (s *Server) serveListenKey(w http.ResponseWriter, r *http.Request) {
	v, _ := s.mint()
	writeJSON(w, map[string]string{"listenKey": v})
}

func (s *Server) serveKeepalive(w http.ResponseWriter, r *http.Request) {
	k := r.URL.Query().Get("listenKey")
	s.mu.Lock()
	t := s.tokens[k]
	ok := t != nil && time.Now().Before(t.expires)
	if ok {
		t.expires = time.Now().Add(s.tokenTTL())
		s.refreshes++
	}
	s.mu.Unlock()
	if !ok {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`{"code":-1125,"msg":"This listenKey does not exist."}`))
		return
	}
	writeJSON(w, map[string]any{})
}

func (s *Server) serveSnapshot(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.mu.Lock()
	st := s.stream(id)
	head := s.head(st, time.Now())
	seq := max(head-st.snapLag, 0)
	s.snapshots++
	s.mu.Unlock()
	if s.cfg.Rate <= 0 {
		http.Error(w, "snapshots need a positive rate", http.StatusServiceUnavailable)
		return
	}
	writeJSON(w, map[string]any{"seq": seq, "stream": id, "book": "state up to " + strconv.FormatInt(seq, 10)})
}

// tokenOf returns the token or listenKey a handshake carries.
func tokenOf(r *http.Request) string {
	q := r.URL.Query()
	if v := q.Get("token"); v != "" {
		return v
	}
	return q.Get("listenKey")
}

// checkToken is the handshake's status under RequireToken: 0 for a known token
// that has not expired, 401 otherwise. Call with s.mu held.
func (s *Server) checkToken(r *http.Request) int {
	if !s.cfg.RequireToken {
		return 0
	}
	t := s.tokens[tokenOf(r)]
	if t == nil || !time.Now().Before(t.expires) {
		return http.StatusUnauthorized
	}
	return 0
}

// watchToken closes c (1000, "token expired") once the token it dialed with expires
// or is revoked, as an exchange ends a stream whose key lapsed; a keepalive that
// extends the token moves the end. The returned stop ends the watch.
func (s *Server) watchToken(c *client, v string) (stop func()) {
	if !s.cfg.RequireToken {
		return func() {}
	}
	done := make(chan struct{})
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-c.stop:
				return
			case <-t.C:
			}
			s.mu.Lock()
			tok := s.tokens[v]
			lapsed := tok == nil || !time.Now().Before(tok.expires)
			if lapsed {
				s.expiredClose++
			}
			s.mu.Unlock()
			if lapsed {
				_ = c.conn.WriteControl(websocket.CloseMessage,
					websocket.FormatCloseMessage(websocket.CloseNormalClosure, "token expired"), time.Now().Add(time.Second))
				c.end()
				return
			}
		}
	}()
	return func() { close(done) }
}

// RevokeTokens forgets every token and listenKey: keepalives fail, handshakes with
// them are refused, and their sockets close.
func (s *Server) RevokeTokens() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.tokens)
}

// SnapshotLag makes id's snapshots lag n sequences behind what the stream has
// produced (0: none), as a REST cache behind the WebSocket does.
func (s *Server) SnapshotLag(id string, n int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stream(id).snapLag = n
}

// TokenStats counts the token side: tokens and listenKeys minted, keepalives that
// extended one, snapshots served, and sockets closed because their token lapsed.
type TokenStats struct {
	Minted, Refreshes, Snapshots, ExpiredCloses int
}

// TokenStats returns the token side's counters.
func (s *Server) TokenStats() TokenStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return TokenStats{Minted: s.minted, Refreshes: s.refreshes, Snapshots: s.snapshots, ExpiredCloses: s.expiredClose}
}
