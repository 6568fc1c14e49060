package codec

import (
	"encoding/json"
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/schema"
)

func fullSpec() schema.Spec {
	return schema.Spec{
		Headers:      map[string]string{"Authorization": "Bearer {{secret:feeds/token}}", "X-Api-Key": "{{secret:arn:aws:secretsmanager:eu-west-1:1:secret:k-AbC#key}}"},
		Subprotocols: []string{"v2.feed", "json"},
		OpenMessages: []schema.OpenMessage{
			{Text: `{"type":"subscribe","after":{seq},"conn":"{conn}"}`, ExpectField: "type=subscriptions", Timeout: 5 * time.Second},
			{Binary: []byte{1, 2, 3}, IsBinary: true},
			{Text: "hello", Expect: "ok"},
		},
		Keepalive:     &schema.Keepalive{Message: `{"type":"KeepAlive"}`, Interval: 8 * time.Second, Pong: "pong", PongTimeout: 3 * time.Second},
		MaxLifetime:   23 * time.Hour,
		ShutdownMatch: `"type":"goAway"`,
		Resume:        "header:Last-Event-ID={seq}",
		SeqPath:       "meta.offset",
		BadMessages:   "pass",
		Start:         "1200",
		IdleTimeout:   time.Minute,
		IdleReconnect: true,
		SeqReset:      schema.SeqResetHalt,
		MaxSeqJump:    1000000,
		TokenRequest: &schema.TokenRequest{
			Request: schema.Request{Method: "POST", URL: "https://api.example.com/api/v1/bullet-private?ts={conn}",
				Headers: map[string]string{"KC-API-KEY": "{{secret:kucoin#key}}"}, Body: `{"a":1}`, Timeout: 3 * time.Second},
			Refresh: &schema.Refresh{Request: schema.Request{Method: "PUT", URL: "https://api.example.com/listenKey?listenKey={{token:listenKey}}"},
				Interval: 30 * time.Minute},
			Expires: "data.expires_in",
		},
		Snapshot: &schema.Snapshot{Request: schema.Request{URL: "https://api.example.com/depth?symbol=BTC&token={{token:data.token}}"},
			SeqPath: "lastUpdateId", OnGap: schema.OnGapResync},
	}
}

func TestSpecRoundTrip(t *testing.T) {
	want := Connection{ID: "c1", DesiredState: schema.Started, WSURL: "wss://h/x", Spec: fullSpec(), Epoch: 2}
	got, err := DecodeConnection(EncodeConnection(want))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, want)
	}
	if seq, ok := got.Spec.StartSeq(); !ok || seq != 1200 {
		t.Fatalf("StartSeq = %d, %v", seq, ok)
	}
}

func TestSpecDefaultsAreZero(t *testing.T) {
	c, err := DecodeConnection(goodItem())
	if err != nil {
		t.Fatal(err)
	}
	if !c.Spec.Zero() {
		t.Fatalf("spec of a plain item: %+v", c.Spec)
	}
	if _, ok := c.Spec.StartSeq(); ok {
		t.Fatal("default start is not latest")
	}
}

// Every bad spec makes the item unusable with an error naming the attribute and why,
// and no error quotes a header value (it may hold a secret).
func TestDecodeSpecRejectsBadSpecs(t *testing.T) {
	m := func(kv ...any) types.AttributeValue {
		it := Item{}
		for i := 0; i < len(kv); i += 2 {
			it[kv[i].(string)] = kv[i+1].(types.AttributeValue)
		}
		return &types.AttributeValueMemberM{Value: it}
	}
	l := func(vs ...types.AttributeValue) types.AttributeValue { return &types.AttributeValueMemberL{Value: vs} }
	manyHeaders := Item{}
	for i := range schema.MaxHeaders + 1 {
		manyHeaders["H"+strconv.Itoa(i)] = S("v")
	}
	cases := []struct {
		name string
		attr string
		val  types.AttributeValue
		want string
	}{
		{"headers not a map", schema.AttrHeaders, S("Authorization: sekrit-1"), "headers: type S, want M"},
		{"header value not a string", schema.AttrHeaders, m("Authorization", &types.AttributeValueMemberSS{Value: []string{"sekrit-1"}}), "headers.Authorization: type SS, want S"},
		{"header bad name", schema.AttrHeaders, m("Bad Name", S("sekrit-1")), `headers: name "Bad Name"`},
		{"header handshake", schema.AttrHeaders, m("Sec-WebSocket-Protocol", S("sekrit-1")), "set by the WebSocket handshake"},
		{"header newline", schema.AttrHeaders, m("X-A", S("sekrit-1\r\nX-B: y")), "X-A: value holds a line break"},
		{"header huge", schema.AttrHeaders, m("X-A", S("sekrit-1"+strings.Repeat("a", schema.MaxHeaderValueLen))), "X-A: value of"},
		{"header too many", schema.AttrHeaders, &types.AttributeValueMemberM{Value: manyHeaders}, "33 headers, limit 32"},
		{"header bad secret ref", schema.AttrHeaders, m("X-A", S("sekrit-1 {{secret:}}")), "X-A: malformed {{secret:NAME}}"},
		{"subprotocols not a list", schema.AttrSubprotocols, S("v2"), "subprotocols: type S, want L or SS"},
		{"subprotocol not a string", schema.AttrSubprotocols, l(N(2)), "subprotocols[0]: type N"},
		{"subprotocol bad token", schema.AttrSubprotocols, l(S("a b")), `subprotocols: [0] "a b": not a token`},
		{"open messages not a list", schema.AttrOpenMessages, m(), "open_messages: type M, want L"},
		{"open message not a map", schema.AttrOpenMessages, l(S("hi")), "open_messages[0]: type S, want M"},
		{"open message empty", schema.AttrOpenMessages, l(m()), "open_messages: [0]: want text or binary"},
		{"open message both", schema.AttrOpenMessages, l(m("text", S("a"), "binary", &types.AttributeValueMemberB{Value: []byte{1}})), "both text and binary"},
		{"open message binary type", schema.AttrOpenMessages, l(m("binary", S("AQ=="))), "open_messages[0].binary: type S, want B"},
		{"open message bad timeout", schema.AttrOpenMessages, l(m("text", S("a"), "expect", S("b"), "timeout", S("soon"))), `open_messages[0]: invalid timeout "soon"`},
		{"open message timeout too long", schema.AttrOpenMessages, l(m("text", S("a"), "expect", S("b"), "timeout", S("1h"))), "timeout 1h0m0s: want 0 to 5m0s"},
		{"open message timeout alone", schema.AttrOpenMessages, l(m("text", S("a"), "timeout", S("1s"))), "timeout set without expect"},
		{"open message expect_field", schema.AttrOpenMessages, l(m("text", S("a"), "expect_field", S("type"))), "want PATH=VALUE"},
		{"open message huge", schema.AttrOpenMessages, l(m("text", S(strings.Repeat("a", schema.MaxFrameLen+1)))), "limit 65536"},
		{"keepalive not a map", schema.AttrKeepalive, S("ping"), "keepalive: type S, want M"},
		{"keepalive no message", schema.AttrKeepalive, m("interval", S("5s")), "keepalive: message: missing"},
		{"keepalive no interval", schema.AttrKeepalive, m("message", S("p")), "keepalive: interval 0s"},
		{"keepalive interval type", schema.AttrKeepalive, m("message", S("p"), "interval", N(5)), "keepalive: invalid interval: type N, want S"},
		{"keepalive pong timeout alone", schema.AttrKeepalive, m("message", S("p"), "interval", S("5s"), "pong_timeout", S("1s")), "pong_timeout set without pong"},
		{"max_lifetime short", schema.AttrMaxLifetime, S("500ms"), "max_lifetime: 500ms: at least 1s"},
		{"max_lifetime negative", schema.AttrMaxLifetime, S("-1h"), `max_lifetime "-1h": want a non-negative duration`},
		{"max_lifetime number", schema.AttrMaxLifetime, N(60), "max_lifetime: type N, want S"},
		{"resume bad", schema.AttrResume, S("cookie:x={seq}"), "resume: \"cookie:x={seq}\": want query"},
		{"seq_path bad", schema.AttrSeqPath, S("a..b"), "seq_path: \"a..b\": empty field"},
		{"bad_messages bad", schema.AttrBadMessages, S("drop"), "bad_messages: \"drop\": want count, skip or pass"},
		{"start bad", schema.AttrStart, S("newest"), "start: \"newest\": want latest, earliest"},
		{"start negative", schema.AttrStart, S("-5"), "start: \"-5\""},
		{"idle_timeout short", schema.AttrIdleTimeout, S("10ms"), "idle_timeout: 10ms: at least 1s"},
		{"idle_reconnect type", schema.AttrIdleReconnect, S("yes"), "idle_reconnect: type S, want BOOL"},
		{"idle_reconnect alone", schema.AttrIdleReconnect, &types.AttributeValueMemberBOOL{Value: true}, "idle_reconnect: set without idle_timeout"},
		{"seq_reset bad", schema.AttrSeqReset, S("ignore"), "seq_reset: \"ignore\": want accept or halt"},
		{"max_seq_jump negative", schema.AttrMaxSeqJump, N(-1), "max_seq_jump: -1"},
		{"max_seq_jump type", schema.AttrMaxSeqJump, S("10"), "max_seq_jump: type S, want N"},
		{"seq_epoch type", schema.AttrEpoch, S("1"), "seq_epoch: type S, want N"},
		{"token_request not a map", schema.AttrTokenRequest, S("https://x/t"), "token_request: type S, want M"},
		{"token_request no url", schema.AttrTokenRequest, m("method", S("POST")), "token_request: url: missing"},
		{"token_request bad scheme", schema.AttrTokenRequest, m("url", S("ftp://x/t")), "want an http:// or https:// URL"},
		{"token_request templated host", schema.AttrTokenRequest, m("url", S("https://{{secret:h}}/t")), "the host must be literal"},
		{"token_request bad method", schema.AttrTokenRequest, m("url", S("https://x/t"), "method", S("FETCH")), `method "FETCH"`},
		{"token_request header type", schema.AttrTokenRequest, m("url", S("https://x/t"), "headers", m("K", N(1))), "token_request.headers.K: type N, want S"},
		{"token_request header newline", schema.AttrTokenRequest, m("url", S("https://x/t"), "headers", m("K", S("sekrit-1\nX: y"))), "headers: K: value holds a line break"},
		{"token_request token in itself", schema.AttrTokenRequest, m("url", S("https://x/t?k={{token:a}}")), "{{token:a}} without a token_request"},
		{"token_request huge body", schema.AttrTokenRequest, m("url", S("https://x/t"), "body", S(strings.Repeat("a", schema.MaxRequestBody+1))), "body of 65537 bytes"},
		{"token_request timeout", schema.AttrTokenRequest, m("url", S("https://x/t"), "timeout", S("1h")), "timeout 1h0m0s: want 0 to 5m0s"},
		{"token_request bad expires", schema.AttrTokenRequest, m("url", S("https://x/t"), "expires", S("a..b")), "expires: path"},
		{"refresh no interval", schema.AttrTokenRequest, m("url", S("https://x/t"), "refresh", m("url", S("https://x/k"))), "refresh.interval 0s: want 100ms to 24h"},
		{"refresh not a map", schema.AttrTokenRequest, m("url", S("https://x/t"), "refresh", S("30m")), "token_request.refresh: type S, want M"},
		{"refresh bad token ref", schema.AttrTokenRequest, m("url", S("https://x/t"), "refresh", m("url", S("https://x/k?{{token:}}"), "interval", S("1m"))), "malformed {{token:PATH}}"},
		{"snapshot no seq_path", schema.AttrSnapshot, m("url", S("https://x/s")), "snapshot: seq_path: missing"},
		{"snapshot bad on_gap", schema.AttrSnapshot, m("url", S("https://x/s"), "seq_path", S("seq"), "on_gap", S("refetch")), `on_gap "refetch": want count or resync`},
		{"snapshot token without request", schema.AttrSnapshot, m("url", S("https://x/s?t={{token:t}}"), "seq_path", S("seq")), "without a token_request"},
		{"header token without request", schema.AttrHeaders, m("X-A", S("{{token:t}}")), "X-A: {{token:t}} without a token_request"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			it := goodItem()
			it[tc.attr] = tc.val
			c, err := DecodeConnection(it)
			if err == nil {
				t.Fatal("accepted")
			}
			if !errors.Is(err, schema.ErrInvalid) {
				t.Fatalf("error does not wrap ErrInvalid: %v", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not say %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "sekrit") {
				t.Fatalf("error quotes a header value: %q", err)
			}
			if c.ID != "c1" {
				t.Fatalf("the id is lost: %+v", c)
			}
			if tc.attr != schema.AttrEpoch && (c.SpecErr == nil || c.Unrunnable() == nil) {
				// Unrunnable is what the reconciler and the sweep judge by: a bad spec must
				// never be woken as if the lease store could repair it.
				t.Fatalf("SpecErr %v, Unrunnable %v", c.SpecErr, c.Unrunnable())
			}
		})
	}
}

func TestSecretRefs(t *testing.T) {
	v := "Bearer {{secret:feeds/token}} and {{secret:arn:aws:secretsmanager:r:1:secret:k-AbC#api_key}}"
	got := schema.SecretRefs(v)
	want := []schema.SecretRef{{Name: "feeds/token"}, {Name: "arn:aws:secretsmanager:r:1:secret:k-AbC", Key: "api_key"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("refs %+v, want %+v", got, want)
	}
	out, err := schema.ReplaceSecrets(v, func(r schema.SecretRef) (string, error) { return "<" + r.Name + "|" + r.Key + ">", nil })
	if err != nil || out != "Bearer <feeds/token|> and <arn:aws:secretsmanager:r:1:secret:k-AbC|api_key>" {
		t.Fatalf("replaced %q, %v", out, err)
	}
}

// avFromJSON turns fuzzer JSON into attribute values the way the console's JSON
// view would: objects are M, arrays L, strings S, numbers N, booleans BOOL.
func avFromJSON(v any) types.AttributeValue {
	switch x := v.(type) {
	case map[string]any:
		m := Item{}
		for k, e := range x {
			m[k] = avFromJSON(e)
		}
		return &types.AttributeValueMemberM{Value: m}
	case []any:
		l := make([]types.AttributeValue, len(x))
		for i, e := range x {
			l[i] = avFromJSON(e)
		}
		return &types.AttributeValueMemberL{Value: l}
	case string:
		return S(x)
	case json.Number:
		return &types.AttributeValueMemberN{Value: x.String()}
	case bool:
		return &types.AttributeValueMemberBOOL{Value: x}
	}
	return &types.AttributeValueMemberNULL{Value: true}
}

// FuzzDecodeSpec feeds arbitrary spec attributes (a JSON object whose fields become
// item attributes): decoding never panics, errors wrap ErrInvalid, and whatever is
// accepted validates and survives a round trip.
func FuzzDecodeSpec(f *testing.F) {
	f.Add(`{"headers":{"Authorization":"Bearer {{secret:t}}"},"subprotocols":["v2"]}`)
	f.Add(`{"open_messages":[{"text":"sub {seq}","expect":"ok","timeout":"2s"}],"keepalive":{"message":"p","interval":"5s","pong":"q"}}`)
	f.Add(`{"max_lifetime":"30s","start":"earliest","idle_timeout":"1m","idle_reconnect":true,"seq_reset":"halt","max_seq_jump":5}`)
	f.Add(`{"open_messages":[{"text":"x","expect_field":"a.b=c"}],"resume":"query:from={seq}","seq_path":"seq","bad_messages":"pass"}`)
	f.Add(`{"headers":{"X":"{{secret:a#b}}{{secret:"},"open_messages":[[]],"keepalive":[]}`)
	f.Add(`{"token_request":{"method":"POST","url":"https://h/t","headers":{"K":"{{secret:k}}"},"expires":"d.e","refresh":{"url":"https://h/r?k={{token:k}}","interval":"30m"}},"headers":{"A":"{{token:d.t}}"}}`)
	f.Add(`{"token_request":{"url":"https://h","headers":{}}}`) // an empty map decodes as none, as it encodes
	f.Add(`{"snapshot":{"url":"https://h/s/{conn}","seq_path":"lastUpdateId","on_gap":"resync","timeout":"2s"},"seq_path":"u"}`)
	f.Fuzz(func(t *testing.T, doc string) {
		// The CLI's --spec reader: never panics, errors wrap ErrInvalid, accepted specs validate.
		if sp, err := SpecFromJSON([]byte(doc)); err != nil {
			if !errors.Is(err, schema.ErrInvalid) {
				t.Fatalf("SpecFromJSON error does not wrap ErrInvalid: %v", err)
			}
		} else if err := sp.Validate(); err != nil {
			t.Fatalf("SpecFromJSON accepted a spec that does not validate: %v", err)
		}
		dec := json.NewDecoder(strings.NewReader(doc))
		dec.UseNumber()
		var attrs map[string]any
		if dec.Decode(&attrs) != nil {
			return
		}
		it := goodItem()
		for k, v := range attrs {
			if k == schema.AttrPK || k == schema.AttrDesiredState || k == schema.AttrWSURL {
				continue
			}
			it[k] = avFromJSON(v)
		}
		c, err := DecodeConnection(it)
		if err != nil {
			if !errors.Is(err, schema.ErrInvalid) {
				t.Fatalf("error does not wrap ErrInvalid: %v", err)
			}
			return
		}
		if err := c.Spec.Validate(); err != nil {
			t.Fatalf("accepted a spec that does not validate: %v", err)
		}
		back, err := DecodeConnection(EncodeConnection(c))
		if err != nil || !reflect.DeepEqual(back.Spec, c.Spec) {
			t.Fatalf("round trip: %+v / %+v, %v", c.Spec, back.Spec, err)
		}
	})
}

// A ws_url that references {{token:…}} needs a token_request on the item.
func TestTokenURLNeedsATokenRequest(t *testing.T) {
	it := goodItem()
	it[schema.AttrWSURL] = S("wss://h/ws/{{token:listenKey}}")
	c, err := DecodeConnection(it)
	if err == nil || !errors.Is(err, schema.ErrInvalid) || c.Unrunnable() == nil ||
		!strings.Contains(err.Error(), "ws_url: {{token:…}} without a token_request") {
		t.Fatalf("%v, unrunnable %v", err, c.Unrunnable())
	}
	c.Spec.TokenRequest = &schema.TokenRequest{Request: schema.Request{Method: "POST", URL: "https://h/api/v3/userDataStream"}}
	c.SpecErr = nil
	if back, err := DecodeConnection(EncodeConnection(c)); err != nil || back.Unrunnable() != nil {
		t.Fatalf("with a token_request: %v %v", err, back.Unrunnable())
	}
}
