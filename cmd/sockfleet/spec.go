package main

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

const specUsage = `conn add flags (a connection's spec; each is optional, see docs/CONNECTIONS.md):
  --stopped                      create it STOPPED
  --spec FILE                    the spec as JSON, with the item's attribute names; flags override it
  --header NAME=VALUE            handshake header (repeatable); VALUE may hold {{secret:NAME}} or {{secret:NAME#KEY}},
                                 sent only if the secret's sockfleet:allowed-hosts tag allows the URL's host
  --subprotocol P                offered subprotocol (repeatable)
  --open-message TEXT            frame sent after every connect (repeatable, in order); {seq} {next} {conn}
  --open-expect SUBSTR           the reply the last --open-message awaits contains SUBSTR
  --open-expect-field PATH=VAL   ... or has the JSON field PATH equal to VAL
  --open-timeout DURATION        how long the last --open-message awaits its reply (default 10s)
  --keepalive TEXT --keepalive-interval DURATION [--keepalive-pong SUBSTR [--keepalive-pong-timeout D]]
  --max-lifetime DURATION        rotate the socket (make-before-break) before this age
  --shutdown-match SUBSTR        a text frame holding SUBSTR announces the upstream's shutdown: rotate
  --resume SPEC --seq-path PATH --bad-messages count|skip|pass
  --start latest|earliest|SEQ    where a first connect starts (default latest)
  --idle-timeout DURATION [--idle-reconnect]
  --seq-reset accept|halt --max-seq-jump N
  --decode deflate|gzip|zlib|permessage-deflate   decompress binary frames, or negotiate the extension
  --sink DEST                    this connection's own sink: a Kinesis stream name or ARN, or file:PATH (among SOCKFLEET_SINKS_ALLOWED)
`

// addArgs parses conn add's arguments: ID, URL and the flags.
func addArgs(args []string) (id, url string, stopped bool, spec schema.Spec, err error) {
	var pos []string
	var fromFile *schema.Spec
	flags := schema.Spec{}
	var openSet bool
	lastOpen := func(flag string) (*schema.OpenMessage, error) {
		if len(flags.OpenMessages) == 0 {
			return nil, fmt.Errorf("%w: %s must follow an --open-message", errUsage, flag)
		}
		return &flags.OpenMessages[len(flags.OpenMessages)-1], nil
	}
	ka := func() *schema.Keepalive {
		if flags.Keepalive == nil {
			flags.Keepalive = &schema.Keepalive{}
		}
		return flags.Keepalive
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "--") {
			pos = append(pos, a)
			continue
		}
		if a == "--stopped" {
			stopped = true
			continue
		}
		if a == "--idle-reconnect" {
			flags.IdleReconnect = true
			continue
		}
		if i+1 >= len(args) {
			return "", "", false, spec, fmt.Errorf("%w: %s needs a value", errUsage, a)
		}
		i++
		v := args[i]
		dur := func() (time.Duration, error) {
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 {
				return 0, fmt.Errorf("%w: %s %q: want a duration such as 30s", errUsage, a, v)
			}
			return d, nil
		}
		var derr error
		switch a {
		case "--spec":
			b, rerr := os.ReadFile(v)
			if rerr != nil {
				return "", "", false, spec, fmt.Errorf("--spec: %w", rerr)
			}
			s, perr := codec.SpecFromJSON(b)
			if perr != nil {
				return "", "", false, spec, fmt.Errorf("--spec %s: %w", v, perr)
			}
			fromFile = &s
		case "--header":
			k, val, ok := strings.Cut(v, "=")
			if !ok || k == "" {
				return "", "", false, spec, fmt.Errorf("%w: --header wants NAME=VALUE", errUsage)
			}
			if flags.Headers == nil {
				flags.Headers = map[string]string{}
			}
			flags.Headers[k] = val
		case "--subprotocol":
			flags.Subprotocols = append(flags.Subprotocols, v)
		case "--open-message":
			flags.OpenMessages = append(flags.OpenMessages, schema.OpenMessage{Text: v})
			openSet = true
		case "--open-expect", "--open-expect-field", "--open-timeout":
			m, lerr := lastOpen(a)
			if lerr != nil {
				return "", "", false, spec, lerr
			}
			switch a {
			case "--open-expect":
				m.Expect = v
			case "--open-expect-field":
				m.ExpectField = v
			default:
				m.Timeout, derr = dur()
			}
		case "--keepalive":
			ka().Message = v
		case "--keepalive-interval":
			ka().Interval, derr = dur()
		case "--keepalive-pong":
			ka().Pong = v
		case "--keepalive-pong-timeout":
			ka().PongTimeout, derr = dur()
		case "--max-lifetime":
			flags.MaxLifetime, derr = dur()
		case "--shutdown-match":
			flags.ShutdownMatch = v
		case "--resume":
			flags.Resume = v
		case "--seq-path":
			flags.SeqPath = v
		case "--bad-messages":
			flags.BadMessages = v
		case "--start":
			flags.Start = v
		case "--idle-timeout":
			flags.IdleTimeout, derr = dur()
		case "--seq-reset":
			flags.SeqReset = v
		case "--decode":
			flags.Decode = v
		case "--sink":
			flags.Sink = v
		case "--max-seq-jump":
			n, perr := strconv.ParseInt(v, 10, 64)
			if perr != nil {
				return "", "", false, spec, fmt.Errorf("%w: --max-seq-jump %q: want an integer", errUsage, v)
			}
			flags.MaxSeqJump = n
		default:
			return "", "", false, spec, fmt.Errorf("%w: unknown flag %s", errUsage, a)
		}
		if derr != nil {
			return "", "", false, spec, derr
		}
	}
	if len(pos) != 2 {
		return "", "", false, spec, fmt.Errorf("%w: conn add ID URL [flags]", errUsage)
	}
	if fromFile != nil {
		spec = *fromFile
	}
	merge(&spec, flags, openSet)
	// Validate through the codec, exactly as the worker will read the item.
	it := codec.Item{}
	codec.EncodeSpec(it, spec)
	if spec, err = codec.DecodeSpec(it); err != nil {
		return "", "", false, spec, err
	}
	return pos[0], pos[1], stopped, spec, nil
}

// merge lays the flags over a spec file's values.
func merge(dst *schema.Spec, f schema.Spec, openSet bool) {
	for k, v := range f.Headers {
		if dst.Headers == nil {
			dst.Headers = map[string]string{}
		}
		dst.Headers[k] = v
	}
	if len(f.Subprotocols) > 0 {
		dst.Subprotocols = f.Subprotocols
	}
	if openSet {
		dst.OpenMessages = f.OpenMessages
	}
	if f.Keepalive != nil {
		dst.Keepalive = f.Keepalive
	}
	set := func(d *string, v string) {
		if v != "" {
			*d = v
		}
	}
	setD := func(d *time.Duration, v time.Duration) {
		if v != 0 {
			*d = v
		}
	}
	setD(&dst.MaxLifetime, f.MaxLifetime)
	set(&dst.ShutdownMatch, f.ShutdownMatch)
	set(&dst.Resume, f.Resume)
	set(&dst.SeqPath, f.SeqPath)
	set(&dst.BadMessages, f.BadMessages)
	set(&dst.Start, f.Start)
	setD(&dst.IdleTimeout, f.IdleTimeout)
	dst.IdleReconnect = dst.IdleReconnect || f.IdleReconnect
	set(&dst.SeqReset, f.SeqReset)
	set(&dst.Decode, f.Decode)
	set(&dst.Sink, f.Sink)
	if f.MaxSeqJump != 0 {
		dst.MaxSeqJump = f.MaxSeqJump
	}
}

// describeSpec summarises a spec for the CLI's output. It names headers but never
// shows their values, which may be credentials.
func describeSpec(s schema.Spec) string {
	if s.Zero() {
		return ""
	}
	var parts []string
	if len(s.Headers) > 0 {
		names := make([]string, 0, len(s.Headers))
		for k := range s.Headers {
			names = append(names, k)
		}
		slices.Sort(names)
		parts = append(parts, "headers "+strings.Join(names, ","))
	}
	if len(s.Subprotocols) > 0 {
		parts = append(parts, "subprotocols "+strings.Join(s.Subprotocols, ","))
	}
	if n := len(s.OpenMessages); n > 0 {
		parts = append(parts, fmt.Sprintf("%d open message(s)", n))
	}
	if k := s.Keepalive; k != nil {
		parts = append(parts, "keepalive every "+k.Interval.String())
	}
	if s.MaxLifetime > 0 {
		parts = append(parts, "max_lifetime "+s.MaxLifetime.String())
	}
	for _, kv := range [][2]string{{"shutdown_match", s.ShutdownMatch}, {"resume", s.Resume}, {"seq_path", s.SeqPath},
		{"bad_messages", s.BadMessages}, {"start", s.Start}, {"seq_reset", s.SeqReset},
		{"decode", s.Decode}, {"sink", s.Sink}} {
		if kv[1] != "" {
			parts = append(parts, kv[0]+" "+kv[1])
		}
	}
	if s.IdleTimeout > 0 {
		parts = append(parts, "idle_timeout "+s.IdleTimeout.String())
	}
	if s.MaxSeqJump > 0 {
		parts = append(parts, "max_seq_jump "+strconv.FormatInt(s.MaxSeqJump, 10))
	}
	// A request is shown by method and URL, its query redacted; never its headers or body.
	req := func(r schema.Request) string {
		m := r.Method
		if m == "" {
			m = "GET"
		}
		return m + " " + schema.RedactURL(r.URL)
	}
	if t := s.TokenRequest; t != nil {
		parts = append(parts, "token_request "+req(t.Request))
		if t.Refresh != nil {
			parts = append(parts, "refresh every "+t.Refresh.Interval.String())
		}
	}
	if sn := s.Snapshot; sn != nil {
		parts = append(parts, "snapshot "+req(sn.Request))
	}
	return "; spec: " + strings.Join(parts, "; ")
}
