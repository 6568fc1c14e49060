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

// Client sends signed wakeups.
type Client struct {
	Secret []byte
	HTTP   *http.Client     // default: a client with a 2 s timeout
	Now    func() time.Time // default time.Now
}

// Send posts req to the worker at addr (host:port) and returns its per-id answers.
// Any error means the worker did not answer usefully: the caller re-routes all ids.
func (c *Client) Send(ctx context.Context, addr string, req Request) (Response, error) {
	req.V = Version
	body, err := json.Marshal(req)
	if err != nil {
		return Response{}, err
	}
	now := time.Now
	if c.Now != nil {
		now = c.Now
	}
	ts := Timestamp(now())
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+Path, bytes.NewReader(body))
	if err != nil {
		return Response{}, fmt.Errorf("wakeup %s: %w", addr, err)
	}
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Set(HeaderTimestamp, ts)
	hr.Header.Set(HeaderSignature, Sign(c.Secret, ts, body))
	hc := c.HTTP
	if hc == nil {
		hc = &http.Client{Timeout: 2 * time.Second}
	}
	resp, err := hc.Do(hr)
	if err != nil {
		return Response{}, fmt.Errorf("wakeup %s: %w", addr, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, MaxBody))
	if err != nil {
		return Response{}, fmt.Errorf("wakeup %s: read reply: %w", addr, err)
	}
	if resp.StatusCode != http.StatusOK {
		return Response{}, fmt.Errorf("wakeup %s: status %d: %.200s", addr, resp.StatusCode, data)
	}
	out, err := DecodeResponse(data)
	if err != nil {
		return Response{}, fmt.Errorf("wakeup %s: bad reply: %w", addr, err)
	}
	return out, nil
}
