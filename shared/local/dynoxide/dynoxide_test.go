package dynoxide

import (
	"testing"

	"github.com/sockfleet/sockfleet/shared/local/localengine/enginetest"
)

// Without the engine installed, the error says how to install it.
func TestMissingEngineNamesMakeTools(t *testing.T) {
	enginetest.CheckMissing(t, BinaryEnv,
		func() error { _, err := FindBinary(); return err },
		func() error { _, err := Start(Options{}); return err })
}

// Started from the repository, it serves on loopback and stops: Stop returns once
// the engine has exited, so its port is closed.
func TestStartStop(t *testing.T) {
	enginetest.CheckStartStop(t, func() (*Proc, error) { return Start(Options{}) })
}
