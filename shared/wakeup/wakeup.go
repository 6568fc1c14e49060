// Package wakeup is the protocol by which the reconciler wakes a worker:
// POST /v1/wakeup with a versioned JSON body, signed with HMAC-SHA256 over
// "<timestamp>.<body>" using a secret the two share.
//
// A wakeup is a hint, never a command. Delivery is at least once; the worker re-checks
// every id with a conditional write, and ignores a wakeup about an older lease_version
// than the one it holds (stale). Signatures are checked in constant time, within a
// ±Window clock window, and each signature is accepted once (Replay).
package wakeup

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sockfleet/sockfleet/shared/schema"
)

// Wire constants.
const (
	Path            = "/v1/wakeup"
	Version         = 1
	HeaderTimestamp = "X-Sockfleet-Timestamp" // unix milliseconds
	HeaderSignature = "X-Sockfleet-Signature" // "v1=" + hex HMAC-SHA256
	sigPrefix       = "v1="

	// Window is how far a request's timestamp may be from the receiver's clock.
	Window = 30 * time.Second
	// MaxBody bounds a request body; MaxConns bounds the ids in one request.
	MaxBody  = 256 << 10
	MaxConns = 500
	// MinSecret is the shortest secret accepted.
	MinSecret = 16
)

// Reason says why an id is in a wakeup.
type Reason string

// Reasons.
const (
	// NeedsOwner: try to acquire it.
	NeedsOwner Reason = "needs_owner"
	// Check: you own it and its item changed (stopped, deleted, new URL); re-read it
	// (the renew returns the item) and act.
	Check Reason = "check"
	// Handoff: you own it; hand it to worker Conn.To make-before-break (a rebalance
	// move). The owner answers HandingOff and moves it in the background, or
	// TargetUnavailable when To is draining, gone or itself.
	Handoff Reason = "handoff"
)

// Result is a worker's answer for one id. The reconciler re-routes NoCapacity,
// Draining and (for NeedsOwner) failed ids to the next worker.
type Result string

// Results.
const (
	Acquired     Result = "acquired"      // it took the lease
	AlreadyOwned Result = "already_owned" // it already held it (for Check: and acted on it)
	LostRace     Result = "lost_race"     // another worker holds it
	NoCapacity   Result = "no_capacity"
	Draining     Result = "draining"
	Stale        Result = "stale"         // the wakeup's lease_version is older than the one held
	NotStartable Result = "not_startable" // missing, STOPPED, or invalid item
	Failed       Result = "failed"        // the table could not be reached; retry elsewhere
	// For Handoff only.
	HandingOff        Result = "handing_off"        // accepted: the owner hands it to To
	TargetUnavailable Result = "target_unavailable" // To is draining, gone or the owner itself
)

// Conn is one id in a request.
type Conn struct {
	ID           string `json:"id"`
	LeaseVersion int64  `json:"lease_version"`
	Reason       Reason `json:"reason"`
	// To names the worker to hand the connection to (Handoff only).
	To string `json:"to,omitempty"`
}

// Request is the body of a wakeup.
type Request struct {
	V     int    `json:"v"`
	Conns []Conn `json:"conns"`
}

// ConnResult is the answer for one id.
type ConnResult struct {
	ID     string `json:"id"`
	Result Result `json:"result"`
	Detail string `json:"detail,omitempty"`
}

// Response is the body of a wakeup reply.
type Response struct {
	V       int          `json:"v"`
	Results []ConnResult `json:"results"`
	// Load is how many connections the worker holds or is acquiring once this
	// request is handled. The registry's load is only refreshed once per renew
	// interval, so the reconciler uses this to spread a burst of new connections.
	// Absent from workers that predate it.
	Load *int `json:"load,omitempty"`
}

// Errors of Verify and DecodeRequest.
var (
	ErrUnauthorized = errors.New("wakeup unauthorized")
	ErrMalformed    = errors.New("wakeup malformed")
)

// Sign returns the signature header value for body sent at ts.
func Sign(secret []byte, ts string, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(ts))
	m.Write([]byte{'.'})
	m.Write(body)
	return sigPrefix + hex.EncodeToString(m.Sum(nil))
}

// Timestamp formats t as the timestamp header value.
func Timestamp(t time.Time) string { return strconv.FormatInt(t.UnixMilli(), 10) }

// Verify checks the timestamp window and the signature (in constant time). It does
// not check replays; see Replay.
func Verify(secret []byte, now time.Time, ts, sig string, body []byte) error {
	if ts == "" || sig == "" {
		return fmt.Errorf("%w: missing %s or %s", ErrUnauthorized, HeaderTimestamp, HeaderSignature)
	}
	ms, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || len(ts) > 20 {
		return fmt.Errorf("%w: bad timestamp", ErrUnauthorized)
	}
	if d := now.Sub(time.UnixMilli(ms)); d > Window || d < -Window {
		return fmt.Errorf("%w: timestamp outside ±%s", ErrUnauthorized, Window)
	}
	if !strings.HasPrefix(sig, sigPrefix) || len(sig) != len(sigPrefix)+64 {
		return fmt.Errorf("%w: bad signature format", ErrUnauthorized)
	}
	if !hmac.Equal([]byte(Sign(secret, ts, body)), []byte(sig)) {
		return fmt.Errorf("%w: bad signature", ErrUnauthorized)
	}
	return nil
}

// DecodeRequest parses and validates a request body strictly: known version, known
// fields only, 1 to MaxConns valid ids, no id twice, known reasons.
func DecodeRequest(body []byte) (Request, error) {
	var r Request
	if err := DecodeStrict(body, MaxBody, &r); err != nil {
		return Request{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if r.V != Version {
		return Request{}, fmt.Errorf("%w: version %d, want %d", ErrMalformed, r.V, Version)
	}
	if len(r.Conns) == 0 || len(r.Conns) > MaxConns {
		return Request{}, fmt.Errorf("%w: %d ids, want 1 to %d", ErrMalformed, len(r.Conns), MaxConns)
	}
	seen := make(map[string]bool, len(r.Conns))
	for _, c := range r.Conns {
		if err := schema.ValidateID(c.ID); err != nil {
			return Request{}, fmt.Errorf("%w: %v", ErrMalformed, err)
		}
		if seen[c.ID] {
			return Request{}, fmt.Errorf("%w: id %s twice", ErrMalformed, c.ID)
		}
		seen[c.ID] = true
		if c.Reason != NeedsOwner && c.Reason != Check && c.Reason != Handoff {
			return Request{}, fmt.Errorf("%w: id %s: unknown reason %q", ErrMalformed, c.ID, c.Reason)
		}
		if (c.Reason == Handoff) != (c.To != "") {
			return Request{}, fmt.Errorf("%w: id %s: a handoff, and only a handoff, names the worker it goes to", ErrMalformed, c.ID)
		}
		if c.LeaseVersion < 0 {
			return Request{}, fmt.Errorf("%w: id %s: negative lease_version", ErrMalformed, c.ID)
		}
	}
	return r, nil
}

// DecodeResponse parses a reply body: known version and, if a load is given, a
// non-negative one. Unknown fields are allowed (a newer worker may add some).
func DecodeResponse(body []byte) (Response, error) {
	var r Response
	if err := json.Unmarshal(body, &r); err != nil {
		return Response{}, fmt.Errorf("%w: reply: %v", ErrMalformed, err)
	}
	if r.V != Version {
		return Response{}, fmt.Errorf("%w: reply version %d, want %d", ErrMalformed, r.V, Version)
	}
	if r.Load != nil && *r.Load < 0 {
		return Response{}, fmt.Errorf("%w: reply load %d is negative", ErrMalformed, *r.Load)
	}
	return r, nil
}

// DecodeStrict decodes one JSON value of at most max bytes into v, refusing unknown
// fields and trailing data: the first step of every signed request's decoding.
func DecodeStrict(body []byte, max int, v any) error {
	if len(body) > max {
		return fmt.Errorf("body over %d bytes", max)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data")
	}
	return nil
}

// ParseSecret checks a shared secret read from the environment.
func ParseSecret(s string) ([]byte, error) {
	if len(s) < MinSecret {
		return nil, fmt.Errorf("wakeup secret is %d bytes; want at least %d", len(s), MinSecret)
	}
	return []byte(s), nil
}
