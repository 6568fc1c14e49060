package stream

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/sockfleet/sockfleet/shared/schema"
)

// compress returns b compressed as how (deflate, gzip or zlib). Writing to a
// buffer cannot fail.
func compress(how string, b []byte) []byte {
	var buf bytes.Buffer
	var w interface {
		Write([]byte) (int, error)
		Close() error
	}
	switch how {
	case schema.DecodeDeflate:
		w, _ = flate.NewWriter(&buf, flate.BestSpeed)
	case schema.DecodeGzip:
		w = gzip.NewWriter(&buf)
	case schema.DecodeZlib:
		w = zlib.NewWriter(&buf)
	default:
		panic("compress " + how)
	}
	_, _ = w.Write(b)
	_ = w.Close()
	return buf.Bytes()
}

// okxUpstream is an upstream in the style of OKX and Huobi: every data message is a
// binary frame holding compressed JSON ({"seq":N,...}), numbered after the resume
// point ?from=N. After the message numbered bad, it sends the frames in junk (not
// data: they carry no number). With pmd it also negotiates permessage-deflate and
// sends plain text frames the extension compresses.
type okxUpstream struct {
	how  string
	pmd  bool
	bad  int64
	junk [][]byte

	mu         sync.Mutex
	extensions []string // Sec-WebSocket-Extensions offered on each handshake
}

func (u *okxUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	u.extensions = append(u.extensions, r.Header.Get("Sec-Websocket-Extensions"))
	u.mu.Unlock()
	conn, err := (&websocket.Upgrader{EnableCompression: u.pmd}).Upgrade(w, r, nil)
	if err != nil {
		return
	}
	defer conn.Close()
	go func() {
		for {
			if _, _, err := conn.ReadMessage(); err != nil {
				return
			}
		}
	}()
	from, _ := strconv.ParseInt(r.URL.Query().Get("from"), 10, 64)
	for n := from + 1; ; n++ {
		msg := []byte(fmt.Sprintf(`{"seq":%d,"arg":{"channel":"trades","instId":"BTC-USDT"},"data":[{"px":"%d.5"}]}`, n, 40000+n))
		kind := websocket.BinaryMessage
		if u.pmd {
			kind = websocket.TextMessage
		} else {
			msg = compress(u.how, msg)
		}
		if err := conn.WriteMessage(kind, msg); err != nil {
			return
		}
		if n == u.bad {
			for _, j := range u.junk {
				if err := conn.WriteMessage(websocket.BinaryMessage, j); err != nil {
					return
				}
			}
			if u.pmd {
				// A compressed message (FIN, RSV1, binary) whose DEFLATE data is corrupt:
				// 0xff opens a block of the reserved type 3.
				if _, err := conn.NetConn().Write([]byte{0xc2, 4, 0xff, 0xff, 0xff, 0xff}); err != nil {
					return
				}
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func (u *okxUpstream) offered() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.extensions...)
}

// Compressed binary frames are decoded before the sequence is read: every message
// is delivered decoded, in order, flagged with its decoding, and parsed as JSON.
func TestDecodeCompressedFrames(t *testing.T) {
	for _, how := range []string{schema.DecodeDeflate, schema.DecodeGzip, schema.DecodeZlib} {
		t.Run(how, func(t *testing.T) {
			up := &okxUpstream{how: how}
			srv := httptest.NewServer(up)
			defer srv.Close()
			snk := &memSink{}
			cfg := testConfig(t, snk, "seq")
			s := specStream(t, cfg, wsURL(srv, "/ws"), "okx", 10, schema.Spec{Decode: how})
			stop := run(s)
			waitFor(t, 5*time.Second, "50 messages", func() bool { return len(snk.seqs()) >= 50 })
			stop(ErrGraceful)
			contiguous(t, snk.seqs(), 11)
			for _, m := range snk.all() {
				if m.Decoded != how || m.Binary || !bytes.HasPrefix(m.Data, []byte(`{"seq":`)) {
					t.Fatalf("message %d: decoded %q binary %v data %q", m.Seq, m.Decoded, m.Binary, m.Data)
				}
				if r := m.Record(); r.Decoded != how {
					t.Fatalf("sink record not flagged: %+v", r)
				}
			}
			if cfg.Metrics.BadMessages.Load() != 0 || cfg.Metrics.DecodeErrors.Load() != 0 {
				t.Fatalf("bad %d, decode errors %d", cfg.Metrics.BadMessages.Load(), cfg.Metrics.DecodeErrors.Load())
			}
		})
	}
}

// A frame that does not decompress (not compressed, truncated, the wrong format)
// and a decompression bomb (64 KiB of gzip that inflates to 64 MiB) are bad
// messages: counted, said in the status, never a crash or a reconnect; the stream
// goes on in order. The bomb is inflated no further than the read limit.
func TestUndecodableFramesAreBadMessages(t *testing.T) {
	bomb := compress(schema.DecodeGzip, make([]byte, 64<<20))
	good := compress(schema.DecodeGzip, []byte(`{"seq":1}`))
	junk := [][]byte{
		[]byte(`{"seq":999999}`),          // not compressed at all
		good[:len(good)/2],                // truncated
		compress(schema.DecodeZlib, good), // zlib, not gzip
		bomb,                              // inflates past the 1 MiB read limit
		{},                                // empty
	}
	for _, policy := range []BadPolicy{BadCount, BadPass} {
		t.Run(string(policy), func(t *testing.T) {
			up := &okxUpstream{how: schema.DecodeGzip, bad: 20, junk: junk}
			srv := httptest.NewServer(up)
			defer srv.Close()
			snk := &memSink{}
			cfg := testConfig(t, snk, "seq")
			cfg.BadMessages = policy
			s := specStream(t, cfg, wsURL(srv, "/ws"), "huobi", 0, schema.Spec{Decode: schema.DecodeGzip})
			stop := run(s)
			waitFor(t, 10*time.Second, "messages past the junk", func() bool { return len(snk.seqs()) >= 60 })
			st := s.Status()
			stop(ErrGraceful)
			contiguous(t, snk.seqs(), 1)
			if got := cfg.Metrics.DecodeErrors.Load(); got != int64(len(junk)) {
				t.Fatalf("%d decode errors, want %d", got, len(junk))
			}
			if got := cfg.Metrics.BadMessages.Load(); got != int64(len(junk)) {
				t.Fatalf("%d bad messages, want %d", got, len(junk))
			}
			if cfg.Metrics.Reconnects.Load() != 0 {
				t.Fatal("an undecodable frame caused a reconnect")
			}
			want := "bad message (bad_messages " + string(policy) + "): decode: gzip frame of 14 bytes: gzip: invalid header"
			if st.State != "streaming" || st.Error != want {
				t.Fatalf("status %+v, want streaming with %q", st, want)
			}
			var passed [][]byte
			for _, m := range snk.all() {
				if m.Bad {
					if m.Decoded != "" || m.Seq != 20 {
						t.Fatalf("bad message flagged decoded %q at seq %d", m.Decoded, m.Seq)
					}
					passed = append(passed, m.Data)
				}
			}
			if policy == BadPass {
				if len(passed) != len(junk) || !bytes.Equal(passed[3], bomb) {
					t.Fatalf("%d frames passed on; the bomb must pass as it arrived", len(passed))
				}
			} else if len(passed) != 0 {
				t.Fatalf("%d bad messages delivered under count", len(passed))
			}
		})
	}
}

// inflate stops at the read limit, whatever the frame claims.
func TestInflateBoundedByLimit(t *testing.T) {
	for _, how := range []string{schema.DecodeDeflate, schema.DecodeGzip, schema.DecodeZlib} {
		data := compress(how, make([]byte, 4<<20))
		if _, err := inflate(data, how, 1<<20); err == nil || !strings.Contains(err.Error(), "over the read limit") {
			t.Fatalf("%s: %v", how, err)
		}
		out, err := inflate(data, how, 4<<20)
		if err != nil || len(out) != 4<<20 {
			t.Fatalf("%s at the limit: %d bytes, %v", how, len(out), err)
		}
	}
}

// decode = permessage-deflate offers the extension on the handshake; the upstream's
// compressed frames arrive inflated. Without it nothing is offered.
func TestPermessageDeflateNegotiated(t *testing.T) {
	up := &okxUpstream{pmd: true, bad: 20}
	srv := httptest.NewServer(up)
	defer srv.Close()
	snk := &memSink{}
	cfg := testConfig(t, snk, "seq")
	s := specStream(t, cfg, wsURL(srv, "/ws"), "pmd", 0, schema.Spec{Decode: schema.DecodePermessageDeflate})
	stop := run(s)
	waitFor(t, 5*time.Second, "50 messages", func() bool { return len(snk.seqs()) >= 50 })
	stop(ErrGraceful)
	contiguous(t, snk.seqs(), 1)
	if ext := up.offered(); len(ext) != 1 || !strings.Contains(ext[0], "permessage-deflate") {
		t.Fatalf("extensions offered: %q", ext)
	}
	if m := snk.all()[0]; m.Decoded != "" || m.Binary {
		t.Fatalf("an extension-inflated frame is a plain text frame: %+v", m)
	}
	// The corrupt compressed message after seq 20 is a bad message on the same socket.
	if cfg.Metrics.DecodeErrors.Load() != 1 || cfg.Metrics.Reconnects.Load() != 0 {
		t.Fatalf("decode errors %d, reconnects %d; want 1 and 0", cfg.Metrics.DecodeErrors.Load(), cfg.Metrics.Reconnects.Load())
	}
	if st := s.Status(); !strings.Contains(st.Error, "decode: permessage-deflate message: flate: corrupt input") {
		t.Fatalf("status %+v", st)
	}

	plain := &okxUpstream{pmd: true}
	srv2 := httptest.NewServer(plain)
	defer srv2.Close()
	s2 := specStream(t, testConfig(t, &memSink{}, "seq"), wsURL(srv2, "/ws"), "plain", 0, schema.Spec{})
	stop2 := run(s2)
	waitFor(t, 5*time.Second, "a handshake", func() bool { return len(plain.offered()) == 1 })
	stop2(ErrGraceful)
	if ext := plain.offered()[0]; ext != "" {
		t.Fatalf("offered %q without decode", ext)
	}
}

func FuzzDecodeFrame(f *testing.F) {
	f.Add([]byte{0x1f, 0x8b, 8, 0}, "gzip")
	f.Add([]byte{0x78, 0x9c}, "zlib")
	f.Add([]byte{1, 0, 0, 0xff, 0xff}, "deflate")
	f.Fuzz(func(t *testing.T, data []byte, how string) {
		out := decodeFrame(frame{binary: true, data: data}, how, 1<<16)
		if len(out.data) > 1<<16 && out.decodeErr == nil {
			t.Fatalf("%d bytes past the limit", len(out.data))
		}
		if out.decodeErr != nil && !bytes.Equal(out.data, data) {
			t.Fatal("an undecodable frame lost its payload")
		}
	})
}
