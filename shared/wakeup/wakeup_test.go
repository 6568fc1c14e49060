package wakeup

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

var secret = []byte("0123456789abcdef-test")

func TestGoldenWireFormat(t *testing.T) {
	raw, err := os.ReadFile("testdata/request.json")
	if err != nil {
		t.Fatal(err)
	}
	req, err := DecodeRequest(raw)
	if err != nil {
		t.Fatal(err)
	}
	want := Request{V: 1, Conns: []Conn{{ID: "meeting-123", LeaseVersion: 4, Reason: NeedsOwner}, {ID: "feed-7", LeaseVersion: 9, Reason: Check}}}
	if fmt.Sprint(req) != fmt.Sprint(want) {
		t.Fatalf("decoded %+v, want %+v", req, want)
	}
	out, _ := json.Marshal(want)
	if !bytes.Equal(bytes.TrimSpace(raw), out) {
		t.Errorf("encoding drifted from golden:\n got %s\nwant %s", out, raw)
	}
	rawResp, err := os.ReadFile("testdata/response.json")
	if err != nil {
		t.Fatal(err)
	}
	resp := Response{V: 1, Results: []ConnResult{{"meeting-123", Acquired, ""}, {"feed-7", Stale, "held at version 10"}}}
	out, _ = json.Marshal(resp)
	if !bytes.Equal(bytes.TrimSpace(rawResp), out) {
		t.Errorf("response encoding drifted:\n got %s\nwant %s", out, rawResp)
	}
}

func TestVerify(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	body := []byte(`{"v":1}`)
	ts := Timestamp(now)
	good := Sign(secret, ts, body)
	cases := []struct {
		name          string
		secret        []byte
		ts, sig, body string
		now           time.Time
		ok            bool
	}{
		{"good", secret, ts, good, string(body), now, true},
		{"edge of window", secret, ts, good, string(body), now.Add(Window), true},
		{"too old", secret, ts, good, string(body), now.Add(Window + time.Millisecond), false},
		{"from the future", secret, ts, good, string(body), now.Add(-Window - time.Millisecond), false},
		{"missing sig", secret, ts, "", string(body), now, false},
		{"missing ts", secret, "", good, string(body), now, false},
		{"bad ts", secret, "12a", good, string(body), now, false},
		{"other secret", []byte("another-secret-123"), ts, good, string(body), now, false},
		{"body changed", secret, ts, good, `{"v":2}`, now, false},
		{"ts changed", secret, Timestamp(now.Add(time.Millisecond)), good, string(body), now, false},
		{"no prefix", secret, ts, strings.TrimPrefix(good, "v1="), string(body), now, false},
		{"truncated", secret, ts, good[:len(good)-2], string(body), now, false},
		{"upper-case hex", secret, ts, "v1=" + strings.ToUpper(good[3:]), string(body), now, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := Verify(tc.secret, tc.now, tc.ts, tc.sig, []byte(tc.body))
			if (err == nil) != tc.ok {
				t.Fatalf("Verify = %v, want ok=%v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrUnauthorized) {
				t.Errorf("%v does not wrap ErrUnauthorized", err)
			}
		})
	}
}

func TestReplay(t *testing.T) {
	var r Replay
	now := time.Unix(1000, 0)
	if r.Seen("a", now) {
		t.Fatal("first sight reported as replay")
	}
	if !r.Seen("a", now.Add(Window)) {
		t.Fatal("replay inside the window not caught")
	}
	if r.Seen("a", now.Add(2*Window+time.Second)) {
		t.Fatal("an entry outlived its expiry (and its timestamp is stale anyway)")
	}
	small := Replay{Max: 3}
	for i := range 10 {
		small.Seen(fmt.Sprint(i), now)
	}
	if len(small.seen) > 3 || len(small.order) > 3 {
		t.Fatalf("cache grew past Max: %d/%d", len(small.seen), len(small.order))
	}
	if !small.Seen("9", now) {
		t.Fatal("the newest entry was evicted")
	}
}

func TestDecodeRequestRejects(t *testing.T) {
	many := `{"v":1,"conns":[` + strings.Repeat(`{"id":"x","lease_version":1,"reason":"check"},`, MaxConns) + `{"id":"y","lease_version":1,"reason":"check"}]}`
	cases := map[string]string{
		"empty":           ``,
		"not json":        `hello`,
		"array":           `[]`,
		"wrong version":   `{"v":2,"conns":[{"id":"a","lease_version":1,"reason":"check"}]}`,
		"no version":      `{"conns":[{"id":"a","lease_version":1,"reason":"check"}]}`,
		"no conns":        `{"v":1,"conns":[]}`,
		"unknown field":   `{"v":1,"conns":[{"id":"a","lease_version":1,"reason":"check"}],"x":1}`,
		"unknown reason":  `{"v":1,"conns":[{"id":"a","lease_version":1,"reason":"kill"}]}`,
		"key not id":      `{"v":1,"conns":[{"id":"CONN#a","lease_version":1,"reason":"check"}]}`,
		"empty id":        `{"v":1,"conns":[{"id":"","lease_version":1,"reason":"check"}]}`,
		"duplicate":       `{"v":1,"conns":[{"id":"a","lease_version":1,"reason":"check"},{"id":"a","lease_version":2,"reason":"check"}]}`,
		"negative":        `{"v":1,"conns":[{"id":"a","lease_version":-1,"reason":"check"}]}`,
		"version as text": `{"v":1,"conns":[{"id":"a","lease_version":"1","reason":"check"}]}`,
		"trailing":        `{"v":1,"conns":[{"id":"a","lease_version":1,"reason":"check"}]} {}`,
		"too many":        many,
		"handoff, no to":  `{"v":1,"conns":[{"id":"a","lease_version":1,"reason":"handoff"}]}`,
		"to, no handoff":  `{"v":1,"conns":[{"id":"a","lease_version":1,"reason":"check","to":"w1"}]}`,
		"too big":         `{"v":1,"conns":[{"id":"a","lease_version":1,"reason":"check"}],"pad":"` + strings.Repeat("x", MaxBody) + `"}`,
	}
	for name, body := range cases {
		t.Run(name, func(t *testing.T) {
			if _, err := DecodeRequest([]byte(body)); !errors.Is(err, ErrMalformed) {
				t.Fatalf("DecodeRequest = %v, want ErrMalformed", err)
			}
		})
	}
}

func TestDecodeRequestHandoff(t *testing.T) {
	r, err := DecodeRequest([]byte(`{"v":1,"conns":[{"id":"a","lease_version":7,"reason":"handoff","to":"w1"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if c := r.Conns[0]; c.Reason != Handoff || c.To != "w1" || c.LeaseVersion != 7 {
		t.Fatalf("decoded %+v", c)
	}
}

func FuzzDecodeRequest(f *testing.F) {
	golden, _ := os.ReadFile("testdata/request.json")
	f.Add(golden)
	f.Add([]byte(`{"v":1,"conns":[{"id":"a","lease_version":1,"reason":"check"}]}`))
	f.Add([]byte(`{"v":1,"conns":null}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := DecodeRequest(body)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error does not wrap ErrMalformed: %v", err)
			}
			return
		}
		if r.V != Version || len(r.Conns) == 0 || len(r.Conns) > MaxConns {
			t.Fatalf("accepted %+v", r)
		}
	})
}

func FuzzVerify(f *testing.F) {
	now := time.UnixMilli(1_700_000_000_000)
	ts := Timestamp(now)
	f.Add(ts, Sign(secret, ts, []byte("b")), []byte("b"))
	f.Add("", "v1=", []byte{})
	f.Fuzz(func(t *testing.T, ts, sig string, body []byte) {
		err := Verify(secret, now, ts, sig, body)
		if err == nil && sig != Sign(secret, ts, body) {
			t.Fatalf("accepted a signature that is not ours: ts=%q sig=%q", ts, sig)
		}
	})
}

func TestGoldenResponseWithLoad(t *testing.T) {
	raw, err := os.ReadFile("testdata/response-load.json")
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeResponse(raw)
	if err != nil {
		t.Fatal(err)
	}
	if got.Load == nil || *got.Load != 7 || len(got.Results) != 1 || got.Results[0].Result != Acquired {
		t.Fatalf("decoded %+v", got)
	}
	out, _ := json.Marshal(got)
	if !bytes.Equal(bytes.TrimSpace(raw), out) {
		t.Errorf("encoding drifted from golden:\n got %s\nwant %s", out, raw)
	}
	// A reply without a load (a worker that predates it) decodes with Load nil.
	old, _ := os.ReadFile("testdata/response.json")
	if r, err := DecodeResponse(old); err != nil || r.Load != nil {
		t.Errorf("old reply: %+v, %v", r, err)
	}
}

func TestDecodeResponseRejects(t *testing.T) {
	for name, body := range map[string]string{
		"not json":      `{"v":1,`,
		"wrong version": `{"v":2,"results":[]}`,
		"no version":    `{"results":[]}`,
		"negative load": `{"v":1,"results":[],"load":-1}`,
		"load a string": `{"v":1,"results":[],"load":"3"}`,
		"trailing data": `{"v":1,"results":[]} {}`,
	} {
		t.Run(name, func(t *testing.T) {
			if r, err := DecodeResponse([]byte(body)); !errors.Is(err, ErrMalformed) {
				t.Fatalf("DecodeResponse = %+v, %v; want ErrMalformed", r, err)
			}
		})
	}
	// Unknown fields are a newer worker's additions, not an error.
	if _, err := DecodeResponse([]byte(`{"v":1,"results":[],"load":2,"extra":true}`)); err != nil {
		t.Errorf("unknown field refused: %v", err)
	}
}

func FuzzDecodeResponse(f *testing.F) {
	golden, _ := os.ReadFile("testdata/response-load.json")
	f.Add(golden)
	f.Add([]byte(`{"v":1,"results":null,"load":0}`))
	f.Add([]byte(`{"v":1,"load":-5}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := DecodeResponse(body)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error does not wrap ErrMalformed: %v", err)
			}
			return
		}
		if r.V != Version || (r.Load != nil && *r.Load < 0) {
			t.Fatalf("accepted %+v", r)
		}
	})
}
