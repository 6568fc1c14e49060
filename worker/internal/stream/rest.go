package stream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"

	"github.com/sockfleet/sockfleet/shared/schema"
)

// DefaultRESTPerHost is how many of a worker's spec requests (token_request,
// refresh, snapshot) may be in flight to one host at once: a mass failover of
// hundreds of connections onto one worker queues behind it instead of stampeding
// the upstream's REST API.
const DefaultRESTPerHost = 4

// hostSlots bounds concurrent requests per host: a counting semaphore per host,
// dropped when its last holder leaves.
type hostSlots struct {
	n  int
	mu sync.Mutex
	m  map[string]chan struct{}
	// users counts holders and waiters per host, so an unused host's semaphore is freed.
	users map[string]int
}

func newHostSlots(n int) *hostSlots {
	return &hostSlots{n: n, m: map[string]chan struct{}{}, users: map[string]int{}}
}

// acquire waits for a slot of host and returns its release.
func (h *hostSlots) acquire(ctx context.Context, host string) (func(), error) {
	h.mu.Lock()
	sem := h.m[host]
	if sem == nil {
		sem = make(chan struct{}, h.n)
		h.m[host] = sem
	}
	h.users[host]++
	h.mu.Unlock()
	leave := func() {
		h.mu.Lock()
		if h.users[host]--; h.users[host] == 0 {
			delete(h.users, host)
			delete(h.m, host)
		}
		h.mu.Unlock()
	}
	select {
	case sem <- struct{}{}:
		return func() { <-sem; leave() }, nil
	case <-ctx.Done():
		leave()
		return nil, ctx.Err()
	}
}

// newRESTClient is the client of spec requests: it follows no redirect, since a
// redirect could carry a request's secrets to a host their owner did not allow.
func newRESTClient() *http.Client {
	return &http.Client{
		Transport:     http.DefaultTransport,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// call makes one spec request (attr names it in errors: token_request, snapshot,
// …): templates filled ({conn}, {seq}, secrets allowed to the URL's host, the
// token's fields), at most RESTPerHost at once per host, within the request's
// timeout, reading at most limit bytes of a 2xx answer. Errors quote the URL as the
// spec wrote it, with its query redacted, and never a header, the body or the answer.
func (s *Stream) call(ctx context.Context, attr string, r schema.Request, tok *token, seq int64, limit int64) ([]byte, error) {
	method := r.Method
	if method == "" {
		method = http.MethodGet
	}
	where := fmt.Sprintf("%s: %s %s", attr, method, schema.RedactURL(r.URL))
	u, err := url.Parse(r.URL)
	if err != nil {
		return nil, fmt.Errorf("%w %s: %v", schema.ErrInvalid, where, schema.URLParseError(err))
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	host := strings.ToLower(u.Hostname())
	dest := net.JoinHostPort(host, port)
	fill := func(v string) (string, error) { return s.expand(ctx, v, seq, dest, tok) }
	target, err := fill(r.URL)
	if err != nil {
		return nil, fmt.Errorf("%s: url: %w", where, err)
	}
	body, err := fill(r.Body)
	if err != nil {
		return nil, fmt.Errorf("%s: body: %w", where, err)
	}
	timeout := r.Timeout
	if timeout == 0 {
		timeout = schema.DefaultRequestTimeout
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, method, target, strings.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("%s: %v", where, schema.URLParseError(err))
	}
	for k, v := range r.Headers {
		val, err := fill(v)
		if err != nil {
			return nil, fmt.Errorf("%s: header %s: %w", where, k, err)
		}
		req.Header.Set(k, val)
	}
	release, err := s.cfg.rest.acquire(rctx, host)
	if err != nil {
		return nil, fmt.Errorf("%s: waiting for a request slot of %s: %w", where, host, err)
	}
	defer release()
	resp, err := s.cfg.HTTP.Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			return nil, fmt.Errorf("%s: no answer within %s", where, timeout)
		}
		return nil, fmt.Errorf("%s: %v", where, schema.URLParseError(err)) // without the filled URL
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10)) // reuse the connection
		return nil, fmt.Errorf("%s: status %d", where, resp.StatusCode)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			return nil, fmt.Errorf("%s: answer not read within %s", where, timeout)
		}
		return nil, fmt.Errorf("%s: reading the answer: %v", where, err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s: answer over %d bytes", where, limit)
	}
	return bytes.TrimSpace(data), nil
}
