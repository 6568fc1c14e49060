package schema

import (
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"time"
)

// Attributes and fields of the REST requests a spec may make around its socket:
// token_request (before each dial) and snapshot (after each connect and, with
// on_gap resync, after a forward gap). docs/CONNECTIONS.md describes each.
const (
	AttrTokenRequest = "token_request" // M: a request made before each dial; its JSON answer fills {{token:PATH}}
	AttrSnapshot     = "snapshot"      // M: a request whose answer is delivered as a snapshot record

	FieldMethod  = "method"   // S: GET (the default), POST, PUT, PATCH or DELETE
	FieldURL     = "url"      // S: http(s) URL (template; the scheme and host are literal)
	FieldHeaders = "headers"  // M of S: request headers (templates)
	FieldBody    = "body"     // S: request body (template)
	FieldRefresh = "refresh"  // token_request: M, a request repeated every interval while the socket lives
	FieldExpires = "expires"  // token_request: S, PATH of the answer's expiry (seconds from now, or epoch ms)
	FieldSeqPath = "seq_path" // snapshot: S, PATH of the sequence the snapshot covers
	FieldOnGap   = "on_gap"   // snapshot: S, count (the default) or resync
)

// REST request limits.
const (
	MaxRequestBody        = 64 << 10
	MaxTokenResponse      = 64 << 10 // bytes of a token_request or refresh answer read
	DefaultRequestTimeout = 10 * time.Second
	MinRefresh            = 100 * time.Millisecond
	MaxRefresh            = 24 * time.Hour
)

// What a snapshot spec does on a forward gap.
const (
	OnGapCount  = "count"  // count the gap and go on (the default)
	OnGapResync = "resync" // fetch a snapshot and deliver it before what follows the gap
)

// Request is an HTTP request a spec makes. URL, header values and the body are
// templates: {conn}, {seq}, {next}, {{secret:NAME}} and (except in token_request's
// own request) {{token:PATH}}.
type Request struct {
	Method  string
	URL     string
	Headers map[string]string
	Body    string
	Timeout time.Duration // 0: DefaultRequestTimeout
}

// TokenRequest is made before each dial; PATHs of its JSON answer fill the
// {{token:PATH}} references of ws_url, headers, open messages, the keepalive, the
// refresh and the snapshot request.
type TokenRequest struct {
	Request
	Refresh *Refresh
	Expires string // PATH; "" none
}

// Refresh is a request repeated every Interval while the socket lives (a listenKey
// keepalive); a failure rotates the socket.
type Refresh struct {
	Request
	Interval time.Duration
}

// Snapshot is a request whose JSON answer is delivered as a record marked snapshot,
// covering the sequence at SeqPath.
type Snapshot struct {
	Request
	SeqPath string
	OnGap   string // "", count or resync
}

// tokenRef matches a {{token:PATH}} reference.
var tokenRef = regexp.MustCompile(`\{\{token:([^{}]+)\}\}`)

// TokenRefs lists the PATHs v references, in order.
func TokenRefs(v string) []string {
	var out []string
	for _, m := range tokenRef.FindAllStringSubmatch(v, -1) {
		out = append(out, m[1])
	}
	return out
}

// ReplaceTokens replaces every {{token:PATH}} of v with get's value for PATH, in
// one pass: a value is never scanned for references itself.
func ReplaceTokens(v string, get func(path string) (string, error)) (string, error) {
	var err error
	out := tokenRef.ReplaceAllStringFunc(v, func(ref string) string {
		val, gerr := get(tokenRef.FindStringSubmatch(ref)[1])
		if gerr != nil && err == nil {
			err = gerr
		}
		return val
	})
	return out, err
}

// checkTokenRefs refuses a malformed {{token:…}} reference, and any reference at
// all where no token is to be had (allowed false).
func checkTokenRefs(v string, allowed bool) error {
	refs := TokenRefs(v)
	if len(refs) > 0 && !allowed {
		return fmt.Errorf("{{token:%s}} without a %s", clip(refs[0]), AttrTokenRequest)
	}
	for _, p := range refs {
		if err := CheckTokenPath(p); err != nil {
			return err
		}
	}
	if strings.Contains(tokenRef.ReplaceAllString(v, ""), "{{token:") {
		return fmt.Errorf("malformed {{token:PATH}} reference")
	}
	return nil
}

// CheckTokenPath checks a dotted path into a JSON answer: object fields and array
// indexes ("data.token", "data.instanceServers.0.endpoint").
func CheckTokenPath(p string) error {
	if p == "" || len(p) > 256 {
		return fmt.Errorf("path %q: want 1 to 256 bytes", clip(p))
	}
	if strings.ContainsAny(p, "{}") {
		return fmt.Errorf("path %q: no braces", clip(p)) // {{token:PATH}} could not spell it
	}
	if err := CheckSeqPath(p); err != nil {
		return fmt.Errorf("path %w", err)
	}
	return nil
}

// validateRequests checks token_request and snapshot, and that {{token:…}} appears
// only where a token_request provides one.
func (s Spec) validateRequests() error {
	hasToken := s.TokenRequest != nil
	for k, v := range s.Headers {
		if err := checkTokenRefs(v, hasToken); err != nil {
			return specErr(AttrHeaders, "%s: %v", k, err)
		}
	}
	for i, m := range s.OpenMessages {
		if err := checkTokenRefs(m.Text, hasToken); err != nil {
			return specErr(AttrOpenMessages, "[%d]: %v", i, err)
		}
	}
	if s.Keepalive != nil {
		if err := checkTokenRefs(s.Keepalive.Message, hasToken); err != nil {
			return specErr(AttrKeepalive, "%v", err)
		}
	}
	if t := s.TokenRequest; t != nil {
		if err := t.Request.validate(false); err != nil {
			return specErr(AttrTokenRequest, "%v", err)
		}
		if t.Expires != "" {
			if err := CheckTokenPath(t.Expires); err != nil {
				return specErr(AttrTokenRequest, "%s: %v", FieldExpires, err)
			}
		}
		if r := t.Refresh; r != nil {
			if err := r.Request.validate(true); err != nil {
				return specErr(AttrTokenRequest, "%s: %v", FieldRefresh, err)
			}
			if r.Interval < MinRefresh || r.Interval > MaxRefresh {
				return specErr(AttrTokenRequest, "%s.%s %s: want %s to %s", FieldRefresh, FieldInterval, r.Interval, MinRefresh, MaxRefresh)
			}
		}
	}
	if sn := s.Snapshot; sn != nil {
		if err := sn.Request.validate(hasToken); err != nil {
			return specErr(AttrSnapshot, "%v", err)
		}
		if sn.SeqPath == "" {
			return specErr(AttrSnapshot, "%s: missing (the answer's field holding the sequence it covers)", FieldSeqPath)
		}
		if err := CheckSeqPath(sn.SeqPath); err != nil {
			return specErr(AttrSnapshot, "%s: %v", FieldSeqPath, err)
		}
		switch sn.OnGap {
		case "", OnGapCount, OnGapResync:
		default:
			return specErr(AttrSnapshot, "%s %q: want %s or %s", FieldOnGap, clip(sn.OnGap), OnGapCount, OnGapResync)
		}
	}
	return nil
}

// validate checks one request. Errors never quote a header value or the body
// (either may hold a credential), nor the URL's query.
func (r Request) validate(tokens bool) error {
	switch r.Method {
	case "", http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
	default:
		return fmt.Errorf("%s %q: want GET, POST, PUT, PATCH or DELETE", FieldMethod, clip(r.Method))
	}
	if err := CheckRequestURL(r.URL); err != nil {
		return err
	}
	if err := checkRefs(r.URL); err != nil {
		return fmt.Errorf("%s: %v", FieldURL, err)
	}
	if err := checkTokenRefs(r.URL, tokens); err != nil {
		return fmt.Errorf("%s: %v", FieldURL, err)
	}
	if len(r.Headers) > MaxHeaders {
		return fmt.Errorf("%s: %d headers, limit %d", FieldHeaders, len(r.Headers), MaxHeaders)
	}
	for k, v := range r.Headers {
		switch {
		case !validToken(k):
			return fmt.Errorf("%s: name %q: not an HTTP header name", FieldHeaders, clip(k))
		case len(v) > MaxHeaderValueLen:
			return fmt.Errorf("%s: %s: value of %d bytes, limit %d", FieldHeaders, k, len(v), MaxHeaderValueLen)
		case strings.ContainsAny(v, "\r\n\x00"):
			return fmt.Errorf("%s: %s: value holds a line break or NUL", FieldHeaders, k)
		}
		if err := checkRefs(v); err != nil {
			return fmt.Errorf("%s: %s: %v", FieldHeaders, k, err)
		}
		if err := checkTokenRefs(v, tokens); err != nil {
			return fmt.Errorf("%s: %s: %v", FieldHeaders, k, err)
		}
	}
	if len(r.Body) > MaxRequestBody {
		return fmt.Errorf("%s of %d bytes, limit %d", FieldBody, len(r.Body), MaxRequestBody)
	}
	if err := checkRefs(r.Body); err != nil {
		return fmt.Errorf("%s: %v", FieldBody, err)
	}
	if err := checkTokenRefs(r.Body, tokens); err != nil {
		return fmt.Errorf("%s: %v", FieldBody, err)
	}
	if r.Timeout < 0 || r.Timeout > MaxSpecTimeout {
		return fmt.Errorf("%s %s: want 0 to %s", FieldTimeout, r.Timeout, MaxSpecTimeout)
	}
	return nil
}

// CheckRequestURL accepts an http or https URL whose scheme and host are literal:
// the host decides where the request's secrets may go, so no template may choose
// it. The path and query may hold templates.
func CheckRequestURL(raw string) error {
	if raw == "" {
		return fmt.Errorf("%s: missing", FieldURL)
	}
	if len(raw) > MaxURLLen {
		return fmt.Errorf("%s: %d bytes, limit %d", FieldURL, len(raw), MaxURLLen)
	}
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok || (scheme != "http" && scheme != "https") {
		return fmt.Errorf("%s %q: want an http:// or https:// URL", FieldURL, clip(RedactURL(raw)))
	}
	authority := rest
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		authority = rest[:i]
	}
	if strings.ContainsAny(authority, "{}@") {
		return fmt.Errorf("%s %q: the host must be literal (no template, no userinfo)", FieldURL, clip(RedactURL(raw)))
	}
	u, err := url.Parse(scheme + "://" + authority)
	if err != nil || u.Hostname() == "" {
		return fmt.Errorf("%s %q: no host", FieldURL, clip(RedactURL(raw)))
	}
	return nil
}

// TemplateURL returns raw with its {{token:PATH}} references replaced by a neutral
// value, for validating its shape before a token exists: a URL that starts with one
// (the whole endpoint comes from the token's answer) is checked as ws://token….
func TemplateURL(raw string) string {
	if !strings.Contains(raw, "{{token:") {
		return raw
	}
	if loc := tokenRef.FindStringIndex(raw); loc != nil && loc[0] == 0 {
		raw = "ws://token" + raw[loc[1]:]
	}
	return tokenRef.ReplaceAllString(raw, "token")
}
