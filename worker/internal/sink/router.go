package sink

import (
	"context"
	"errors"
	"fmt"
)

// ErrUnknownDest: a message names a destination the router does not hold.
var ErrUnknownDest = errors.New("sink destination not allowed")

// Router sends each message to its connection's own destination (Message.Dest, the
// spec's sink attribute) or, without one, to the fleet's sink. A worker's batches
// are one connection's each, so a batch goes to one sink, and a connection's next
// batch is written only after this one is acknowledged: records keep their order per
// connection, whichever sink they land in.
type Router struct {
	Default Sink
	Dests   map[string]Sink // by the name the spec uses: a stream name, an ARN, file:PATH
}

// Allows reports whether dest names a destination of r ("" is the fleet's sink).
func (r *Router) Allows(dest string) bool {
	_, ok := r.Dests[dest]
	return dest == "" || ok
}

// Write writes batch, each run of messages with one destination in turn.
func (r *Router) Write(ctx context.Context, batch []Message) error {
	for len(batch) > 0 {
		n := 1
		for n < len(batch) && batch[n].Dest == batch[0].Dest {
			n++
		}
		dst := r.Default
		if d := batch[0].Dest; d != "" {
			var ok bool
			if dst, ok = r.Dests[d]; !ok {
				return fmt.Errorf("%w: %q", ErrUnknownDest, d)
			}
		}
		if err := dst.Write(ctx, batch[:n]); err != nil {
			return err
		}
		batch = batch[n:]
	}
	return nil
}

// Close closes every sink of r.
func (r *Router) Close() error {
	errs := []error{r.Default.Close()}
	for _, s := range r.Dests {
		errs = append(errs, s.Close())
	}
	return errors.Join(errs...)
}
