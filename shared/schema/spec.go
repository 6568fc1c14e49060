package schema

import (
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Attributes of the per-connection spec, written by the operator on the connection
// item. Every one is optional; an absent one takes the fleet default from the
// worker's environment. docs/CONNECTIONS.md describes each with its console form.
const (
	AttrHeaders       = "headers"        // M of S: handshake headers; values may hold {{secret:NAME}}
	AttrSubprotocols  = "subprotocols"   // L of S (or SS): offered on the handshake
	AttrOpenMessages  = "open_messages"  // L of M: frames sent in order after every connect
	AttrKeepalive     = "keepalive"      // M: an application message sent every interval
	AttrMaxLifetime   = "max_lifetime"   // S (Go duration): rotate the socket before this age
	AttrShutdownMatch = "shutdown_match" // S: a text frame holding this announces the upstream's shutdown
	AttrResume        = "resume"         // S: overrides SOCKFLEET_RESUME
	AttrSeqPath       = "seq_path"       // S: overrides SOCKFLEET_SEQ_PATH
	AttrBadMessages   = "bad_messages"   // S: overrides SOCKFLEET_BAD_MESSAGES
	AttrStart         = "start"          // S: latest | earliest | a sequence; where a first connect starts
	AttrIdleTimeout   = "idle_timeout"   // S (Go duration): no data this long sets status idle
	AttrIdleReconnect = "idle_reconnect" // BOOL: and reconnects
	AttrSeqReset      = "seq_reset"      // S: accept | halt
	AttrMaxSeqJump    = "max_seq_jump"   // N: a sequence further than this past the last is bad
	AttrEpoch         = "seq_epoch"      // N, written by the owner: sequence epoch, +1 on each accepted reset

	// Fields inside an open_messages element and inside keepalive.
	FieldText        = "text"         // S: a text frame (template)
	FieldBinary      = "binary"       // B: a binary frame
	FieldExpect      = "expect"       // S: the reply must contain this substring
	FieldExpectField = "expect_field" // S: PATH=VALUE, the reply's JSON field at PATH must equal VALUE
	FieldTimeout     = "timeout"      // S (Go duration): how long to wait for the expected reply
	FieldMessage     = "message"      // keepalive: S, the frame sent (template)
	FieldInterval    = "interval"     // keepalive: S (Go duration)
	FieldPong        = "pong"         // keepalive: S, a substring some reply must contain
	FieldPongTimeout = "pong_timeout" // keepalive: S (Go duration), default the interval
)

// Spec limits. They keep one item's spec small in memory on a worker that holds
// thousands of connections, and within what a handshake can carry.
const (
	MaxHeaders        = 32
	MaxHeaderValueLen = 8 << 10
	MaxSubprotocols   = 16
	MaxOpenMessages   = 16
	MaxFrameLen       = 64 << 10
	MaxSpecTimeout    = 5 * time.Minute
	MinMaxLifetime    = time.Second
	MinKeepalive      = 100 * time.Millisecond
	MinIdleTimeout    = time.Second
	DefaultOpenWait   = 10 * time.Second
)

// Start positions.
const (
	StartLatest   = "latest"   // no resume parameter on a first connect (the default)
	StartEarliest = "earliest" // resume after 0
)

// Observed statuses the per-connection spec adds (beside connecting, streaming, backoff).
const (
	StatusSeqReset  = "seq_reset"  // halted on a reset of the upstream's numbering; the operator decides
	StatusIdle      = "idle"       // no data message for idle_timeout
	StatusQuotaWait = "quota_wait" // waiting for the per-host connect quota
	StatusInvalid   = "invalid"    // the item is unusable as written (also an owner's: a secret not allowed to the host)
)

// Sequence-reset policies.
const (
	SeqResetAccept = "accept" // start a new epoch and keep delivering (the default)
	SeqResetHalt   = "halt"   // stop and release with status seq_reset
)

// Spec is a connection's own settings, as the operator wrote them. The zero Spec
// means "fleet defaults everywhere".
type Spec struct {
	Headers       map[string]string
	Subprotocols  []string
	OpenMessages  []OpenMessage
	Keepalive     *Keepalive
	MaxLifetime   time.Duration
	ShutdownMatch string
	Resume        string
	SeqPath       string
	BadMessages   string
	Start         string // "", latest, earliest, or a decimal sequence
	IdleTimeout   time.Duration
	IdleReconnect bool
	SeqReset      string
	MaxSeqJump    int64
	TokenRequest  *TokenRequest // token.go
	Snapshot      *Snapshot
	Decode        string // "", deflate, gzip, zlib or permessage-deflate (wire.go)
	Sink          string // "": the fleet's sink; else a destination SOCKFLEET_SINKS_ALLOWED names
}

// OpenMessage is one frame sent after connect, and what its reply must look like.
type OpenMessage struct {
	Text        string // a text frame (template), or
	Binary      []byte // a binary frame
	IsBinary    bool
	Expect      string        // substring the reply must contain; "" with ExpectField "": no reply awaited
	ExpectField string        // PATH=VALUE
	Timeout     time.Duration // wait for the reply; DefaultOpenWait when an expectation is set
}

// Awaits reports whether a reply must arrive before the next frame goes out.
func (m OpenMessage) Awaits() bool { return m.Expect != "" || m.ExpectField != "" }

// Keepalive is an application-level keepalive.
type Keepalive struct {
	Message     string
	Interval    time.Duration
	Pong        string
	PongTimeout time.Duration
}

// Zero reports whether s sets nothing.
func (s Spec) Zero() bool {
	return len(s.Headers) == 0 && len(s.Subprotocols) == 0 && len(s.OpenMessages) == 0 && s.Keepalive == nil &&
		s.MaxLifetime == 0 && s.ShutdownMatch == "" && s.Resume == "" && s.SeqPath == "" && s.BadMessages == "" &&
		s.Start == "" && s.IdleTimeout == 0 && !s.IdleReconnect && s.SeqReset == "" && s.MaxSeqJump == 0 &&
		s.TokenRequest == nil && s.Snapshot == nil && s.Decode == "" && s.Sink == ""
}

// StartSeq returns the sequence a first connect resumes after, and false for
// "latest" (ask for no resume point at all).
func (s Spec) StartSeq() (int64, bool) {
	switch s.Start {
	case "", StartLatest:
		return 0, false
	case StartEarliest:
		return 0, true
	}
	n, _ := strconv.ParseInt(s.Start, 10, 64) // validated
	return n, true
}

// secretRef matches a secret reference. NAME is a Secrets Manager name or ARN (which
// never contains '#' or '}'); #KEY picks a field of a JSON secret.
var secretRef = regexp.MustCompile(`\{\{secret:([^{}#]+)(?:#([^{}]+))?\}\}`)

// SecretRef is one {{secret:NAME}} or {{secret:NAME#KEY}} reference.
type SecretRef struct{ Name, Key string }

// SecretRefs lists the references in v, in order.
func SecretRefs(v string) []SecretRef {
	var out []SecretRef
	for _, m := range secretRef.FindAllStringSubmatch(v, -1) {
		out = append(out, SecretRef{Name: m[1], Key: m[2]})
	}
	return out
}

// ReplaceSecrets replaces every reference in v with get's value for it.
func ReplaceSecrets(v string, get func(SecretRef) (string, error)) (string, error) {
	var err error
	out := secretRef.ReplaceAllStringFunc(v, func(ref string) string {
		m := secretRef.FindStringSubmatch(ref)
		val, gerr := get(SecretRef{Name: m[1], Key: m[2]})
		if gerr != nil && err == nil {
			err = gerr
		}
		return val
	})
	return out, err
}

// Headers the WebSocket handshake sets itself; a spec may not override them.
var handshakeHeaders = map[string]bool{
	"Upgrade": true, "Connection": true, "Sec-Websocket-Key": true, "Sec-Websocket-Version": true,
	"Sec-Websocket-Extensions": true, "Sec-Websocket-Protocol": true, "Host": true,
}

// Validate checks s. The error wraps ErrInvalid and names the attribute (and the
// element or key) and why; it never quotes a header value, which may be a secret.
func (s Spec) Validate() error {
	if len(s.Headers) > MaxHeaders {
		return specErr(AttrHeaders, "%d headers, limit %d", len(s.Headers), MaxHeaders)
	}
	for k, v := range s.Headers {
		if !validToken(k) {
			return specErr(AttrHeaders, "name %q: not an HTTP header name", clip(k))
		}
		if handshakeHeaders[http.CanonicalHeaderKey(k)] {
			return specErr(AttrHeaders, "%s: set by the WebSocket handshake itself (use %s for subprotocols)", k, AttrSubprotocols)
		}
		if len(v) > MaxHeaderValueLen {
			return specErr(AttrHeaders, "%s: value of %d bytes, limit %d", k, len(v), MaxHeaderValueLen)
		}
		if strings.ContainsAny(v, "\r\n\x00") {
			return specErr(AttrHeaders, "%s: value holds a line break or NUL", k)
		}
		if err := checkRefs(v); err != nil {
			return specErr(AttrHeaders, "%s: %v", k, err)
		}
	}
	if len(s.Subprotocols) > MaxSubprotocols {
		return specErr(AttrSubprotocols, "%d entries, limit %d", len(s.Subprotocols), MaxSubprotocols)
	}
	for i, p := range s.Subprotocols {
		if !validToken(p) {
			return specErr(AttrSubprotocols, "[%d] %q: not a token", i, clip(p))
		}
	}
	if len(s.OpenMessages) > MaxOpenMessages {
		return specErr(AttrOpenMessages, "%d frames, limit %d", len(s.OpenMessages), MaxOpenMessages)
	}
	for i, m := range s.OpenMessages {
		if err := m.validate(); err != nil {
			return specErr(AttrOpenMessages, "[%d]: %v", i, err)
		}
	}
	if k := s.Keepalive; k != nil {
		if err := k.validate(); err != nil {
			return specErr(AttrKeepalive, "%v", err)
		}
	}
	if s.MaxLifetime != 0 && s.MaxLifetime < MinMaxLifetime {
		return specErr(AttrMaxLifetime, "%s: at least %s", s.MaxLifetime, MinMaxLifetime)
	}
	if len(s.ShutdownMatch) > 256 {
		return specErr(AttrShutdownMatch, "%d bytes, limit 256", len(s.ShutdownMatch))
	}
	if err := CheckResume(s.Resume); s.Resume != "" && err != nil {
		return specErr(AttrResume, "%v", err)
	}
	if err := CheckSeqPath(s.SeqPath); err != nil {
		return specErr(AttrSeqPath, "%v", err)
	}
	switch s.BadMessages {
	case "", "count", "skip", "pass":
	default:
		return specErr(AttrBadMessages, "%q: want count, skip or pass", clip(s.BadMessages))
	}
	switch s.Start {
	case "", StartLatest, StartEarliest:
	default:
		if n, err := strconv.ParseInt(s.Start, 10, 64); err != nil || n < 0 {
			return specErr(AttrStart, "%q: want latest, earliest or a non-negative sequence", clip(s.Start))
		}
	}
	if s.IdleTimeout != 0 && s.IdleTimeout < MinIdleTimeout {
		return specErr(AttrIdleTimeout, "%s: at least %s", s.IdleTimeout, MinIdleTimeout)
	}
	if s.IdleReconnect && s.IdleTimeout == 0 {
		return specErr(AttrIdleReconnect, "set without %s", AttrIdleTimeout)
	}
	switch s.SeqReset {
	case "", SeqResetAccept, SeqResetHalt:
	default:
		return specErr(AttrSeqReset, "%q: want %s or %s", clip(s.SeqReset), SeqResetAccept, SeqResetHalt)
	}
	if s.MaxSeqJump < 0 {
		return specErr(AttrMaxSeqJump, "%d: must not be negative", s.MaxSeqJump)
	}
	if err := s.validateRequests(); err != nil {
		return err
	}
	return s.validateWire()
}

func (m OpenMessage) validate() error {
	n := len(m.Text)
	if m.IsBinary {
		n = len(m.Binary)
		if m.Text != "" {
			return fmt.Errorf("both %s and %s", FieldText, FieldBinary)
		}
	} else if m.Text == "" {
		return fmt.Errorf("want %s or %s", FieldText, FieldBinary)
	}
	if n > MaxFrameLen {
		return fmt.Errorf("frame of %d bytes, limit %d", n, MaxFrameLen)
	}
	if err := checkRefs(m.Text); err != nil {
		return err
	}
	if m.ExpectField != "" {
		path, _, ok := strings.Cut(m.ExpectField, "=")
		if !ok {
			return fmt.Errorf("%s %q: want PATH=VALUE", FieldExpectField, clip(m.ExpectField))
		}
		if err := CheckSeqPath(path); err != nil || path == "" {
			return fmt.Errorf("%s %q: bad path", FieldExpectField, clip(m.ExpectField))
		}
	}
	if m.Timeout < 0 || m.Timeout > MaxSpecTimeout {
		return fmt.Errorf("%s %s: want 0 to %s", FieldTimeout, m.Timeout, MaxSpecTimeout)
	}
	if m.Timeout != 0 && !m.Awaits() {
		return fmt.Errorf("%s set without %s or %s", FieldTimeout, FieldExpect, FieldExpectField)
	}
	return nil
}

func (k Keepalive) validate() error {
	if k.Message == "" {
		return fmt.Errorf("%s: missing", FieldMessage)
	}
	if len(k.Message) > MaxFrameLen {
		return fmt.Errorf("%s of %d bytes, limit %d", FieldMessage, len(k.Message), MaxFrameLen)
	}
	if k.Interval < MinKeepalive || k.Interval > MaxSpecTimeout {
		return fmt.Errorf("%s %s: want %s to %s", FieldInterval, k.Interval, MinKeepalive, MaxSpecTimeout)
	}
	if k.PongTimeout < 0 || k.PongTimeout > MaxSpecTimeout {
		return fmt.Errorf("%s %s: want 0 to %s", FieldPongTimeout, k.PongTimeout, MaxSpecTimeout)
	}
	if k.PongTimeout != 0 && k.Pong == "" {
		return fmt.Errorf("%s set without %s", FieldPongTimeout, FieldPong)
	}
	return checkRefs(k.Message)
}

// checkRefs refuses a value that looks like a secret reference but is not one, so a
// typo is an error rather than a literal "{{secret:…" sent upstream.
func checkRefs(v string) error {
	rest := secretRef.ReplaceAllString(v, "")
	if strings.Contains(rest, "{{secret:") {
		return fmt.Errorf("malformed {{secret:NAME}} reference")
	}
	return nil
}

// CheckResume checks a resume spec's syntax: query:NAME=TEMPLATE,
// header:NAME=TEMPLATE or none (the worker's stream package parses it the same way).
func CheckResume(spec string) error {
	if spec == "none" {
		return nil
	}
	kind, rest, ok := strings.Cut(spec, ":")
	if !ok || (kind != "query" && kind != "header") {
		return fmt.Errorf("%q: want query:NAME=TEMPLATE, header:NAME=TEMPLATE or none", clip(spec))
	}
	name, tmpl, ok := strings.Cut(rest, "=")
	if !ok || name == "" || tmpl == "" {
		return fmt.Errorf("%q: want %s:NAME=TEMPLATE", clip(spec), kind)
	}
	if kind == "header" && !validToken(name) {
		return fmt.Errorf("%q: bad header name", clip(spec))
	}
	return nil
}

// CheckSeqPath checks a dot-separated JSON field path ("" is the counter).
func CheckSeqPath(p string) error {
	if p == "" {
		return nil
	}
	for f := range strings.SplitSeq(p, ".") {
		if f == "" {
			return fmt.Errorf("%q: empty field", clip(p))
		}
	}
	return nil
}

// validToken reports whether s is an RFC 7230 token (header names, subprotocols).
func validToken(s string) bool {
	if s == "" || len(s) > 256 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

func specErr(attr, format string, args ...any) error {
	return fmt.Errorf("%w %s: %s", ErrInvalid, attr, fmt.Sprintf(format, args...))
}
