package codec

import (
	"errors"
	"strings"
	"testing"

	"github.com/sockfleet/sockfleet/shared/schema"
)

func TestDecodeAndSinkRoundTrip(t *testing.T) {
	for _, sp := range []schema.Spec{
		{Decode: schema.DecodeDeflate, Sink: "okx-trades"},
		{Decode: schema.DecodeGzip, Sink: "arn:aws:kinesis:eu-west-1:123456789012:stream/huobi.book"},
		{Decode: schema.DecodeZlib, Sink: "file:/var/feeds/a.jsonl"},
		{Decode: schema.DecodePermessageDeflate},
	} {
		c := Connection{ID: "c1", DesiredState: schema.Started, WSURL: "wss://h/x", Spec: sp}
		got, err := DecodeConnection(EncodeConnection(c))
		if err != nil {
			t.Fatal(err)
		}
		if got.Spec.Decode != sp.Decode || got.Spec.Sink != sp.Sink || got.Spec.Zero() {
			t.Fatalf("round trip: got %+v, want %+v", got.Spec, sp)
		}
	}
	sp, err := SpecFromJSON([]byte(`{"decode":"gzip","sink":"feeds-a"}`))
	if err != nil || sp.Decode != "gzip" || sp.Sink != "feeds-a" {
		t.Fatalf("from JSON: %+v, %v", sp, err)
	}
}

func TestDecodeAndSinkRejected(t *testing.T) {
	cases := []struct {
		name, attr string
		val        string
		want       string
	}{
		{"unknown decode", schema.AttrDecode, "brotli", `decode: "brotli": want deflate, gzip, zlib or permessage-deflate`},
		{"decode case", schema.AttrDecode, "GZIP", `decode: "GZIP"`},
		{"sink empty file", schema.AttrSink, "file:", "sink: \"file:\": empty file path"},
		{"sink bad name", schema.AttrSink, "my stream", `sink: "my stream": want a Kinesis stream name`},
		{"sink long name", schema.AttrSink, strings.Repeat("a", 129), "want a Kinesis stream name"},
		{"sink bad arn", schema.AttrSink, "arn:aws:sqs:eu-west-1:123456789012:q", "not a Kinesis stream ARN"},
		{"sink huge", schema.AttrSink, "file:" + strings.Repeat("a", schema.MaxSinkLen), "limit 2048"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			it := goodItem()
			it[tc.attr] = S(tc.val)
			c, err := DecodeConnection(it)
			if !errors.Is(err, schema.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one saying %q", err, tc.want)
			}
			if c.Unrunnable() == nil {
				t.Fatal("runnable")
			}
		})
	}
	it := goodItem()
	it[schema.AttrDecode] = N(1)
	if _, err := DecodeConnection(it); err == nil || !strings.Contains(err.Error(), "decode: type N, want S") {
		t.Fatalf("number decode: %v", err)
	}
}

func TestParseSinksAllowed(t *testing.T) {
	got, err := schema.ParseSinksAllowed(" a, b  file:/tmp/x,a,arn:aws:kinesis:us-east-1:123456789012:stream/c ")
	if err != nil || strings.Join(got, "|") != "a|b|file:/tmp/x|arn:aws:kinesis:us-east-1:123456789012:stream/c" {
		t.Fatalf("%q, %v", got, err)
	}
	if got, err := schema.ParseSinksAllowed(""); err != nil || got != nil {
		t.Fatalf("empty: %q, %v", got, err)
	}
	if _, err := schema.ParseSinksAllowed("a,b/c"); err == nil || !strings.Contains(err.Error(), "b/c") {
		t.Fatalf("bad entry: %v", err)
	}
}
