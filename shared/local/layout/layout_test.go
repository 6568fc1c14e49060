package layout

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
)

const module = "github.com/sockfleet/sockfleet"

// The worker image and the Lambda are built for linux/arm64 without cgo, so the
// build graph is read for that target: the files a build reads depend on it.
var target = []string{"GOOS=linux", "GOARCH=arm64", "CGO_ENABLED=0"}

// sharedByOne lists the packages under shared/ that only one deployable links, with
// the reason each stays shared. Everything else under shared/ must be linked by two
// or more deployables.
var sharedByOne = map[string]string{
	"shared/filters": "the CDK app renders the event filter patterns into the event source mapping; " +
		"the local stream poller applies the same data, so a local run sees the records production does",
}

// deployable is something that ships: a binary, or the CDK app.
type deployable struct {
	name  string
	pkgs  []string // what `go list -deps` is given, from the repository root
	noCmd bool     // must not link cmd/ either
}

func deployables(t *testing.T, root string) []deployable {
	return []deployable{
		{name: "worker", pkgs: []string{"./worker"}, noCmd: true},
		{name: "reconciler", pkgs: []string{"./functions/reconciler"}, noCmd: true},
		{name: "operator CLI", pkgs: []string{"./cmd/sockfleet"}},
		// infra/ is a module of its own that replaces this one with ../: what it
		// links of this module is the closure of its imports, listed from here.
		{name: "CDK app", pkgs: infraImports(t, root)},
	}
}

// pkg is the part of `go list -json` output the tests read.
type pkg struct {
	ImportPath string
	Dir        string
	Imports    []string
	GoFiles    []string
	CgoFiles   []string
	EmbedFiles []string
	SFiles     []string
	HFiles     []string
	SysoFiles  []string
	Module     *struct{ Main bool }
}

func (p pkg) rel() string { return strings.TrimPrefix(p.ImportPath, module+"/") }

func repoRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		t.Fatal("go env GOMOD: not inside a module")
	}
	return filepath.Dir(mod)
}

// listed caches goList's answers: the tests ask for the same graphs more than once.
var listed sync.Map // root + args -> []pkg

// goList runs `go list -json args` in root for the target platform and returns the
// packages of this module it lists.
func goList(t *testing.T, root string, args ...string) []pkg {
	t.Helper()
	key := root + "\x00" + strings.Join(args, "\x00")
	if ps, ok := listed.Load(key); ok {
		return ps.([]pkg)
	}
	cmd := exec.Command("go", append([]string{"list", "-json"}, args...)...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), target...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %s: %v\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	var ps []pkg
	for dec := json.NewDecoder(bytes.NewReader(out)); ; {
		var p pkg
		err := dec.Decode(&p)
		if errors.Is(err, io.EOF) {
			listed.Store(key, ps)
			return ps
		}
		if err != nil {
			t.Fatalf("go list %s: decode: %v", strings.Join(args, " "), err)
		}
		if p.Module != nil && p.Module.Main {
			ps = append(ps, p)
		}
	}
}

// deps returns the packages of this module that pkgs link.
func deps(t *testing.T, root string, pkgs []string) []pkg {
	t.Helper()
	if len(pkgs) == 0 {
		return nil
	}
	return goList(t, root, append([]string{"-deps"}, pkgs...)...)
}

// infraImports returns the packages of this module that the CDK app's own
// (non-test) files import.
func infraImports(t *testing.T, root string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "infra", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatalf("parse %s: %v", f, err)
		}
		for _, is := range af.Imports {
			p, err := strconv.Unquote(is.Path.Value)
			if err != nil {
				t.Fatalf("%s: import %s: %v", f, is.Path.Value, err)
			}
			if strings.HasPrefix(p, module+"/") && !under(strings.TrimPrefix(p, module+"/"), "infra") {
				seen[p] = true
			}
		}
	}
	out := make([]string, 0, len(seen))
	for p := range seen {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// under reports whether the slash path rel is dir or inside it.
func under(rel, dir string) bool { return rel == dir || strings.HasPrefix(rel, dir+"/") }

// importChain names how ps reach p: "p ← importer ← … ← root".
func importChain(ps []pkg, p string) string {
	importer := map[string]string{}
	for _, q := range ps {
		for _, imp := range q.Imports {
			if _, ok := importer[imp]; !ok {
				importer[imp] = q.ImportPath
			}
		}
	}
	chain := []string{strings.TrimPrefix(p, module+"/")}
	for cur, n := p, 0; n < len(ps); n++ {
		next, ok := importer[cur]
		if !ok {
			break
		}
		chain = append(chain, strings.TrimPrefix(next, module+"/"))
		cur = next
	}
	return strings.Join(chain, " ← ")
}

func TestShippedCodeLinksNothingLocal(t *testing.T) {
	root := repoRoot(t)
	// The check must see local packages where they are linked, or it proves nothing.
	if !slices.ContainsFunc(deps(t, root, []string{"./cmd/sockfleet-local"}), func(p pkg) bool {
		return under(p.rel(), "shared/local")
	}) {
		t.Fatal("cmd/sockfleet-local links nothing under shared/local: this check no longer sees what it looks for")
	}
	for _, d := range deployables(t, root) {
		t.Run(d.name, func(t *testing.T) {
			ps := deps(t, root, d.pkgs)
			if len(ps) == 0 {
				t.Fatalf("%s links no package of this module (given %v): the check would pass on nothing", d.name, d.pkgs)
			}
			for _, p := range ps {
				switch rel := p.rel(); {
				case under(rel, "shared/local"):
					t.Errorf("%s links %s, which never ships: %s", d.name, rel, importChain(ps, p.ImportPath))
				case d.noCmd && under(rel, "cmd"):
					t.Errorf("%s links %s, a command's package: %s", d.name, rel, importChain(ps, p.ImportPath))
				}
			}
		})
	}
}

func TestSharedPackagesLinkedByTwoDeployables(t *testing.T) {
	root := repoRoot(t)
	users := map[string][]string{} // package under shared/ -> deployables linking it
	for _, d := range deployables(t, root) {
		for _, p := range deps(t, root, d.pkgs) {
			users[p.rel()] = append(users[p.rel()], d.name)
		}
	}
	found := map[string]bool{}
	for _, p := range goList(t, root, "./shared/...") {
		rel := p.rel()
		if under(rel, "shared/local") || len(p.GoFiles)+len(p.CgoFiles) == 0 {
			continue
		}
		found[rel] = true
		by := users[rel]
		why, excepted := sharedByOne[rel]
		switch {
		case len(by) >= 2 && excepted:
			t.Errorf("%s is linked by %s: drop it from sharedByOne", rel, strings.Join(by, ", "))
		case len(by) >= 2:
		case len(by) == 1 && excepted:
			t.Logf("%s: linked by the %s only, shared because %s", rel, by[0], why)
		case len(by) == 1:
			t.Errorf("%s is linked by the %s only: move it under that deployable (worker/internal/…, functions/reconciler/…), or list it in sharedByOne with the reason", rel, by[0])
		default:
			t.Errorf("%s is linked by no deployable: move it under shared/local if it never ships", rel)
		}
	}
	if len(found) == 0 {
		t.Fatal("go list ./shared/... found no shared package")
	}
	for rel := range sharedByOne {
		if !found[rel] {
			t.Errorf("sharedByOne names %s, which is not a package under shared/", rel)
		}
	}
}

// rule is one line of a .dockerignore file.
type rule struct {
	text      string
	re        *regexp.Regexp
	exclusion bool // "!pattern": re-includes what it matches
}

// parseDockerignore reads .dockerignore lines as Docker does (its ignorefile and
// patternmatcher packages): "#" starts a comment line; lines are trimmed; a leading
// "!" re-includes; a pattern is path-cleaned and a leading "/" dropped; "*" matches
// within one path element, "?" one character of one, "**" any number of elements
// (none included). Character classes and backslash escapes are refused rather than
// approximated.
func parseDockerignore(b []byte) ([]rule, error) {
	var rules []rule
	for i, line := range strings.Split(string(bytes.TrimPrefix(b, []byte("\ufeff"))), "\n") {
		if strings.HasPrefix(line, "#") {
			continue
		}
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		r := rule{text: line}
		if line[0] == '!' {
			r.exclusion = true
			line = strings.TrimSpace(line[1:])
			if line == "" {
				return nil, fmt.Errorf("line %d: %q: nothing after !", i+1, r.text)
			}
		}
		line = path.Clean(line)
		if len(line) > 1 && line[0] == '/' {
			line = line[1:]
		}
		if strings.ContainsAny(line, `[]\`) {
			return nil, fmt.Errorf("line %d: %q: character classes and escapes are not supported by this check", i+1, r.text)
		}
		var re strings.Builder
		re.WriteString("^")
		for j := 0; j < len(line); j++ {
			switch {
			case strings.HasPrefix(line[j:], "**"):
				j++
				if j+1 < len(line) && line[j+1] == '/' {
					j++
				}
				if j+1 == len(line) {
					re.WriteString(".*")
				} else {
					re.WriteString("(.*/)?")
				}
			case line[j] == '*':
				re.WriteString("[^/]*")
			case line[j] == '?':
				re.WriteString("[^/]")
			default:
				re.WriteString(regexp.QuoteMeta(line[j : j+1]))
			}
		}
		re.WriteString("$")
		rx, err := regexp.Compile(re.String())
		if err != nil {
			return nil, fmt.Errorf("line %d: %q: %w", i+1, r.text, err)
		}
		r.re = rx
		rules = append(rules, r)
	}
	return rules, nil
}

// excluded reports whether rules keep the slash path file out of the build context:
// the last rule that matches the file or one of its parent directories decides.
func excluded(rules []rule, file string) bool {
	matched := false
	for _, r := range rules {
		if r.exclusion != matched {
			continue // only an exclusion can undo a match, only a pattern make one
		}
		hit := r.re.MatchString(file)
		for dir := path.Dir(file); !hit && dir != "."; dir = path.Dir(dir) {
			hit = r.re.MatchString(dir)
		}
		if hit {
			matched = !r.exclusion
		}
	}
	return matched
}

func TestDockerignoreSemantics(t *testing.T) {
	rules, err := parseDockerignore([]byte(`# a comment
docs
/infra
**/*_test.go
**/testdata
*.md
shared/lo?al
cmd
!cmd/keep
  bin/  
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		file string
		want bool
	}{
		{"docs/BENCHMARKS.md", true},
		{"docs", true},
		{"infra/stack.go", true},
		{"x_test.go", true},
		{"worker/internal/app/app_test.go", true},
		{"worker/internal/app/app.go", false},
		{"functions/reconciler/records/testdata/acquired.json", true},
		{"README.md", true},
		{"worker/README.md", false}, // "*" stays within one path element
		{"shared/local/fleet/stack.go", true},
		{"shared/lease/lease.go", false},
		{"cmd/sockfleet/main.go", true},
		{"cmd/keep/main.go", false},
		{"bin/reconciler/bootstrap", true},
		{"go.mod", false},
		{"# a comment", false},
	} {
		if got := excluded(rules, tc.file); got != tc.want {
			t.Errorf("excluded(%q) = %v, want %v", tc.file, got, tc.want)
		}
	}
	for _, bad := range []string{"!", "a[bc]", `a\*`} {
		if _, err := parseDockerignore([]byte(bad)); err == nil {
			t.Errorf("%q parsed; want it refused", bad)
		}
	}
}

// trackedFiles lists what `git ls-files` lists in root.
func trackedFiles(t *testing.T, root string) []string {
	t.Helper()
	if _, err := os.Stat(filepath.Join(root, ".git")); err != nil {
		t.Skipf("not a git checkout (%v): the tracked files cannot be listed", err)
	}
	cmd := exec.Command("git", "ls-files", "-z")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	return strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
}

func TestDockerignoreKeepsOnlyWhatTheWorkerBuilds(t *testing.T) {
	root := repoRoot(t)
	b, err := os.ReadFile(filepath.Join(root, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	rules, err := parseDockerignore(b)
	if err != nil {
		t.Fatalf(".dockerignore: %v", err)
	}
	// What the Dockerfile's `go build ./worker` reads: go.mod, go.sum and the files
	// of every package of this module the worker links.
	need := map[string]bool{"go.mod": true, "go.sum": true}
	for _, p := range deps(t, root, []string{"./worker"}) {
		dir, err := filepath.Rel(root, p.Dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, files := range [][]string{p.GoFiles, p.CgoFiles, p.EmbedFiles, p.SFiles, p.HFiles, p.SysoFiles} {
			for _, f := range files {
				need[path.Join(filepath.ToSlash(dir), f)] = true
			}
		}
	}
	if len(need) <= 2 {
		t.Fatal("go list -deps ./worker listed no package of this module")
	}
	var missing, extra []string
	for f := range need {
		if excluded(rules, f) {
			missing = append(missing, f)
		}
	}
	tracked := trackedFiles(t, root)
	for _, f := range tracked {
		if !need[f] && !excluded(rules, f) {
			extra = append(extra, f)
		}
	}
	sort.Strings(missing)
	sort.Strings(extra)
	for _, f := range missing {
		t.Errorf(".dockerignore excludes %s, which the worker's build reads", f)
	}
	for _, f := range extra {
		t.Errorf(".dockerignore lets in %s, which the worker's build does not read: exclude it", f)
	}
	// The folders the layout promises stay out are checked above only through the
	// files git lists in them.
	for _, dir := range []string{"shared/local", "cmd", "functions", "infra", "docs"} {
		if !slices.ContainsFunc(tracked, func(f string) bool { return under(f, dir) }) {
			t.Errorf("git ls-files lists nothing under %s/: the check of that folder proves nothing", dir)
		}
	}
}
