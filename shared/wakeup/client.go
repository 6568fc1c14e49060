package wakeup

import (
	"context"
	"encoding/json"
	"fmt"
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
	hc := c.HTTP
	if hc == nil {
		hc = &http.Client{Timeout: 2 * time.Second}
	}
	data, err := SignedPost{Secret: c.Secret, HTTP: hc, Now: c.Now}.Do(ctx, "http://"+addr+Path, body, MaxBody)
	if err != nil {
		return Response{}, fmt.Errorf("wakeup %s: %w", addr, err)
	}
	out, err := DecodeResponse(data)
	if err != nil {
		return Response{}, fmt.Errorf("wakeup %s: bad reply: %w", addr, err)
	}
	return out, nil
}
