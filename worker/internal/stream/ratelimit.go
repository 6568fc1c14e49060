package stream

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sockfleet/sockfleet/worker/internal/connquota"
)

// MaxRetryAfter bounds the pause a Retry-After can ask for (connquota.MaxHold).
const MaxRetryAfter = connquota.MaxHold

// rateLimitedError is a handshake answered 429 (too many requests) or 418 (Binance's
// ban). With a usable Retry-After, no dial to the host goes before until, on any
// worker; without one, the stream backs off as after any failure.
type rateLimitedError struct {
	until time.Time // zero: no usable Retry-After
	why   string
	err   error
}

func (e *rateLimitedError) Error() string { return e.err.Error() + "; " + e.why }

func (e *rateLimitedError) Unwrap() error { return e.err }

// rateLimited records the host's Retry-After (raw header value) as a hold for the
// whole fleet and returns the error that makes Run wait for it.
func (s *Stream) rateLimited(ctx context.Context, host, raw string, err error) error {
	s.cfg.Metrics.RateLimited.Add(1)
	now := time.Now()
	d, capped, perr := parseRetryAfter(raw, now)
	if perr != nil {
		return &rateLimitedError{why: perr.Error() + "; backing off", err: err}
	}
	until := now.Add(d)
	if d > 0 {
		s.cfg.gate().Hold(ctx, host, until)
	}
	why := fmt.Sprintf("retry after %s", d.Round(time.Second))
	if capped {
		why += fmt.Sprintf(" (Retry-After %q capped at %s)", trim(strings.TrimSpace(raw)), MaxRetryAfter)
	}
	return &rateLimitedError{until: until, why: why, err: err}
}

// parseRetryAfter reads a Retry-After value (RFC 9110 10.2.3): delay-seconds or an
// HTTP-date. A delay over MaxRetryAfter is capped (capped reports it); a date in the
// past is no delay. Empty, negative, fractional or unreadable values are an error.
func parseRetryAfter(v string, now time.Time) (d time.Duration, capped bool, err error) {
	v = strings.TrimSpace(v)
	switch {
	case v == "":
		return 0, false, fmt.Errorf("no Retry-After")
	case v[0] >= '0' && v[0] <= '9':
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil && !isRange(err) {
			return 0, false, fmt.Errorf("Retry-After %q: want whole seconds or an HTTP-date", trim(v))
		}
		if err != nil || n > uint64(MaxRetryAfter/time.Second) {
			return MaxRetryAfter, true, nil
		}
		return time.Duration(n) * time.Second, false, nil
	}
	t, perr := http.ParseTime(v)
	if perr != nil {
		return 0, false, fmt.Errorf("Retry-After %q: want whole seconds or an HTTP-date", trim(v))
	}
	d = max(t.Sub(now), 0)
	if d > MaxRetryAfter {
		return MaxRetryAfter, true, nil
	}
	return d, false, nil
}

func isRange(err error) bool {
	ne, ok := err.(*strconv.NumError)
	return ok && ne.Err == strconv.ErrRange
}

// trim keeps an upstream's header short in a status.
func trim(v string) string {
	if len(v) > 40 {
		return v[:40] + "…"
	}
	return v
}
