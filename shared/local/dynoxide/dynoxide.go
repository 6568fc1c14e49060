// Package dynoxide finds and starts dynoxide, the local DynamoDB engine (with
// Streams) that `make local-tools` installs under .tools/local. Tests and `make run`
// use it.
package dynoxide

import (
	"fmt"
	"os"
	"os/exec"
	"time"

	"github.com/sockfleet/sockfleet/shared/local/localengine"
	"github.com/sockfleet/sockfleet/shared/local/npmtools"
)

// BinaryEnv overrides where the engine binary is looked for.
const BinaryEnv = "SOCKFLEET_DYNOXIDE"

// binRel is where `make local-tools` installs the engine, relative to the repo root.
const binRel = npmtools.LocalModules + "/@dynoxide/linux-x64/dynoxide"

// Proc is a running engine: its Endpoint is http://127.0.0.1:PORT, and Stop ends it
// (SIGTERM, then SIGKILL after a second).
type Proc = localengine.Proc

// Options for Start.
type Options struct {
	Port   int    // 0: pick a free port
	DBPath string // "": in memory
	Log    *os.File
}

// Start runs the engine and waits until it accepts connections. The engine is killed
// if this process dies (Linux parent-death signal), so a crashed test leaves nothing.
func Start(o Options) (*Proc, error) {
	bin, err := FindBinary()
	if err != nil {
		return nil, err
	}
	return localengine.Start(localengine.Spec{
		Name: "dynoxide", Port: o.Port, Ready: 10 * time.Second, Log: o.Log,
		Command: func(port int) *exec.Cmd {
			args := []string{"serve", "--host", "127.0.0.1", "--port", fmt.Sprint(port)}
			if o.DBPath != "" {
				args = append(args, "--db-path", o.DBPath)
			}
			return exec.Command(bin, args...)
		},
	})
}

// FindBinary returns the engine binary: $SOCKFLEET_DYNOXIDE, or .tools/local/… in this or
// a parent directory. Its error says how to install it.
func FindBinary() (string, error) {
	return localengine.Find(BinaryEnv, binRel, "",
		"the local DynamoDB engine (dynoxide) is not installed: run `make local-tools` (or `make tools`, which also installs the CDK CLI) in the repository root (make test and make run do this), or set "+BinaryEnv)
}
