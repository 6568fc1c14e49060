//go:build linux

package netguard

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/sockfleet/sockfleet/shared/local/netrules"
)

// template is a minimal stack: workers in W listening on 8080, the reconciler in R,
// with the given extra resources (rules) in JSON.
func template(t *testing.T, rules string) *netrules.Template {
	t.Helper()
	doc := `{"Resources": {
	  "W": {"Type": "AWS::EC2::SecurityGroup", "Properties": {"GroupDescription": "workers",
	    "SecurityGroupEgress": [{"CidrIp": "0.0.0.0/0", "IpProtocol": "-1"}]}},
	  "R": {"Type": "AWS::EC2::SecurityGroup", "Properties": {"GroupDescription": "reconciler"}},
	  "Task": {"Type": "AWS::ECS::TaskDefinition", "Properties": {"ContainerDefinitions": [
	    {"Name": "worker", "PortMappings": [{"ContainerPort": 8080, "Protocol": "tcp"}]}]}},
	  "Svc": {"Type": "AWS::ECS::Service", "Properties": {"TaskDefinition": {"Ref": "Task"},
	    "NetworkConfiguration": {"AwsvpcConfiguration": {"SecurityGroups": [{"Fn::GetAtt": ["W", "GroupId"]}]}}}},
	  "Fn": {"Type": "AWS::Lambda::Function", "Properties": {"VpcConfig": {"SecurityGroupIds": [{"Fn::GetAtt": ["R", "GroupId"]}]}}}` +
		rules + `}}`
	tm, err := netrules.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return tm
}

const (
	wakeupRules = `,
	  "RtoW": {"Type": "AWS::EC2::SecurityGroupIngress", "Properties": {"IpProtocol": "tcp", "FromPort": 8080, "ToPort": 8080,
	    "GroupId": {"Fn::GetAtt": ["W", "GroupId"]}, "SourceSecurityGroupId": {"Fn::GetAtt": ["R", "GroupId"]}}},
	  "RoutW": {"Type": "AWS::EC2::SecurityGroupEgress", "Properties": {"IpProtocol": "tcp", "FromPort": 8080, "ToPort": 8080,
	    "GroupId": {"Fn::GetAtt": ["R", "GroupId"]}, "DestinationSecurityGroupId": {"Fn::GetAtt": ["W", "GroupId"]}}}`
	// The workers' egress allows all; only ingress is needed.
	peerRule = `,
	  "WtoW": {"Type": "AWS::EC2::SecurityGroupIngress", "Properties": {"IpProtocol": "tcp", "FromPort": 8080, "ToPort": 8080,
	    "GroupId": {"Fn::GetAtt": ["W", "GroupId"]}, "SourceSecurityGroupId": {"Fn::GetAtt": ["W", "GroupId"]}}}`
)

// echo is the callee: it answers each line with "echo: " and the line.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					fmt.Fprintf(c, "echo: %s\n", sc.Text())
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// call sends one line through addr and returns the answer.
func call(addr string) (string, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if _, err := io.WriteString(c, "hello\n"); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

func front(t *testing.T, g *Guard) *Front {
	t.Helper()
	f, err := g.Front("127.0.0.1:0", echo(t), 8080, func() Party { return Party{Workload: netrules.Worker, Name: "w1", Pid: 1} })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func TestFrontJudgesRegisteredCallers(t *testing.T) {
	for _, tc := range []struct {
		name     string
		rules    string
		as       string // this process registered as
		allowed  bool
		missing  []netrules.Direction
		groupsOf [2]string // caller, callee groups named by the denial
	}{
		{"reconciler with the wakeup rules", wakeupRules, netrules.Reconciler, true, nil, [2]string{}},
		{"reconciler without rules", "", netrules.Reconciler, false, []netrules.Direction{netrules.Egress, netrules.Ingress}, [2]string{"R", "W"}},
		{"worker without the peer rule", wakeupRules, netrules.Worker, false, []netrules.Direction{netrules.Ingress}, [2]string{"W", "W"}},
		{"worker with the peer rule", wakeupRules + peerRule, netrules.Worker, true, nil, [2]string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hooked := make(chan Denial, 10)
			g, err := New(template(t, tc.rules), nil, func(d Denial) { hooked <- d })
			if err != nil {
				t.Fatal(err)
			}
			g.Add(os.Getpid(), tc.as, "me")
			f := front(t, g)
			got, err := call(f.Addr())
			if tc.allowed {
				if err != nil || got != "echo: hello" {
					t.Fatalf("call: %q, %v; want the echo", got, err)
				}
				if n := g.Denied(); n != 0 {
					t.Fatalf("%d denials: %v", n, g.Denials())
				}
				return
			}
			if !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("call: %q, %v; want a reset", got, err)
			}
			ds := g.Denials()
			if len(ds) != 1 || len(hooked) != 1 {
				t.Fatalf("denials %v, %d hooked; want one each", ds, len(hooked))
			}
			d := ds[0]
			if d.Caller.Workload != tc.as || d.Caller.Pid != os.Getpid() || d.Callee.Name != "w1" || d.Port != 8080 {
				t.Errorf("denial %v: wrong parties or port", d)
			}
			if fmt.Sprint(d.Decision.Missing) != fmt.Sprint(tc.missing) ||
				d.Decision.CallerGroup != tc.groupsOf[0] || d.Decision.CalleeGroup != tc.groupsOf[1] {
				t.Errorf("denial %v: missing %v between %s and %s, want %v between %v", d, d.Decision.Missing,
					d.Decision.CallerGroup, d.Decision.CalleeGroup, tc.missing, tc.groupsOf)
			}
		})
	}
}

func TestFrontPassesCallersOutsideTheFleet(t *testing.T) {
	g, err := New(template(t, ""), nil, nil) // no rule admits anything
	if err != nil {
		t.Fatal(err)
	}
	g.Add(os.Getpid()+1_000_000, netrules.Reconciler, "not this process") // no such pid
	f := front(t, g)
	if got, err := call(f.Addr()); err != nil || got != "echo: hello" {
		t.Fatalf("call: %q, %v; want the echo", got, err)
	}
	if n := g.Denied(); n != 0 {
		t.Fatalf("%d denials", n)
	}
}

// TestFrontJudgesDescendants: a child of a process registered with AddTree is judged
// as its workload (the reconciler runs under the Lambda runtime emulator).
func TestFrontJudgesDescendants(t *testing.T) {
	g, err := New(template(t, ""), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	g.AddTree(os.Getpid(), netrules.Reconciler, "emulator")
	f := front(t, g)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperCall$")
	cmd.Env = append(os.Environ(), "NETGUARD_HELPER_CALL="+f.Addr())
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "connection reset") {
		t.Fatalf("the child's call: %v\n%s\nwant it reset", err, out)
	}
	ds := g.Denials()
	if len(ds) != 1 || ds[0].Caller.Workload != netrules.Reconciler || ds[0].Caller.Pid != cmd.Process.Pid {
		t.Fatalf("denials %v; want one, of the child (pid %d) as the reconciler", ds, cmd.Process.Pid)
	}
}

// TestHelperCall is the child of TestFrontJudgesDescendants.
func TestHelperCall(t *testing.T) {
	addr := os.Getenv("NETGUARD_HELPER_CALL")
	if addr == "" {
		t.Skip("a helper process of TestFrontJudgesDescendants")
	}
	if got, err := call(addr); err != nil {
		t.Fatal(err)
	} else {
		t.Logf("answer %q", got)
	}
}

func TestParseProcAddr(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"0100007F:1F90", "127.0.0.1:8080"},
		{"00000000:0000", "0.0.0.0:0"},
		{"0000000000000000FFFF00000100007F:1F91", "[::ffff:127.0.0.1]:8081"},
		{"00000000000000000000000001000000:0050", "[::1]:80"},
	} {
		got, err := parseProcAddr(tc.in)
		if err != nil || got.String() != tc.want {
			t.Errorf("parseProcAddr(%q) = %v, %v; want %s", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "0100007F", "0100007F:XYZ", "01007F:1F90"} {
		if _, err := parseProcAddr(bad); err == nil {
			t.Errorf("parseProcAddr(%q): no error", bad)
		}
	}
}

func TestSummary(t *testing.T) {
	tm := template(t, wakeupRules)
	peer := tm.Decide("W", "W", 8080)
	wake := tm.Decide("R", "W", 9090)
	w := func(name string) Party { return Party{Workload: netrules.Worker, Name: name, Pid: 1} }
	ds := []Denial{
		{Caller: w("a"), Callee: w("b"), Port: 8080, Decision: peer},
		{Caller: Party{Workload: netrules.Reconciler}, Callee: w("b"), Port: 9090, Decision: wake},
		{Caller: w("b"), Callee: w("c"), Port: 8080, Decision: peer},
	}
	got := Summary(ds)
	if len(got) != 2 || !strings.HasPrefix(got[0], "worker to worker on port 8080, 2 times (first worker a") ||
		!strings.HasPrefix(got[1], "reconciler to worker on port 9090, 1 times") ||
		!strings.Contains(got[0], "no ingress rule of W admits tcp 8080 from W") {
		t.Errorf("Summary:\n%s", strings.Join(got, "\n"))
	}
	if len(Summary(nil)) != 0 {
		t.Error("Summary(nil): want an empty list")
	}
}

// TestSocketLookups: the kernel's socket diagnostics and /proc/net/tcp find the same
// socket, the caller's end of a connection, and neither finds one that is gone.
func TestSocketLookups(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	caller, callee := c.LocalAddr().(*net.TCPAddr).AddrPort(), c.RemoteAddr().(*net.TCPAddr).AddrPort()
	diag, err := diagInode(caller, callee)
	if err != nil {
		t.Fatalf("socket diagnostics: %v", err)
	}
	scan, err := scanInode(caller, callee)
	if err != nil || scan != diag {
		t.Fatalf("/proc/net/tcp: %d, %v; socket diagnostics: %d", scan, err, diag)
	}
	if !holds(os.Getpid(), diag) {
		t.Errorf("this process does not hold socket %d", diag)
	}
	// The other end is another socket.
	if other, err := diagInode(callee, caller); err != nil || other == diag {
		t.Errorf("the callee's end: %d, %v", other, err)
	}
	c.Close()
	gone := netip.AddrPortFrom(caller.Addr(), 1) // nobody's port
	if _, err := diagInode(gone, callee); !errors.Is(err, errNoSocket) {
		t.Errorf("socket diagnostics of no socket: %v, want errNoSocket", err)
	}
	if _, err := scanInode(gone, callee); !errors.Is(err, errNoSocket) {
		t.Errorf("/proc/net/tcp of no socket: %v, want errNoSocket", err)
	}
}
