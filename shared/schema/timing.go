package schema

import (
	"fmt"
	"time"
)

// DefaultSkewMargin is the fleet's clock-skew margin (EnvSkewMargin unset): the
// most two hosts' wall clocks may disagree. A lease counts as lapsed only this long
// after its expiry on the reader's clock, and a worker fences itself before its
// lease less this margin. Workers, the reconciler and the deployment must use the
// same value. Fargate hosts sync time through the Amazon Time Sync Service, which
// keeps skew in the milliseconds; 2 s leaves three orders of magnitude.
const DefaultSkewMargin = 2 * time.Second

// CheckTimings checks the timing rule of a lease renewed every renewInterval that
// its holder stops using once renewDeadline passed without a successful renew:
//
//	0 < renew interval < renew deadline < lease, and
//	0 ≤ skew margin, with the lease less the margin longer than the renew interval
//
// (otherwise a lease would fence itself before its next renew). The error names the
// environment variable of the value to change, as "NAME: problem".
func CheckTimings(lease, renewDeadline, renewInterval, skewMargin time.Duration) error {
	switch {
	case renewInterval <= 0:
		return fmt.Errorf("%s: %s must be positive", EnvRenewInterval, renewInterval)
	case renewDeadline <= renewInterval:
		return fmt.Errorf("%s: %s must be longer than %s (%s)", EnvRenewDeadline, renewDeadline, EnvRenewInterval, renewInterval)
	case lease <= renewDeadline:
		return fmt.Errorf("%s: %s must be longer than %s (%s)", EnvLease, lease, EnvRenewDeadline, renewDeadline)
	case skewMargin < 0 || lease-skewMargin <= renewInterval:
		return fmt.Errorf("%s: %s must be at least 0 and leave more than %s (%s) of the lease (%s)",
			EnvSkewMargin, skewMargin, EnvRenewInterval, renewInterval, lease)
	}
	return nil
}
