package main

import (
	"testing"
	"time"

	"github.com/sockfleet/sockfleet/shared/schema"
)

func TestRoundsConfig(t *testing.T) {
	t.Setenv(schema.EnvRebalanceTolerance, "0.2")
	t.Setenv(schema.EnvRebalanceMaxFraction, "0.25")
	t.Setenv(schema.EnvRebalanceCooling, "10m")
	t.Setenv(schema.EnvRebalanceMinInterval, "3s")
	t.Setenv(schema.EnvRebalanceSettle, "20s")
	c, err := roundsConfig()
	if err != nil {
		t.Fatal(err)
	}
	if c.Plan.Tolerance != 0.2 || c.Plan.MaxFraction != 0.25 || c.Plan.Cooling != 10*time.Minute ||
		c.MinInterval != 3*time.Second || c.Settle != 20*time.Second || c.Disabled {
		t.Fatalf("%+v", c)
	}
}

func TestRoundsConfigDefaultsAndOff(t *testing.T) {
	c, err := roundsConfig()
	if err != nil || c.Disabled || c.MinInterval == 0 || c.Settle == 0 {
		t.Fatalf("defaults: %+v, %v", c, err)
	}
	t.Setenv(schema.EnvRebalance, "off")
	if c, err := roundsConfig(); err != nil || !c.Disabled {
		t.Fatalf("off: %+v, %v", c, err)
	}
}

// Each bad value is refused, naming the variable where the value does not parse.
func TestRoundsConfigRejectsBadValues(t *testing.T) {
	for _, tc := range []struct{ name, value string }{
		{schema.EnvRebalance, "yes"},
		{schema.EnvRebalanceTolerance, "ten"},
		{schema.EnvRebalanceTolerance, "0"},
		{schema.EnvRebalanceTolerance, "1.5"},
		{schema.EnvRebalanceMaxFraction, "-0.1"},
		{schema.EnvRebalanceCooling, "5"},
		{schema.EnvRebalanceCooling, "-1m"},
		{schema.EnvRebalanceMinInterval, "-1s"},
		{schema.EnvRebalanceSettle, "soon"},
	} {
		t.Run(tc.name+"="+tc.value, func(t *testing.T) {
			t.Setenv(tc.name, tc.value)
			if c, err := roundsConfig(); err == nil {
				t.Fatalf("accepted: %+v", c)
			}
		})
	}
}
