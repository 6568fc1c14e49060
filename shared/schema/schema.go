// Package schema names everything sockfleet stores in its one DynamoDB table: the
// attributes, the key builders, the indexes and the table definition, as plain data.
//
// It imports no AWS SDK, so the CDK app (a module of its own) can build the
// production table from exactly the definition the local bootstrap uses. The item
// codec, which does need the SDK's attribute types, lives in schema/codec.
package schema

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// DefaultTableName is the table name used when none is configured.
const DefaultTableName = "sockfleet"

// Attribute names. Connection items carry the first group, worker items the second.
const (
	AttrPK = "Pk"

	// Written by the operator.
	AttrDesiredState = "desired_state"
	AttrWSURL        = "ws_url"

	// Written by the owning worker, always conditioned on owner and version.
	AttrLeaseOwner   = "lease_owner"
	AttrLeaseExpires = "lease_expires_at_ms" // epoch ms; 0 means released
	AttrLeaseVersion = "lease_version"       // fencing token, +1 on every acquisition
	AttrLastSeq      = "last_seq"            // resume point: last sequence the sink acknowledged
	AttrStatus       = "status"              // observed status, folded into writes that happen anyway
	AttrStatusError  = "status_error"
	AttrStatusAt     = "status_at_ms"

	// Written by the backstop sweep to make the stream carry an unowned item again.
	AttrNudgedAt = "nudged_at_ms"

	// Written by the reconciler (the sweep, the dead-member pass) on an item whose
	// lease it would release or nudge but whose holder it cannot know: a stale image
	// written back over a live holder's lease looks like any other. It acts only once
	// the mark is older than the sweep's NudgeAfter, by which time a holder has taken
	// the lease back (and an acquire or a reclaim removes the mark).
	AttrUnheldSince = "unheld_since_ms"

	// Written by the old owner in the one conditional write that hands a connection to
	// another worker (a planned move: drain, rebalance, deploy). A rebalance round does
	// not move the connection again within its cooling period.
	AttrMovedAt = "moved_at_ms"

	// Written by the lease store when it repairs an operator's edit of a lease field
	// or a checkpoint (what it found, what it did, when). Nothing else writes it, so a
	// console user still sees it after later status changes.
	AttrLastRepair = "last_repair"

	// Worker registry items.
	AttrAddr             = "addr"
	AttrCapacity         = "capacity"
	AttrLoad             = "load"
	AttrDraining         = "draining"
	AttrHeartbeatExpires = "heartbeat_expires_at_ms"
	AttrTTL              = "ttl"      // epoch seconds; DynamoDB TTL deletes dead workers' items
	AttrRegistry         = "registry" // sparse index key, set only on worker items
	// Membership (stream mode): the worker item is the worker's membership lease.
	AttrIncarnation = "incarnation"         // new per process start; renews are conditioned on it
	AttrDeadAt      = "declared_dead_at_ms" // set by the reconciler when it declares the member dead
)

// LeaseHeldByMember is the lease_expires_at_ms of a connection acquired in stream
// mode: the lease lasts as long as its owner's membership (see docs/MEMBERSHIP.md),
// so it has no expiry of its own and is never renewed. 2^53−1, exact in JSON.
const LeaseHeldByMember int64 = 1<<53 - 1

// MaxMemberLeaseSeconds bounds a worker's membership lease (stream mode). The
// reconciler's tombstone for an owner with no registry item lasts this long, so a
// worker still streaming without its item has fenced before its connections move.
const MaxMemberLeaseSeconds = 30

// RegistryKey is the constant value of AttrRegistry on every worker item, so one
// Query on IndexRegistry lists the whole registry without scanning connections.
const RegistryKey = "workers"

// Index names.
const (
	// IndexLeaseOwner finds a dead worker's connections. KEYS_ONLY, and keyed on an
	// attribute heartbeats never change, so heartbeats never write to it.
	IndexLeaseOwner = "lease_owner-index"
	// IndexRegistry is a sparse index over worker items only (keyed on AttrRegistry).
	// KEYS_ONLY, and keyed on an attribute a renew never changes, so a membership
	// renew writes only the item (1 write unit), never the index; readers fetch the
	// items it lists with BatchGetItem.
	IndexRegistry = "registry-keys-index"
	// LegacyIndexRegistry is the registry index of earlier versions, which projected
	// ALL, so that every renew also wrote the index. A GSI's projection cannot be
	// changed in place, so deployed tables move to IndexRegistry in two deploys (see
	// docs/MEMBERSHIP.md); until the new index is active, readers fall back to this one.
	LegacyIndexRegistry = "registry-index"
)

// Key prefixes.
const (
	ConnPrefix   = "CONN#"
	WorkerPrefix = "WORKER#"
)

// MaxIDLen bounds connection and worker ids; MaxURLLen bounds ws_url.
const (
	MaxIDLen  = 200
	MaxURLLen = 2048
)

// State is a connection's desired state.
type State string

// The only two desired states.
const (
	Started State = "STARTED"
	Stopped State = "STOPPED"
)

// ErrInvalid marks an operator-written value (or a whole item) that cannot be used.
// Callers branch on it with errors.Is; the wrapped message says what is wrong.
var ErrInvalid = errors.New("invalid")

// ConnKey returns the partition key of connection id. Ids are validated at the
// edges (ValidateID), so a key can never be prefixed twice.
func ConnKey(id string) string { return ConnPrefix + id }

// WorkerKey returns the partition key of worker id.
func WorkerKey(id string) string { return WorkerPrefix + id }

// ConnID returns the id inside a connection key, and false for any other key.
func ConnID(pk string) (string, bool) {
	id, ok := strings.CutPrefix(pk, ConnPrefix)
	return id, ok && id != ""
}

// WorkerID returns the id inside a worker key, and false for any other key.
func WorkerID(pk string) (string, bool) {
	id, ok := strings.CutPrefix(pk, WorkerPrefix)
	return id, ok && id != ""
}

// ValidateID checks a connection or worker id: 1 to MaxIDLen printable ASCII
// characters, without '#'. Refusing '#' is what makes "CONN#CONN#x" impossible: a
// caller that passes a key where an id belongs gets an error, not a phantom item.
func ValidateID(id string) error {
	if id == "" {
		return fmt.Errorf("%w id: empty", ErrInvalid)
	}
	if len(id) > MaxIDLen {
		return fmt.Errorf("%w id: %d bytes, limit %d", ErrInvalid, len(id), MaxIDLen)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if c <= ' ' || c > '~' || c == '#' {
			return fmt.Errorf("%w id %q: only printable ASCII without spaces or '#'", ErrInvalid, id)
		}
	}
	return nil
}

// ParseState accepts exactly STARTED or STOPPED.
func ParseState(s string) (State, error) {
	switch State(s) {
	case Started, Stopped:
		return State(s), nil
	}
	return "", fmt.Errorf("%w %s %q: want %s or %s", ErrInvalid, AttrDesiredState, clip(s), Started, Stopped)
}

// ValidateURL accepts ws:// and wss:// URLs with a host, up to MaxURLLen bytes. A
// {{secret:…}} reference in it is refused, since it would be sent as written (and a
// secret in the host would choose where secrets go). A {{token:PATH}} reference is
// accepted anywhere, the whole endpoint included (token.go): the worker fills it
// before each dial and checks the result, and secrets stay bound to the host dialed.
func ValidateURL(raw string) error {
	if len(raw) > MaxURLLen {
		return fmt.Errorf("%w %s: %d bytes, limit %d", ErrInvalid, AttrWSURL, len(raw), MaxURLLen)
	}
	if strings.Contains(raw, "{{secret:") {
		return fmt.Errorf("%w %s: a {{secret:…}} reference is not substituted in the URL; send the credential in a header or an open message", ErrInvalid, AttrWSURL)
	}
	if err := checkTokenRefs(raw, true); err != nil {
		return fmt.Errorf("%w %s: %v", ErrInvalid, AttrWSURL, err)
	}
	u, err := url.Parse(TemplateURL(raw)) // a {{token:PATH}} is filled before each dial (token.go)
	if err != nil {
		return fmt.Errorf("%w %s %q: %v", ErrInvalid, AttrWSURL, clip(RedactURL(raw)), URLParseError(err))
	}
	if u.Scheme != "ws" && u.Scheme != "wss" {
		return fmt.Errorf("%w %s %q: scheme must be ws or wss", ErrInvalid, AttrWSURL, clip(RedactURL(raw)))
	}
	if u.Hostname() == "" {
		return fmt.Errorf("%w %s %q: no host", ErrInvalid, AttrWSURL, clip(RedactURL(raw)))
	}
	return nil
}

// RedactURL returns raw fit for an error, a status or a log line: a query string,
// a fragment and userinfo are replaced by REDACTED, since upstreams commonly carry
// tokens there. It needs no parseable URL (a rejected URL is the one worth showing).
func RedactURL(raw string) string {
	head, tail := raw, ""
	if i := strings.IndexAny(raw, "?#"); i >= 0 {
		head, tail = raw[:i], raw[i:i+1]+"REDACTED"
	}
	start := 0
	if i := strings.Index(head, "://"); i >= 0 {
		start = i + len("://")
	}
	authority := head[start:]
	if i := strings.IndexByte(authority, '/'); i >= 0 {
		authority = authority[:i]
	}
	if at := strings.LastIndexByte(authority, '@'); at >= 0 {
		head = head[:start] + "REDACTED" + head[start+at:]
	}
	return head + tail
}

// URLParseError returns what url.Parse's error says without the URL it quotes
// (whose query or userinfo may hold a credential).
func URLParseError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// clip shortens a value quoted in an error, so a huge bad value makes a short message.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
