package npmtools

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// preload makes Node report another platform: npm reads process.platform and
// process.arch to check a package's "os" and "cpu" fields, so `npm ci` under it
// behaves as on that machine as far as the install check goes.
const preload = `
const [platform, arch] = process.env.SOCKFLEET_FAKE_PLATFORM.split('-');
Object.defineProperty(process, 'platform', { value: platform });
Object.defineProperty(process, 'arch', { value: arch });
`

// Every platform the deploy path must work from.
var platforms = []string{"darwin-arm64", "darwin-x64", "win32-x64", "linux-arm64", "linux-x64"}

// npmCI runs `npm ci --dry-run` on a copy of the package in dir (package.json and the
// lock file), with Node pretending to be platform. --offline with a fresh cache: the
// lock file holds everything a dry run reads, so no registry is asked, and the run
// leaves nothing behind. It returns npm's output and whether it succeeded.
func npmCI(t *testing.T, dir, platform string) (string, bool) {
	t.Helper()
	npm, err := exec.LookPath("npm")
	if err != nil {
		t.Skip("npm is not installed (the repository needs Node.js ≥ 20 with npm)")
	}
	work := t.TempDir()
	pkg := filepath.Join(work, "pkg")
	if err := os.Mkdir(pkg, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"package.json", "package-lock.json"} {
		b, err := os.ReadFile(filepath.Join(repoRoot(t), dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(pkg, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	pre := filepath.Join(work, "platform.js")
	if err := os.WriteFile(pre, []byte(preload), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(npm, "ci", "--dry-run", "--offline", "--ignore-scripts", "--no-audit", "--no-fund",
		"--no-update-notifier", "--cache", filepath.Join(work, "cache"))
	cmd.Dir = pkg
	cmd.Env = append(os.Environ(), "NODE_OPTIONS=--require "+pre, "SOCKFLEET_FAKE_PLATFORM="+platform)
	out, err := cmd.CombinedOutput()
	return string(out), err == nil
}

// repoRoot is the repository root: this package is shared/local/npmtools.
func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot find the test's own file")
	}
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

// `make synth` and `make deploy` install only the deploy tools: they must install on
// every platform a deployer may use. The same preload on the local engines
// reproduces the refusal the deploy path had when it installed them too (dynoxide's
// binary is published for linux-x64 only), so the preload does change what npm
// checks and the deploy cases prove something. All cases run in parallel: each is a
// separate npm process, and most of its time is Node starting up.
func TestToolsPerPlatform(t *testing.T) {
	type tc struct {
		dir, platform string
		ok            bool
	}
	var cases []tc
	for _, p := range platforms {
		cases = append(cases, tc{DeployDir, p, true})
	}
	cases = append(cases, tc{LocalDir, "darwin-arm64", false}, tc{LocalDir, "linux-x64", true})
	for _, c := range cases {
		t.Run(filepath.Base(c.dir)+"/"+c.platform, func(t *testing.T) {
			t.Parallel()
			out, ok := npmCI(t, c.dir, c.platform)
			switch {
			case ok != c.ok:
				t.Fatalf("npm ci of %s as %s: success %v, want %v:\n%s", c.dir, c.platform, ok, c.ok, out)
			case !c.ok && !strings.Contains(out, "EBADPLATFORM"):
				t.Errorf("npm ci of %s as %s failed without EBADPLATFORM:\n%s", c.dir, c.platform, out)
			case c.dir == DeployDir && !strings.Contains(out, "aws-cdk"):
				t.Errorf("npm ci of %s as %s did not install aws-cdk:\n%s", c.dir, c.platform, out)
			}
		})
	}
}
