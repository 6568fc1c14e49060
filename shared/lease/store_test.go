package lease_test

import (
	"testing"
	"time"

	"github.com/sockfleet/sockfleet/shared/lease"
)

func TestConfigValidate(t *testing.T) {
	bad := []lease.Config{
		{},
		{Table: "t", Duration: -time.Second},
		{Table: "t", Duration: time.Second, SkewMargin: 2 * time.Second},
	}
	for _, c := range bad {
		if _, err := lease.New(nil, c); err == nil {
			t.Errorf("config %+v accepted", c)
		}
	}
	s, err := lease.New(nil, lease.Config{Table: "t"})
	if err != nil || s.Config().Duration != lease.DefaultDuration || s.Config().SkewMargin != lease.DefaultSkewMargin {
		t.Fatalf("defaults: %+v, %v", s.Config(), err)
	}
}
