// Package netguard enforces the security group rules of the synthesized template
// (package netrules) on the calls the local fleet's processes make to each other, so
// a call AWS would drop fails locally too.
//
// How: a Front is a small TCP proxy in front of a listener of the fleet (each worker's
// wakeup port). For every connection it accepts, it finds the calling process: the
// kernel's socket diagnostics (netlink, as `ss` uses; /proc/net/tcp where there are
// none) give the inode of the caller's end of the connection, which one of the
// fleet's registered processes holds open in /proc/<pid>/fd. The process (or the
// registered process it descends from: the reconciler runs as a child of the Lambda
// runtime emulator) gives the caller's workload, the template gives each workload's
// security groups, and netrules.Template.DecideWorkloads judges the call on the port
// the template names for the listener (the worker's container port, 8080, whatever
// local port a worker has). Allowed connections are forwarded; denied ones are reset.
//
// Why this way: it needs no change to the shipped binaries (they cannot be told a
// source address to dial from without a setting that exists only for this), no root
// (network namespaces would, and `make run` runs on laptops), and it judges the real
// process, not what a process says it is.
//
// Guarantees:
//   - A call between two registered processes through a Front is forwarded only if
//     the template admits it (an egress rule of the caller's group and an ingress rule
//     of the callee's), judged once per TCP connection before any byte is forwarded.
//   - A denied call is reset at once (SO_LINGER 0): the caller's request fails with
//     "connection reset by peer". A security group drops the packets instead, so on
//     AWS the same call fails only when the caller's own timeout ends; the outcome for
//     the caller is the same failed call, and locally it comes without the wait. Each
//     denial is logged at Warn with caller, callee, port and the missing rule, kept
//     (Denials), and passed to the OnDeny hook.
//
// Non-guarantees:
//   - Callers that are none of the registered processes (the test harness, the
//     operator's CLI, curl, benchmarks reading /metrics) are forwarded unjudged and
//     logged at Debug: on AWS they are the health checks run inside the task and the
//     metrics CloudWatch collects, which no security group sees.
//   - Only connections through a Front are judged. The fleet's calls to the stand-ins
//     of AWS services (DynamoDB, Kinesis, the Lambda runtime API) and to upstreams are
//     not, nor is anyone who finds a worker's real listener port.
//   - A process is judged by what it was registered as; one registered after it made
//     a call (a worker is registered right after it is started, long before it can
//     call anyone) would have been taken as outside the fleet.
//   - Linux only (netlink, /proc). New reports the error elsewhere; the fleet then runs
//     without enforcement and says so.
package netguard

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/sockfleet/sockfleet/shared/local/netrules"
)

// Party is one side of a call.
type Party struct {
	Workload string // netrules.Worker or netrules.Reconciler; empty for a caller outside the fleet
	Name     string // e.g. the worker id
	Pid      int
}

func (p Party) String() string {
	if p.Workload == "" {
		return fmt.Sprintf("process %d outside the fleet", p.Pid)
	}
	if p.Name == "" {
		return fmt.Sprintf("%s (pid %d)", p.Workload, p.Pid)
	}
	return fmt.Sprintf("%s %s (pid %d)", p.Workload, p.Name, p.Pid)
}

// Denial is one refused call.
type Denial struct {
	At             time.Time
	Caller, Callee Party
	Port           int // the port as the template names it (the worker's 8080)
	LocalPort      int // the port the caller dialed on this machine
	Decision       netrules.Decision
}

func (d Denial) String() string {
	return fmt.Sprintf("%s -> %s on port %d (locally %d): %s", d.Caller, d.Callee, d.Port, d.LocalPort, d.Decision)
}

// maxKept bounds the denials Denials keeps; Denied counts them all.
const maxKept = 1000

// Guard knows the fleet's processes and judges calls between them.
type Guard struct {
	rules  *netrules.Template
	log    *slog.Logger
	onDeny func(Denial)

	mu      sync.Mutex
	procs   map[int]Party // registered processes
	trees   map[int]Party // registered processes whose descendants are theirs too
	desc    map[int]int   // a descendant's pid -> its registered ancestor's
	denials []Denial
	denied  int
}

// New returns a guard judging by rules. onDeny, if set, is called (synchronously, in
// the Front's goroutine) with each denial. It fails where callers cannot be found
// (not Linux).
func New(rules *netrules.Template, log *slog.Logger, onDeny func(Denial)) (*Guard, error) {
	if rules == nil {
		return nil, errors.New("netguard: no rules")
	}
	if err := supported(); err != nil {
		return nil, fmt.Errorf("netguard: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Guard{rules: rules, log: log, onDeny: onDeny,
		procs: map[int]Party{}, trees: map[int]Party{}, desc: map[int]int{}}, nil
}

// Add registers process pid as a member of workload, called name in logs.
func (g *Guard) Add(pid int, workload, name string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.procs[pid] = Party{Workload: workload, Name: name, Pid: pid}
}

// AddTree registers pid and every process descending from it (now or later) as
// members of workload.
func (g *Guard) AddTree(pid int, workload, name string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.trees[pid] = Party{Workload: workload, Name: name, Pid: pid}
}

// Remove forgets pid (after it exited: pids are reused).
func (g *Guard) Remove(pid int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.procs, pid)
	delete(g.trees, pid)
	for d, root := range g.desc {
		if root == pid {
			delete(g.desc, d)
		}
	}
}

// Denials returns the denials so far (the first maxKept), oldest first.
func (g *Guard) Denials() []Denial {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.denials)
}

// Denied counts every denial so far.
func (g *Guard) Denied() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.denied
}

// errCallerGone: the caller closed its end before it could be found.
var errCallerGone = errors.New("the caller's socket is gone")

// identify finds the process behind the caller's end of c.
func (g *Guard) identify(c net.Conn) (Party, error) {
	local, ok1 := c.LocalAddr().(*net.TCPAddr)
	remote, ok2 := c.RemoteAddr().(*net.TCPAddr)
	if !ok1 || !ok2 {
		return Party{}, fmt.Errorf("not a TCP connection: %s", c.RemoteAddr())
	}
	// The caller's socket: its local end is our remote one.
	ino, err := socketInode(remote.AddrPort(), local.AddrPort())
	if errors.Is(err, errNoSocket) {
		return Party{}, errCallerGone
	}
	if err != nil {
		return Party{}, err
	}
	g.mu.Lock()
	procs := make([]Party, 0, len(g.procs)+len(g.trees)+len(g.desc))
	for _, p := range g.procs {
		procs = append(procs, p)
	}
	for _, p := range g.trees {
		procs = append(procs, p)
	}
	for d, root := range g.desc {
		p := g.trees[root]
		p.Pid = d
		procs = append(procs, p)
	}
	roots := make([]int, 0, len(g.trees))
	for pid := range g.trees {
		roots = append(roots, pid)
	}
	g.mu.Unlock()
	for _, p := range procs {
		if holds(p.Pid, ino) {
			return p, nil
		}
	}
	if len(roots) == 0 {
		return Party{}, nil
	}
	// A descendant not seen before (the emulator starts the function on its first
	// invocation, and again after a crash): look the trees up again.
	for _, root := range roots {
		for _, d := range descendants([]int{root}) {
			g.mu.Lock()
			p, ok := g.trees[root]
			if ok {
				g.desc[d] = root
			}
			g.mu.Unlock()
			if ok && holds(d, ino) {
				p.Pid = d
				return p, nil
			}
		}
	}
	return Party{}, nil
}

// Front is a TCP proxy in front of one listener of the fleet, judging every caller.
type Front struct {
	g      *Guard
	ln     net.Listener
	target string
	callee func() Party
	port   int

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// Front listens on addr and forwards each admitted connection to target: the
// listener of callee (called when a connection comes, so it may name the process
// there now), which the template has on port.
func (g *Guard) Front(addr, target string, port int, callee func() Party) (*Front, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("netguard: listen on %s in front of %s: %w", addr, target, err)
	}
	f := &Front{g: g, ln: ln, target: target, callee: callee, port: port, conns: map[net.Conn]struct{}{}}
	f.wg.Add(1)
	go f.serve()
	return f, nil
}

// Addr is where the Front listens.
func (f *Front) Addr() string { return f.ln.Addr().String() }

// Close stops accepting, closes every connection and waits for them.
func (f *Front) Close() error {
	f.mu.Lock()
	f.closed = true
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	err := f.ln.Close()
	f.wg.Wait()
	return err
}

func (f *Front) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.conns[c] = struct{}{}
	return true
}

func (f *Front) untrack(c net.Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.conns, c)
}

func (f *Front) serve() {
	defer f.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			f.g.log.Error("netguard: accept", "addr", f.Addr(), "err", err)
			time.Sleep(10 * time.Millisecond) // e.g. out of file descriptors: do not spin
			continue
		}
		if !f.track(c) {
			c.Close()
			return
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer f.untrack(c)
			f.handle(c)
		}()
	}
}

func (f *Front) handle(c net.Conn) {
	localPort := 0
	if a, ok := c.LocalAddr().(*net.TCPAddr); ok {
		localPort = a.Port
	}
	callee := f.callee()
	caller, err := f.g.identify(c)
	switch {
	case errors.Is(err, errCallerGone):
		c.Close()
		return
	case err != nil:
		// Not knowing who calls must not let a call through.
		f.g.log.Error("netguard: cannot find the caller; connection refused", "callee", callee.String(), "local_port", localPort, "err", err)
		reset(c)
		return
	case caller.Workload == "":
		f.g.log.Debug("netguard: caller outside the fleet, not judged", "callee", callee.String(), "local_port", localPort)
	default:
		d, err := f.g.rules.DecideWorkloads(caller.Workload, callee.Workload, f.port)
		if err != nil {
			d = netrules.Decision{Missing: []netrules.Direction{netrules.Egress, netrules.Ingress}, Port: f.port,
				CallerGroup: "(" + err.Error() + ")", CalleeGroup: callee.Workload}
		}
		if !d.Allowed {
			f.g.deny(Denial{At: time.Now(), Caller: caller, Callee: callee, Port: f.port, LocalPort: localPort, Decision: d})
			reset(c)
			return
		}
		f.g.log.Debug("netguard: call allowed", "caller", caller.String(), "callee", callee.String(),
			"port", f.port, "local_port", localPort, "egress", d.Egress.String(), "ingress", d.Ingress.String())
	}
	up, err := net.DialTimeout("tcp", f.target, 5*time.Second)
	if err != nil {
		// Nothing listens behind the Front (a worker restarting): as if nothing
		// listened on the port.
		reset(c)
		return
	}
	if !f.track(up) {
		up.Close()
		c.Close()
		return
	}
	defer f.untrack(up)
	pipe(c, up)
}

func (g *Guard) deny(d Denial) {
	g.mu.Lock()
	g.denied++
	if len(g.denials) < maxKept {
		g.denials = append(g.denials, d)
	}
	g.mu.Unlock()
	g.log.Warn("network rules: call denied, as the template's security groups would",
		"caller", d.Caller.String(), "callee", d.Callee.String(), "port", d.Port, "local_port", d.LocalPort,
		"missing", d.Decision.String(), "template", g.rules.Path)
	if g.onDeny != nil {
		g.onDeny(d)
	}
}

// reset closes c with a TCP reset.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
}

// pipe copies both ways until both directions end, passing half-closes on.
func pipe(a, b net.Conn) {
	var wg sync.WaitGroup
	cp := func(dst, src net.Conn) {
		defer wg.Done()
		_, _ = io.Copy(dst, src)
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		} else {
			dst.Close()
		}
	}
	wg.Add(2)
	go cp(a, b)
	go cp(b, a)
	wg.Wait()
	a.Close()
	b.Close()
}

// Summary groups denials by workloads, port and missing rule, in order of first
// occurrence: one line each, with a count and the first call's parties.
func Summary(ds []Denial) []string {
	type group struct {
		first Denial
		n     int
	}
	var keys []string
	groups := map[string]*group{}
	for _, d := range ds {
		k := fmt.Sprintf("%s->%s:%d:%s", d.Caller.Workload, d.Callee.Workload, d.Port, d.Decision)
		if g, ok := groups[k]; ok {
			g.n++
			continue
		}
		keys = append(keys, k)
		groups[k] = &group{first: d, n: 1}
	}
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		g := groups[k]
		d := g.first
		out = append(out, fmt.Sprintf("%s to %s on port %d, %d times (first %s -> %s, locally port %d): %s",
			d.Caller.Workload, d.Callee.Workload, d.Port, g.n, d.Caller, d.Callee, d.LocalPort, d.Decision))
	}
	return out
}
