package wakeup

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/sockfleet/sockfleet/shared/tracing"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

var tracer = tracing.Tracer("shared/wakeup")

type linksKey struct{}

// WithLinks returns ctx with links for the wakeup.send span of a Send made with it:
// the spans of the other records whose ids one call carries (its parent is one span).
func WithLinks(ctx context.Context, ls []trace.Link) context.Context {
	return context.WithValue(ctx, linksKey{}, ls)
}

func links(ctx context.Context) []trace.Link {
	ls, _ := ctx.Value(linksKey{}).([]trace.Link)
	return ls
}

// Client sends signed wakeups.
type Client struct {
	Secret []byte
	HTTP   *http.Client     // default: a client with a 2 s timeout
	Now    func() time.Time // default time.Now
}

// Send posts req to the worker at addr (host:port) and returns its per-id answers.
// A draining worker's 503, which answers Draining for every id, is such an answer.
// Any error means the worker did not answer usefully: the caller re-routes all ids.
//
// Each call is a wakeup.send span (client side), child of ctx's span and linked to the
// spans WithLinks put on ctx; the request carries its trace context (SignTrace).
func (c *Client) Send(ctx context.Context, addr string, req Request) (out Response, err error) {
	ctx, span := tracer.Start(ctx, "wakeup.send", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithLinks(links(ctx)...), trace.WithAttributes(attribute.String("server.address", addr)))
	defer func() {
		Annotate(span, req.Conns, out.Results)
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, "no usable answer")
		}
		span.End()
	}()
	req.V = Version
	post := SignedPost{Secret: c.Secret, HTTP: c.HTTP, Now: c.Now, Timeout: 2 * time.Second}
	data, err := post.JSON(ctx, "http://"+addr+Path, req, MaxBody)
	if se := (*StatusError)(nil); errors.As(err, &se) && se.Code == http.StatusServiceUnavailable {
		if out, derr := DecodeResponse(se.Body); derr == nil && allDraining(out, req) {
			return out, nil
		}
	}
	if err != nil {
		return Response{}, fmt.Errorf("wakeup %s: %w", addr, err)
	}
	out, err = DecodeResponse(data)
	if err != nil {
		return Response{}, fmt.Errorf("wakeup %s: bad reply: %w", addr, err)
	}
	return out, nil
}

// allDraining says whether out answers Draining for every id of req, as a draining
// worker's 503 does.
func allDraining(out Response, req Request) bool {
	got := map[string]bool{}
	for _, r := range out.Results {
		if r.Result != Draining {
			return false
		}
		got[r.ID] = true
	}
	for _, c := range req.Conns {
		if !got[c.ID] {
			return false
		}
	}
	return len(req.Conns) > 0
}
