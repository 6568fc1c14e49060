package handler

import (
	"context"
	"log/slog"

	"github.com/aws/aws-lambda-go/lambdacontext"
)

// WithRequestID wraps a slog handler so that records logged with a context carrying a
// Lambda invocation (the *Context calls) get its request id as "request_id".
func WithRequestID(h slog.Handler) slog.Handler { return requestID{h} }

type requestID struct{ slog.Handler }

func (r requestID) Handle(ctx context.Context, rec slog.Record) error {
	if lc, ok := lambdacontext.FromContext(ctx); ok && lc.AwsRequestID != "" {
		rec.AddAttrs(slog.String("request_id", lc.AwsRequestID))
	}
	return r.Handler.Handle(ctx, rec)
}

func (r requestID) WithAttrs(as []slog.Attr) slog.Handler { return requestID{r.Handler.WithAttrs(as)} }
func (r requestID) WithGroup(name string) slog.Handler    { return requestID{r.Handler.WithGroup(name)} }
