package wakeup

import (
	"context"
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
	post := SignedPost{Secret: c.Secret, HTTP: c.HTTP, Now: c.Now, Timeout: 2 * time.Second}
	data, err := post.JSON(ctx, "http://"+addr+Path, req, MaxBody)
	if err != nil {
		return Response{}, fmt.Errorf("wakeup %s: %w", addr, err)
	}
	out, err := DecodeResponse(data)
	if err != nil {
		return Response{}, fmt.Errorf("wakeup %s: bad reply: %w", addr, err)
	}
	return out, nil
}
