package demoupstream

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

func postJSON(t *testing.T, method, url string, v any) int {
	t.Helper()
	req, _ := http.NewRequest(method, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if v != nil && resp.StatusCode == http.StatusOK {
		if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
			t.Fatal(err)
		}
	}
	return resp.StatusCode
}

// With RequireToken: a handshake needs a live token from /bullet or /listenKey
// (401 otherwise); a listenKey lives on through its keepalive, and a socket whose
// token lapses is closed with 1000 "token expired".
func TestTokens(t *testing.T) {
	s, err := Listen("127.0.0.1:0", Config{Rate: 100, Size: 4, RequireToken: true, TokenTTL: 400 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	base := "http://" + s.Addr()
	if _, resp, err := websocket.DefaultDialer.Dial(s.URL("a"), nil); err == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("no token: %v", err)
	}
	var bullet struct {
		Data struct {
			Token           string `json:"token"`
			ExpiresIn       int64  `json:"expires_in"`
			InstanceServers []struct {
				Endpoint string `json:"endpoint"`
			} `json:"instanceServers"`
		} `json:"data"`
	}
	if code := postJSON(t, "POST", base+"/bullet", &bullet); code != 200 || bullet.Data.Token == "" || len(bullet.Data.InstanceServers) != 1 {
		t.Fatalf("bullet: %d %+v", code, bullet)
	}
	conn, _, err := websocket.DefaultDialer.Dial(bullet.Data.InstanceServers[0].Endpoint+"/a?token="+bullet.Data.Token, nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(3 * time.Second))
	for {
		if _, _, err := conn.ReadMessage(); err != nil {
			if !websocket.IsCloseError(err, websocket.CloseNormalClosure) || !strings.Contains(err.Error(), "token expired") {
				t.Fatalf("socket ended with %v, want a close for the lapsed token", err)
			}
			break
		}
	}
	conn.Close()
	var lk struct {
		ListenKey string `json:"listenKey"`
	}
	postJSON(t, "POST", base+"/listenKey", &lk)
	for range 4 { // kept alive past its TTL
		time.Sleep(200 * time.Millisecond)
		if code := postJSON(t, "PUT", base+"/listenKey?listenKey="+lk.ListenKey, nil); code != 200 {
			t.Fatalf("keepalive: %d", code)
		}
	}
	if code := postJSON(t, "PUT", base+"/listenKey?listenKey=nope", nil); code != http.StatusBadRequest {
		t.Fatalf("unknown key: %d", code)
	}
	s.RevokeTokens()
	if code := postJSON(t, "PUT", base+"/listenKey?listenKey="+lk.ListenKey, nil); code != http.StatusBadRequest {
		t.Fatalf("revoked key: %d", code)
	}
	if ts := s.TokenStats(); ts.Minted != 2 || ts.Refreshes != 4 || ts.ExpiredCloses != 1 {
		t.Fatalf("stats %+v", ts)
	}
}

// A snapshot names the last sequence produced (less the lag), and Skip makes a
// forward gap.
func TestSnapshotAndSkip(t *testing.T) {
	s, err := Listen("127.0.0.1:0", Config{Rate: 200, Size: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Touch("b")
	time.Sleep(100 * time.Millisecond)
	var snap struct {
		Seq int64 `json:"seq"`
	}
	if code := postJSON(t, "GET", "http://"+s.Addr()+"/snapshot/b", &snap); code != 200 || snap.Seq < 10 || snap.Seq > s.Stats("b").Head {
		t.Fatalf("snapshot %d %+v, head %d", code, snap, s.Stats("b").Head)
	}
	s.SnapshotLag("b", 1_000)
	postJSON(t, "GET", "http://"+s.Addr()+"/snapshot/b", &snap)
	if snap.Seq != 0 {
		t.Fatalf("lagging snapshot at %d", snap.Seq)
	}
	s.Skip("b", 7) // taken by the next message sent
	conn, _, err := websocket.DefaultDialer.Dial(s.URL("b")+"?from=5", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var seqs []int64
	for len(seqs) < 2 {
		_, data, err := conn.ReadMessage()
		if err != nil {
			t.Fatal(err)
		}
		var m struct{ Seq int64 }
		_ = json.Unmarshal(data, &m)
		seqs = append(seqs, m.Seq)
	}
	if seqs[0] != 6+7 || seqs[1] != 14 {
		t.Fatalf("after Skip(7) from 5: %v, want 13, 14", seqs)
	}
}
