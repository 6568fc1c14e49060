package stream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sockfleet/sockfleet/shared/schema"
)

// token is one answer of the spec's token_request: its JSON fields fill the
// {{token:PATH}} references of the socket it was fetched for, and its expiry (if
// the spec names one) rotates that socket before it.
type token struct {
	doc     any       // the decoded answer
	expires time.Time // zero: none
}

// Bounds of an expires field: below the first (about 3 years), seconds from the
// answer; from the second on, unix epoch milliseconds. Between is neither (seconds
// since the epoch, say), and refused rather than guessed.
const (
	expiresMaxSeconds = 1e8
	expiresMinEpochMs = 1e12
)

// fetchToken makes the token_request (nil when the spec has none) and checks that
// every {{token:PATH}} the spec uses is in the answer, so a missing field stops
// the dial with the path named rather than sending an empty value.
func (s *Stream) fetchToken(ctx context.Context, seq int64) (*token, error) {
	tr := s.set.spec.TokenRequest
	if tr == nil {
		return nil, nil
	}
	tok, err := s.requestToken(ctx, tr, seq)
	if err != nil {
		s.cfg.Metrics.TokenErrors.Add(1)
		return nil, err
	}
	return tok, nil
}

func (s *Stream) requestToken(ctx context.Context, tr *schema.TokenRequest, seq int64) (*token, error) {
	at := time.Now()
	data, err := s.call(ctx, schema.AttrTokenRequest, tr.Request, nil, seq, schema.MaxTokenResponse)
	if err != nil {
		return nil, err
	}
	tok := &token{}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(&tok.doc); err != nil {
		return nil, fmt.Errorf("%s: the answer is not JSON", schema.AttrTokenRequest)
	}
	for _, use := range s.tokenUses() {
		for _, p := range schema.TokenRefs(use.tmpl) {
			if _, err := tok.value(p); err != nil {
				return nil, fmt.Errorf("%s: the answer has no field %s (used in %s)", schema.AttrTokenRequest, p, use.where)
			}
		}
	}
	if tr.Expires != "" {
		if tok.expires, err = tok.expiry(tr.Expires, at); err != nil {
			return nil, fmt.Errorf("%s: %s: %w", schema.AttrTokenRequest, schema.FieldExpires, err)
		}
	}
	return tok, nil
}

type tokenUse struct{ where, tmpl string }

// tokenUses lists every template of the spec (and ws_url) that may hold {{token:…}}.
func (s *Stream) tokenUses() []tokenUse {
	sp := s.set.spec
	uses := []tokenUse{{schema.AttrWSURL, s.URL()}}
	for k, v := range sp.Headers {
		uses = append(uses, tokenUse{schema.AttrHeaders + "." + k, v})
	}
	for i, m := range sp.OpenMessages {
		uses = append(uses, tokenUse{fmt.Sprintf("%s[%d]", schema.AttrOpenMessages, i), m.Text})
	}
	if sp.Keepalive != nil {
		uses = append(uses, tokenUse{schema.AttrKeepalive, sp.Keepalive.Message})
	}
	add := func(where string, r schema.Request) {
		uses = append(uses, tokenUse{where, r.URL}, tokenUse{where, r.Body})
		for _, v := range r.Headers {
			uses = append(uses, tokenUse{where, v})
		}
	}
	if r := sp.TokenRequest.Refresh; r != nil {
		add(schema.AttrTokenRequest+"."+schema.FieldRefresh, r.Request)
	}
	if sn := sp.Snapshot; sn != nil {
		add(schema.AttrSnapshot, sn.Request)
	}
	return uses
}

// value returns the field at path as text: a string as is, anything else as JSON.
func (t *token) value(path string) (string, error) {
	cur := t.doc
	for f := range strings.SplitSeq(path, ".") {
		switch v := cur.(type) {
		case map[string]any:
			next, ok := v[f]
			if !ok {
				return "", errNoField
			}
			cur = next
		case []any:
			i, err := strconv.Atoi(f)
			if err != nil || i < 0 || i >= len(v) {
				return "", errNoField
			}
			cur = v[i]
		default:
			return "", errNoField
		}
	}
	switch v := cur.(type) {
	case string:
		return v, nil
	case nil:
		return "", errNoField
	}
	b, _ := json.Marshal(cur) // decoded JSON always encodes
	return string(b), nil
}

var errNoField = errors.New("no such field")

// expiry reads the expiry at path: a number (or a string of one) of seconds from
// at, below 10^8, or of unix milliseconds, from 10^12 on. The error never quotes
// the value of anything but a number.
func (t *token) expiry(path string, at time.Time) (time.Time, error) {
	v, err := t.value(path)
	if err != nil {
		return time.Time{}, fmt.Errorf("the answer has no field %s", path)
	}
	n, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("field %s is not a number", path)
	}
	switch {
	case n <= 0:
		return time.Time{}, fmt.Errorf("field %s: %v: must be positive", path, n)
	case n < expiresMaxSeconds:
		return at.Add(time.Duration(n * float64(time.Second))), nil
	case n >= expiresMinEpochMs:
		exp := time.UnixMilli(int64(n))
		if !exp.After(at) {
			return time.Time{}, fmt.Errorf("field %s: %s has passed", path, exp.UTC().Format(time.RFC3339))
		}
		return exp, nil
	}
	return time.Time{}, fmt.Errorf("field %s: %v: want seconds (below 10^8) or epoch milliseconds (10^12 and over)", path, n)
}

// fill replaces v's {{token:PATH}} references (t nil: v as is).
func (t *token) fill(v string) (string, error) {
	if t == nil || !strings.Contains(v, "{{token:") {
		return v, nil
	}
	return schema.ReplaceTokens(v, func(p string) (string, error) {
		val, err := t.value(p)
		if err != nil {
			return "", fmt.Errorf("the %s answer has no field %s", schema.AttrTokenRequest, p)
		}
		return val, nil
	})
}

// refresher repeats the token's refresh request every interval while sock lives;
// the first failure asks for a rotation (a new socket, with a new token).
func (s *Stream) refresher(ctx context.Context, sock *socket, rotate chan<- struct{}) {
	r := s.set.spec.TokenRequest.Refresh
	t := time.NewTicker(r.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		_, err := s.call(ctx, schema.AttrTokenRequest+"."+schema.FieldRefresh, r.Request, sock.tok, sock.from, schema.MaxTokenResponse)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			s.cfg.Metrics.RefreshFailures.Add(1)
			s.setStatus("streaming", fmt.Errorf("%w; rotating to a new socket and token", err))
			s.cfg.Log.Warn("token refresh failed; rotating", "conn", s.id, "err", err)
			select {
			case rotate <- struct{}{}:
			default:
			}
			return
		}
	}
}

// tokenDue is when sock's token expiry asks for a rotation (zero: never): a little
// before it, as max_lifetime does (see rotateAt).
func (s *Stream) tokenDue(sock *socket) time.Time {
	if sock.tok == nil || sock.tok.expires.IsZero() {
		return time.Time{}
	}
	return s.rotateAt(sock.opened, sock.tok.expires.Sub(sock.opened))
}
