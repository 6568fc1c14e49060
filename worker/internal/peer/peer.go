// Package peer is what passes between two workers in a planned handoff
// (docs/HANDOFF.md), and nothing of its logic: the wire — POST /v1/handoff, a
// versioned JSON body signed exactly as a wakeup (HMAC-SHA256 over
// "<timestamp>.<body>" with the shared wakeup secret, a ±wakeup.Window timestamp
// window, each signature accepted once), its strict decoder and the Client that sends
// it — and the Gate that holds a standby connection's messages back until the new
// owner learns its version from the other worker's commit. Both sides of the protocol
// (the old owner's and the target's) are ownership changes of the worker's table of
// owned connections, so they live with it, in worker/internal/owner (handoff*.go).
//
// Guarantees: a request is decoded strictly (known version, known fields, known op,
// valid ids, no negative numbers); a gate delivers nothing before Open, never delivers
// a message at or below the cut, holds at most its limits (then gives up, saying
// so), and after Open reports as delivered only what its sink acknowledged.
package peer

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/wakeup"
)

// Wire constants.
const (
	Path    = "/v1/handoff"
	Version = 1
	MaxBody = 4 << 10
)

// Op is what the old owner asks of the new one.
type Op string

// Ops.
const (
	// Prepare: open a standby for Conn, held by From at Version, resuming after Seq
	// (epoch Epoch), and answer Ready once its socket is up.
	Prepare Op = "prepare"
	// Commit: the lease is yours at Version (the new one) with last_seq Seq: drop
	// what you hold up to Seq and deliver from Seq+1.
	Commit Op = "commit"
	// Abort: the old owner gave up this handoff (Version is its version); drop the
	// standby.
	Abort Op = "abort"
)

// Request is the body of a handoff call.
type Request struct {
	V       int    `json:"v"`
	Op      Op     `json:"op"`
	Conn    string `json:"conn"`
	From    string `json:"from"`
	To      string `json:"to"`
	Version int64  `json:"version"`
	Seq     int64  `json:"seq"`
	Epoch   int64  `json:"epoch"`
}

// Result is the answer.
type Result string

// Results.
const (
	Ready     Result = "ready"     // prepare: the standby's socket is up
	Committed Result = "committed" // commit: delivering under the new version
	Aborted   Result = "aborted"   // abort: no standby left
	Refused   Result = "refused"   // any op: not done; Detail says why
)

// Response is the body of the answer.
type Response struct {
	V      int    `json:"v"`
	Result Result `json:"result"`
	Detail string `json:"detail,omitempty"`
}

// ErrMalformed: a request body that does not decode or validate.
var ErrMalformed = errors.New("handoff request malformed")

// DecodeRequest parses and validates a request body strictly.
func DecodeRequest(body []byte) (Request, error) {
	var r Request
	if err := wakeup.DecodeStrict(body, MaxBody, &r); err != nil {
		return Request{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	switch {
	case r.V != Version:
		return Request{}, fmt.Errorf("%w: version %d, want %d", ErrMalformed, r.V, Version)
	case r.Op != Prepare && r.Op != Commit && r.Op != Abort:
		return Request{}, fmt.Errorf("%w: unknown op %q", ErrMalformed, r.Op)
	case r.Version <= 0 || r.Seq < 0 || r.Epoch < 0:
		return Request{}, fmt.Errorf("%w: version %d, seq %d, epoch %d: want a positive version, no negatives", ErrMalformed, r.Version, r.Seq, r.Epoch)
	case r.From == r.To:
		return Request{}, fmt.Errorf("%w: from and to are both %q", ErrMalformed, r.From)
	}
	for what, id := range map[string]string{"conn": r.Conn, "from": r.From, "to": r.To} {
		if err := schema.ValidateID(id); err != nil {
			return Request{}, fmt.Errorf("%w: %s: %v", ErrMalformed, what, err)
		}
	}
	return r, nil
}

// Client sends signed handoff calls.
type Client struct {
	Secret []byte
	HTTP   *http.Client     // default: a client with a Timeout below
	Now    func() time.Time // default time.Now
	// Timeout bounds one call when HTTP is nil; default 10 s (a prepare waits for a dial).
	Timeout time.Duration
}

// Send posts req to the worker at addr (host:port) and returns its answer. An error
// means no usable answer: the caller cannot know whether it was acted on.
func (c *Client) Send(ctx context.Context, addr string, req Request) (Response, error) {
	req.V = Version
	post := wakeup.SignedPost{Secret: c.Secret, HTTP: c.HTTP, Now: c.Now, Timeout: cmp.Or(c.Timeout, 10*time.Second)}
	data, err := post.JSON(ctx, "http://"+addr+Path, req, MaxBody)
	if err != nil {
		return Response{}, fmt.Errorf("handoff %s %s to %s: %w", req.Op, req.Conn, addr, err)
	}
	var out Response
	if err := json.Unmarshal(data, &out); err != nil {
		return Response{}, fmt.Errorf("handoff %s %s to %s: bad reply: %w", req.Op, req.Conn, addr, err)
	}
	return out, nil
}
