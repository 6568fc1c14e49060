package fleet

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
)

// Binaries are the programs a local fleet runs.
type Binaries struct {
	Worker, Bootstrap, RIE string
}

// Build compiles the worker and the reconciler (for this machine) into dir, and finds
// the runtime emulator that `make tools` installs under .tools/bin.
func Build(dir string) (Binaries, error) {
	b := Binaries{Worker: filepath.Join(dir, "worker"), Bootstrap: filepath.Join(dir, "bootstrap")}
	for _, step := range []struct {
		out, pkg string
		env      []string
	}{
		{b.Worker, "github.com/sockfleet/sockfleet/worker", nil},
		{b.Bootstrap, "github.com/sockfleet/sockfleet/functions/reconciler", []string{"CGO_ENABLED=0"}},
	} {
		cmd := exec.Command("go", "build", "-tags", "lambda.norpc", "-o", step.out, step.pkg)
		cmd.Env = append(os.Environ(), step.env...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return b, fmt.Errorf("build %s: %v\n%s", step.pkg, err, out)
		}
	}
	rie, err := findUp(".tools/bin/aws-lambda-rie")
	if err != nil {
		return b, fmt.Errorf("the Lambda runtime emulator is not installed: run `make tools` (make test does): %w", err)
	}
	b.RIE = rie
	return b, nil
}

var built struct {
	once sync.Once
	bins Binaries
	err  error
}

// BuildOnce is Build into a fresh temporary folder, once per process, so that the
// tests of one test binary share the binaries. The folder is not removed.
func BuildOnce() (Binaries, error) {
	built.once.Do(func() {
		dir, err := os.MkdirTemp("", "sockfleet-bin")
		if err != nil {
			built.err = err
			return
		}
		built.bins, built.err = Build(dir)
	})
	return built.bins, built.err
}

func findUp(rel string) (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		p := filepath.Join(dir, rel)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("%s not found in this or a parent folder", rel)
		}
		dir = parent
	}
}
