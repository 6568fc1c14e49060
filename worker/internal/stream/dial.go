package stream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/gorilla/websocket"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/tracing"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// permanentError is a failure retrying soon cannot fix.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return "permanent: " + e.err.Error() }

func (e *permanentError) Unwrap() error { return e.err }

// connect dials, sends the open messages and awaits their replies.
func (s *Stream) connect(ctx context.Context, from int64, resumed bool) (*socket, error) {
	if s.set.spec.Snapshot != nil && s.set.seqPath.Counter() {
		return nil, fmt.Errorf("%w %s: needs a %s (the sequence its deltas are dropped at or below)", schema.ErrInvalid, schema.AttrSnapshot, schema.AttrSeqPath)
	}
	tok, err := s.fetchToken(ctx, from) // token.go; nil without a token_request
	if err != nil {
		return nil, err
	}
	raw, err := tok.fill(s.URL())
	if err != nil {
		return nil, fmt.Errorf("%w %s: %w", schema.ErrInvalid, schema.AttrWSURL, err)
	}
	dest, err := dialAddr(raw)
	if err != nil {
		return nil, err
	}
	if err := s.checkSink(); err != nil {
		return nil, err // not dialed: its messages would have nowhere to go
	}
	if err := s.checkSecrets(ctx, dest); err != nil {
		return nil, err // not dialed: no secret leaves for a host its owner did not allow
	}
	// Spans around the dial and the open messages until the stream first opened, as
	// children of the connection's session span: the ownership path from the acquire
	// to the first delivery. Later sockets (reconnects, rotations) get none: an
	// upstream down for hours must not make a span per retry.
	tr := tracer
	if s.traced.Load() {
		tr = untraced
	}
	dctx, span := tr.Start(ctx, "stream.dial", trace.WithAttributes(tracing.Conn(s.id),
		attribute.String("server.address", dest), attribute.Int64("sockfleet.resume_from", from), attribute.Bool("sockfleet.resumed", resumed)))
	conn, err := s.dial(dctx, raw, dest, from, resumed, tok)
	endSpan(span, err)
	if err != nil {
		return nil, err
	}
	sock := &socket{conn: conn, dest: dest, from: from, resumed: resumed, opened: time.Now(), tok: tok}
	s.sockets.Add(1)
	octx, span := tr.Start(ctx, "stream.open", trace.WithAttributes(tracing.Conn(s.id),
		attribute.Int("sockfleet.open_messages", len(s.set.spec.OpenMessages))))
	err = s.open(octx, sock)
	endSpan(span, err)
	if err != nil {
		s.cfg.Metrics.OpenFailures.Add(1)
		s.closeSocket(sock)
		return nil, err
	}
	sock.lastPong.Store(time.Now().UnixNano())
	s.traced.Store(true)
	return sock, nil
}

var (
	tracer   = tracing.Tracer("worker/internal/stream")
	untraced = noop.NewTracerProvider().Tracer("")
)

// endSpan ends span, recording err if any.
func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "failed")
	}
	span.End()
}

// dial makes the handshake to raw (at dest): resume point, the spec's headers
// (secrets substituted) and subprotocols, after the per-host connect quota admits it.
func (s *Stream) dial(ctx context.Context, raw, dest string, from int64, resumed bool, tok *token) (*websocket.Conn, error) {
	target, hdr := raw, http.Header{}
	if resumed {
		t, h, err := s.set.resume.Apply(raw, from)
		if err != nil {
			return nil, &permanentError{err}
		}
		target = t
		for k, v := range h {
			hdr[k] = v
		}
	}
	spec := s.set.spec
	for k, v := range spec.Headers {
		val, err := s.expand(ctx, v, from, dest, tok)
		if err != nil {
			return nil, fmt.Errorf("header %s: %w", k, err)
		}
		if hdr.Get(k) == "" {
			hdr.Set(k, val)
		}
	}
	admitted, err := s.waitQuota(ctx, target)
	if err != nil {
		return nil, err
	}
	d := *s.cfg.Dialer
	d.Subprotocols = spec.Subprotocols
	d.EnableCompression = spec.Decode == schema.DecodePermessageDeflate
	dctx, cancel := context.WithTimeout(ctx, s.cfg.HandshakeTimeout)
	conn, resp, err := d.DialContext(dctx, target, hdr)
	cancel()
	admitted()
	if err == nil {
		return conn, nil
	}
	s.cfg.Metrics.DialFailures.Add(1)
	if resp == nil {
		return nil, fmt.Errorf("dial: %w", err)
	}
	code := resp.StatusCode
	err = fmt.Errorf("dial: handshake status %d: %w", code, err)
	if code == http.StatusTooManyRequests || code == http.StatusTeapot {
		return nil, s.rateLimited(ctx, hostOf(target), resp.Header.Get("Retry-After"), err)
	}
	if (code == http.StatusUnauthorized || code == http.StatusForbidden) && (s.forgetSecrets() || tok != nil) {
		// The credential may have been rotated: the next dial reads it again (and
		// fetches a new token), and this failure is not treated as permanent.
		return nil, err
	}
	if code >= 400 && code < 500 && code != http.StatusRequestTimeout && code != http.StatusTooManyRequests {
		return nil, &permanentError{err}
	}
	return nil, err
}

// forgetSecrets drops the cached values of every secret the spec references, and
// reports whether there were any.
func (s *Stream) forgetSecrets() bool {
	if s.cfg.Secrets == nil {
		return false
	}
	any := false
	forget := func(v string) {
		for _, r := range schema.SecretRefs(v) {
			s.cfg.Secrets.Forget(r.Name)
			any = true
		}
	}
	for _, v := range s.set.spec.Headers {
		forget(v)
	}
	for _, m := range s.set.spec.OpenMessages {
		forget(m.Text)
	}
	return any
}

// expand fills a template sent to dest: {seq} (the resume point), {next} ({seq}+1),
// {conn} (the connection id), then {{secret:…}} references, then {{token:PATH}}
// from tok (last, so no value from the token's answer is read as a reference).
func (s *Stream) expand(ctx context.Context, v string, seq int64, dest string, tok *token) (string, error) {
	v = s.placeholders(v, seq)
	if !strings.Contains(v, "{{secret:") {
		return tok.fill(v)
	}
	if s.cfg.Secrets == nil {
		return "", errors.New("the spec references a secret but the worker has no secrets source")
	}
	out, err := schema.ReplaceSecrets(v, func(r schema.SecretRef) (string, error) {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return s.cfg.Secrets.Resolve(rctx, r, dest)
	})
	if err != nil {
		s.cfg.Metrics.SecretErrors.Add(1)
		return "", fmt.Errorf("resolve secret: %w", err)
	}
	return tok.fill(out)
}

// open sends the spec's open messages in order, each awaiting its reply if it
// expects one. Frames that are not the awaited reply are kept for the reader.
func (s *Stream) open(ctx context.Context, sock *socket) error {
	msgs := s.set.spec.OpenMessages
	if len(msgs) == 0 {
		return nil
	}
	conn := sock.conn
	stop := context.AfterFunc(ctx, func() { _ = conn.NetConn().SetDeadline(time.Now()) })
	defer stop()
	for i, m := range msgs {
		kind, data := websocket.BinaryMessage, m.Binary
		if !m.IsBinary {
			text, err := s.expand(ctx, m.Text, sock.from, sock.dest, sock.tok)
			if err != nil {
				return fmt.Errorf("%s[%d]: %w", schema.AttrOpenMessages, i, err)
			}
			kind, data = websocket.TextMessage, []byte(text)
		}
		_ = conn.SetWriteDeadline(time.Now().Add(s.cfg.WriteWait))
		if err := conn.WriteMessage(kind, data); err != nil {
			return fmt.Errorf("%s[%d]: send: %w", schema.AttrOpenMessages, i, err)
		}
		if !m.Awaits() {
			continue
		}
		wait := m.Timeout
		if wait == 0 {
			wait = schema.DefaultOpenWait
		}
		deadline := time.Now().Add(wait)
		for {
			_ = conn.SetReadDeadline(deadline)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			f, err := readFrame(conn, s.cfg.ReadLimit)
			if err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() && ctx.Err() == nil {
					return fmt.Errorf("%s[%d]: no reply %s within %s", schema.AttrOpenMessages, i, describe(m), wait)
				}
				return fmt.Errorf("%s[%d]: awaiting reply: %w", schema.AttrOpenMessages, i, classifyReadErr(err))
			}
			f = decodeFrame(f, s.set.spec.Decode, s.cfg.ReadLimit)
			if replyMatches(m, f) {
				break
			}
			if len(sock.pending) >= 1024 {
				return fmt.Errorf("%s[%d]: 1024 frames without the reply %s", schema.AttrOpenMessages, i, describe(m))
			}
			sock.pending = append(sock.pending, f)
		}
	}
	return nil
}

func describe(m schema.OpenMessage) string {
	if m.ExpectField != "" {
		return "with " + m.ExpectField
	}
	return fmt.Sprintf("containing %q", m.Expect)
}

// replyMatches reports whether f is the reply m awaits.
func replyMatches(m schema.OpenMessage, f frame) bool {
	if m.Expect != "" && !bytes.Contains(f.data, []byte(m.Expect)) {
		return false
	}
	if m.ExpectField != "" {
		path, want, _ := strings.Cut(m.ExpectField, "=")
		p, _ := ParseSeqPath(path)
		got, ok := p.field(f.data)
		if !ok {
			return false
		}
		var str string
		if json.Unmarshal(got, &str) == nil {
			return str == want
		}
		return string(bytes.TrimSpace(got)) == want
	}
	return true
}
