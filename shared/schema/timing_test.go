package schema

import (
	"strings"
	"testing"
	"time"
)

func TestCheckTimings(t *testing.T) {
	s := time.Second
	cases := []struct {
		lease, deadline, interval, skew time.Duration
		env                             string // "" if valid
	}{
		{11 * s, 7 * s, 3 * s, DefaultSkewMargin, ""},  // stream-mode defaults
		{20 * s, 15 * s, 5 * s, DefaultSkewMargin, ""}, // polling-mode defaults (the seed's)
		{11 * s, 7 * s, 0, DefaultSkewMargin, EnvRenewInterval},
		{11 * s, 3 * s, 3 * s, DefaultSkewMargin, EnvRenewDeadline},
		{7 * s, 7 * s, 3 * s, DefaultSkewMargin, EnvLease},
		{11 * s, 7 * s, 3 * s, -s, EnvSkewMargin},
		{11 * s, 7 * s, 3 * s, 8 * s, EnvSkewMargin}, // fences before its next renew
		{11 * s, 7 * s, 3 * s, 7*s + 999*time.Millisecond, ""},
	}
	for _, c := range cases {
		err := CheckTimings(c.lease, c.deadline, c.interval, c.skew)
		switch {
		case c.env == "" && err != nil:
			t.Errorf("%+v: %v", c, err)
		case c.env != "" && (err == nil || !strings.HasPrefix(err.Error(), c.env+": ")):
			t.Errorf("%+v: %v, want an error naming %s", c, err, c.env)
		}
	}
}
