package schema

import (
	"fmt"
	"regexp"
	"strings"
)

// Attributes of the spec that shape a connection's payloads and where they go
// (issue 23): decoding of compressed frames, and a sink of its own.
const (
	AttrDecode = "decode" // S: deflate | gzip | zlib | permessage-deflate
	AttrSink   = "sink"   // S: a Kinesis stream name or ARN, or file:PATH, among SOCKFLEET_SINKS_ALLOWED
)

// Decodings a spec may ask for. The first three decompress each binary frame before
// its sequence is read; permessage-deflate is negotiated on the handshake instead
// (RFC 7692), and the WebSocket library inflates every frame the server compressed.
const (
	DecodeDeflate           = "deflate" // raw DEFLATE (RFC 1951), as OKX sends it
	DecodeGzip              = "gzip"    // RFC 1952, as Huobi sends it
	DecodeZlib              = "zlib"    // RFC 1950
	DecodePermessageDeflate = "permessage-deflate"
)

// FrameDecode reports whether d decompresses frames itself (rather than
// negotiating the extension).
func FrameDecode(d string) bool {
	return d == DecodeDeflate || d == DecodeGzip || d == DecodeZlib
}

// MaxSinkLen bounds a sink attribute (an ARN is at most 2048 bytes).
const MaxSinkLen = 2048

// Kinesis stream names and ARNs, as the Kinesis API defines them.
var (
	kinesisName = regexp.MustCompile(`^[a-zA-Z0-9_.-]{1,128}$`)
	kinesisARN  = regexp.MustCompile(`^arn:aws[a-z-]*:kinesis:[a-z0-9-]+:[0-9]{12}:stream/[a-zA-Z0-9_.-]{1,128}$`)
)

// CheckSinkName checks a sink destination's syntax: a Kinesis stream name, a
// Kinesis stream ARN, or file:PATH. Whether the fleet allows it is the worker's
// to say (SOCKFLEET_SINKS_ALLOWED).
func CheckSinkName(v string) error {
	switch {
	case v == "":
		return fmt.Errorf("empty")
	case len(v) > MaxSinkLen:
		return fmt.Errorf("%d bytes, limit %d", len(v), MaxSinkLen)
	case strings.HasPrefix(v, "file:"):
		if len(v) == len("file:") {
			return fmt.Errorf("%q: empty file path", v)
		}
		if strings.ContainsAny(v, "\r\n\x00") {
			return fmt.Errorf("file path holds a line break or NUL")
		}
		return nil
	case strings.HasPrefix(v, "arn:"):
		if !kinesisARN.MatchString(v) {
			return fmt.Errorf("%q: not a Kinesis stream ARN (arn:aws:kinesis:REGION:ACCOUNT:stream/NAME)", clip(v))
		}
		return nil
	case kinesisName.MatchString(v):
		return nil
	}
	return fmt.Errorf("%q: want a Kinesis stream name (letters, digits, _ . -, up to 128), a stream ARN or file:PATH", clip(v))
}

// ParseSinksAllowed reads SOCKFLEET_SINKS_ALLOWED: destinations (as CheckSinkName
// takes them) separated by commas or white space. "" allows none.
func ParseSinksAllowed(v string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	for _, f := range strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' || r == '\n' }) {
		if err := CheckSinkName(f); err != nil {
			return nil, fmt.Errorf("%s: %w", clip(f), err)
		}
		if !seen[f] {
			seen[f] = true
			out = append(out, f)
		}
	}
	return out, nil
}

// validateWire checks the decode and sink attributes.
func (s Spec) validateWire() error {
	switch s.Decode {
	case "", DecodeDeflate, DecodeGzip, DecodeZlib, DecodePermessageDeflate:
	default:
		return specErr(AttrDecode, "%q: want %s, %s, %s or %s", clip(s.Decode),
			DecodeDeflate, DecodeGzip, DecodeZlib, DecodePermessageDeflate)
	}
	if s.Sink != "" {
		if err := CheckSinkName(s.Sink); err != nil {
			return specErr(AttrSink, "%v", err)
		}
	}
	return nil
}
