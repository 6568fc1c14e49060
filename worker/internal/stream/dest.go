package stream

import (
	"fmt"

	"github.com/sockfleet/sockfleet/shared/schema"
)

// checkSink refuses a connection whose sink attribute names a destination the fleet
// does not allow (SOCKFLEET_SINKS_ALLOWED). The error wraps schema.ErrInvalid, so
// the owner keeps the connection undialed with status invalid and looks again on the
// permanent backoff, as for a secret not allowed to the host: the syntax was checked
// with the item (by the reconciler and the sweep too); the allowance is the worker's.
func (s *Stream) checkSink() error {
	dest := s.set.spec.Sink
	if dest == "" || (s.cfg.SinkAllowed != nil && s.cfg.SinkAllowed(dest)) {
		return nil
	}
	return fmt.Errorf("%w %s: %q is not among the destinations this fleet allows (%s)",
		schema.ErrInvalid, schema.AttrSink, dest, schema.EnvSinksAllowed)
}
