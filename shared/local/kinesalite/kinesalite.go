// Package kinesalite finds and starts kinesalite, the local Kinesis Data Streams
// engine (npm, on LevelDB with a prebuilt native module) that `make local-tools`
// installs under .tools/local. Tests and `make run` use it.
package kinesalite

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"time"

	"github.com/sockfleet/sockfleet/shared/local/localengine"
	"github.com/sockfleet/sockfleet/shared/local/npmtools"
)

// DirEnv overrides where the kinesalite package is looked for.
const DirEnv = "SOCKFLEET_KINESALITE"

// dirRel is where `make local-tools` installs the engine, relative to the repo root.
const dirRel = npmtools.LocalModules + "/kinesalite"

// launcher binds kinesalite to loopback (its own CLI listens on every interface)
// and makes streams ACTIVE at once instead of after 500 ms.
const launcher = `
const k = require(process.env.KINESALITE_DIR);
const opts = {createStreamMs: 0, deleteStreamMs: 0, updateStreamMs: 0, shardLimit: 1000};
if (process.env.KINESALITE_PATH) opts.path = process.env.KINESALITE_PATH;
const s = k(opts).listen(Number(process.env.KINESALITE_PORT), '127.0.0.1', () => console.log('listening on', s.address()));
`

// Proc is a running engine: its Endpoint is http://127.0.0.1:PORT, and Stop ends it
// (SIGTERM, then SIGKILL after a second).
type Proc = localengine.Proc

// Options for Start.
type Options struct {
	Port int    // 0: pick a free port
	Path string // LevelDB directory; "": in memory
	Log  *os.File
}

// Start runs the engine and waits until it accepts connections. The engine is killed
// if this process dies (Linux parent-death signal), so a crashed test leaves nothing.
func Start(o Options) (*Proc, error) {
	dir, err := FindDir()
	if err != nil {
		return nil, err
	}
	node, err := exec.LookPath("node")
	if err != nil {
		return nil, errors.New("kinesalite needs Node.js (node) on PATH: install Node.js ≥ 20, then run `make local-tools` (or `make tools`)")
	}
	return localengine.Start(localengine.Spec{
		Name: "kinesalite", Port: o.Port, Ready: 15 * time.Second, Log: o.Log,
		Command: func(port int) *exec.Cmd {
			cmd := exec.Command(node, "-e", launcher)
			cmd.Env = append(os.Environ(), "KINESALITE_DIR="+dir, fmt.Sprintf("KINESALITE_PORT=%d", port), "KINESALITE_PATH="+o.Path)
			return cmd
		},
	})
}

// FindDir returns the kinesalite package directory: $SOCKFLEET_KINESALITE, or
// .tools/local/… in this or a parent directory. Its error says how to install it.
func FindDir() (string, error) {
	return localengine.Find(DirEnv, dirRel, "index.js",
		"the local Kinesis engine (kinesalite) is not installed: run `make local-tools` (or `make tools`, which also installs the CDK CLI) in the repository root (make test and make run do this), or set "+DirEnv)
}
