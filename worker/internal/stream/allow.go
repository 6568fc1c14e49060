package stream

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sockfleet/sockfleet/shared/schema"
)

// dialAddr returns the host:port the dialer connects to for a ws or wss URL: the
// URL's host, with the scheme's default port when it names none (gorilla/websocket
// dials exactly this, directly or through a CONNECT proxy, and follows no redirect:
// a 3xx answer is a failed handshake). A secret is sent only where its allowance
// admits this address.
func dialAddr(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("%w %s: %v", schema.ErrInvalid, schema.AttrWSURL, schema.URLParseError(err))
	}
	port := u.Port()
	if port == "" {
		switch u.Scheme {
		case "wss":
			port = "443"
		case "ws":
			port = "80"
		}
	}
	if u.Hostname() == "" || port == "" {
		return "", fmt.Errorf("%w %s: no host or scheme to dial", schema.ErrInvalid, schema.AttrWSURL)
	}
	return net.JoinHostPort(u.Hostname(), port), nil
}

// checkSecrets resolves every secret reference the spec may send on a socket to
// dest (handshake headers, open messages, the keepalive) before that socket is
// dialed, so a secret its owner did not allow to dest stops the connection before
// a single byte goes out, rather than after the handshake carried the headers. The
// values are discarded here; the cache keeps them for the expansions that follow.
func (s *Stream) checkSecrets(ctx context.Context, dest string) error {
	sp := s.set.spec
	tmpls := make([]string, 0, len(sp.Headers)+len(sp.OpenMessages)+1)
	for _, v := range sp.Headers {
		tmpls = append(tmpls, v)
	}
	for _, m := range sp.OpenMessages {
		tmpls = append(tmpls, m.Text)
	}
	if sp.Keepalive != nil {
		tmpls = append(tmpls, sp.Keepalive.Message)
	}
	for _, v := range tmpls {
		// After the placeholders, as expand sees it: {conn} could spell a reference.
		for _, ref := range schema.SecretRefs(s.placeholders(v, 0)) {
			if s.cfg.Secrets == nil {
				return fmt.Errorf("the spec references secret %s but the worker has no secrets source", ref.Name)
			}
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := s.cfg.Secrets.Resolve(rctx, ref, dest)
			cancel()
			if err != nil {
				s.cfg.Metrics.SecretErrors.Add(1)
				return fmt.Errorf("resolve secret: %w", err)
			}
		}
	}
	return nil
}

// placeholders fills a template's {seq} (the resume point), {next} ({seq}+1) and
// {conn} (the connection id).
func (s *Stream) placeholders(v string, seq int64) string {
	if !strings.ContainsRune(v, '{') {
		return v
	}
	return strings.NewReplacer("{seq}", strconv.FormatInt(seq, 10), "{next}", strconv.FormatInt(seq+1, 10),
		"{conn}", s.id).Replace(v)
}
