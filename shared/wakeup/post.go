package wakeup

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"
)

// SignedPost sends the signed POST of every call between sockfleet's parts (wakeups,
// worker-to-worker handoffs): a JSON body with the HeaderTimestamp and
// HeaderSignature headers, signed with Sign, and the trace context of ctx's span, if
// any, signed with SignTrace. The receiver checks it with Verify, TraceContext and
// Replay.
type SignedPost struct {
	Secret []byte
	HTTP   *http.Client     // default: a client with Timeout
	Now    func() time.Time // default time.Now
	// Timeout bounds one call when HTTP is nil; 0: no bound but ctx's.
	Timeout time.Duration
}

// StatusError is Do's error for an answer other than 200.
type StatusError struct {
	Code int
	Body []byte // read up to Do's max
}

func (e *StatusError) Error() string { return fmt.Sprintf("status %d: %.200s", e.Code, e.Body) }

// JSON posts v, encoded as JSON, as Do does.
func (p SignedPost) JSON(ctx context.Context, url string, v any, max int64) ([]byte, error) {
	body, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode: %w", err)
	}
	return p.Do(ctx, url, body, max)
}

// Do posts body to url and returns the body of a 200 answer, read up to max bytes.
// Any other status is an error quoting the start of the answer. Errors carry no
// prefix: the caller names the call.
func (p SignedPost) Do(ctx context.Context, url string, body []byte, max int64) ([]byte, error) {
	now := time.Now
	if p.Now != nil {
		now = p.Now
	}
	ts := Timestamp(now())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(HeaderTimestamp, ts)
	sig := Sign(p.Secret, ts, body)
	req.Header.Set(HeaderSignature, sig)
	signTrace(ctx, p.Secret, sig, req.Header)
	hc := p.HTTP
	if hc == nil {
		hc = &http.Client{Timeout: p.Timeout}
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, max))
	if err != nil {
		return nil, fmt.Errorf("read reply: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, &StatusError{Code: resp.StatusCode, Body: data}
	}
	return data, nil
}
