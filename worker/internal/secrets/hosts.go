package secrets

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/sockfleet/sockfleet/shared/schema"
)

// TagAllowedHosts is the Secrets Manager tag that lists the hosts a secret may be
// sent to. Its owner sets it where the secret lives: writing the table cannot.
const TagAllowedHosts = "sockfleet:allowed-hosts"

// Hosts is the parsed allowance of a secret: the hosts its value may be sent to.
// The zero Hosts allows no host.
type Hosts struct{ pats []hostPattern }

// hostPattern is one allowed host: exact, or with wild every host under suffix
// (never the suffix itself); port "" allows any port.
type hostPattern struct {
	host string // lower case, no trailing dot; for wild, ".example.com"
	wild bool
	port string
}

// ParseHosts parses host patterns: "stream.example.com" (that host), "*.example.com"
// or ".example.com" (any host under example.com, not example.com itself; the second
// form uses only the characters AWS documents as allowed in tag values across
// services, which list neither "*" nor ","), each optionally with ":PORT"
// ("stream.example.com:8443", "[::1]:9000"); without a port any port is allowed.
// Matching is case-insensitive. Empty entries are skipped; a malformed one is an error.
func ParseHosts(list []string) (Hosts, error) {
	var h Hosts
	for _, raw := range list {
		p := strings.TrimSpace(raw)
		if p == "" {
			continue
		}
		pat, err := parsePattern(p)
		if err != nil {
			return Hosts{}, fmt.Errorf("allowed host %q: %w", clip(p), err)
		}
		h.pats = append(h.pats, pat)
	}
	return h, nil
}

// splitTag splits the value of a TagAllowedHosts tag: patterns separated by spaces
// (AWS's generally allowed tag characters) or commas.
func splitTag(v string) []string {
	return strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' })
}

// Empty reports whether h allows no host.
func (h Hosts) Empty() bool { return len(h.pats) == 0 }

// Allows reports whether h allows dest, a dial target "host:port".
func (h Hosts) Allows(dest string) bool {
	host, port, err := net.SplitHostPort(dest)
	if err != nil || port == "" {
		return false // not a dial target: nothing is allowed
	}
	host = normHost(host)
	if host == "" {
		return false
	}
	for _, p := range h.pats {
		if p.port != "" && p.port != port {
			continue
		}
		if p.wild && len(host) > len(p.host) && strings.HasSuffix(host, p.host) {
			return true
		}
		if !p.wild && host == p.host {
			return true
		}
	}
	return false
}

func parsePattern(p string) (hostPattern, error) {
	host, port := p, ""
	switch {
	case strings.HasPrefix(p, "["):
		end := strings.IndexByte(p, ']')
		if end < 0 {
			return hostPattern{}, fmt.Errorf("unclosed [")
		}
		host, port = p[1:end], p[end+1:]
		if port != "" {
			if !strings.HasPrefix(port, ":") {
				return hostPattern{}, fmt.Errorf("want [IPv6] or [IPv6]:PORT")
			}
			port = port[1:]
			if port == "" {
				return hostPattern{}, fmt.Errorf("empty port")
			}
		}
	case strings.Count(p, ":") == 1:
		host, port, _ = strings.Cut(p, ":")
		if port == "" {
			return hostPattern{}, fmt.Errorf("empty port")
		}
	}
	if port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != port {
			return hostPattern{}, fmt.Errorf("port %q: want 1 to 65535", port)
		}
	}
	pat := hostPattern{port: port}
	if rest, ok := strings.CutPrefix(host, "*."); ok {
		pat.wild, host = true, rest
	} else if rest, ok := strings.CutPrefix(host, "."); ok {
		pat.wild, host = true, rest // ".example.com": the same, in tag-safe characters
	}
	host = normHost(host)
	switch {
	case host == "":
		return hostPattern{}, fmt.Errorf("no host")
	case strings.ContainsAny(host, "*/@?#%[] \\"):
		return hostPattern{}, fmt.Errorf("want HOST, *.DOMAIN or .DOMAIN, each with an optional :PORT")
	case pat.wild && !strings.Contains(host, ".") && net.ParseIP(host) == nil:
		// "*.com" would hand the secret to any host under a top-level domain.
		return hostPattern{}, fmt.Errorf("a wildcard needs a domain of at least two labels")
	}
	if pat.wild {
		host = "." + host
	}
	pat.host = host
	return pat, nil
}

// normHost lower-cases a host name and drops a trailing root dot, so
// "Stream.Example.com." and "stream.example.com" are one host.
func normHost(h string) string {
	return strings.TrimSuffix(strings.ToLower(h), ".")
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// NotAllowedError refuses a secret reference whose destination the secret's owner
// did not allow. It names the secret and the destination, never the value, and
// wraps schema.ErrInvalid: the connection is unusable as written, and the stream
// says so in its status instead of dialing.
type NotAllowedError struct {
	Name string // the secret
	Dest string // the dial target, host:port
	Why  string // "names no allowed hosts", "is not among its allowed hosts", or a malformed allowance
}

func (e *NotAllowedError) Error() string {
	return fmt.Sprintf("secret %s may not be sent to %s: %s", e.Name, e.Dest, e.Why)
}

// Unwrap makes errors.Is(err, schema.ErrInvalid) hold.
func (e *NotAllowedError) Unwrap() error { return schema.ErrInvalid }
