// Package codec turns connection and worker items into Go values and back.
//
// Decoding never panics and never trusts its input: items are partly written by
// operators in the DynamoDB console. A decode error wraps schema.ErrInvalid and names
// the attribute and its value; the returned value still carries whatever was readable
// (at least the id; an unknown desired_state as written, which is never STARTED), so
// callers can log it or show it, but must not act on it.
package codec

import (
	"fmt"
	"strconv"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/schema"
)

// Item is a DynamoDB item.
type Item = map[string]types.AttributeValue

// Connection is a connection item.
type Connection struct {
	ID           string
	DesiredState schema.State
	WSURL        string

	LeaseOwner       string
	LeaseExpiresAtMs int64 // 0: released or never owned
	LeaseVersion     int64
	LastSeq          int64

	Status      string
	StatusError string
	StatusAtMs  int64
	NudgedAtMs  int64
	MovedAtMs   int64 // last planned handoff; 0 if never

	// Spec is the operator's per-connection settings (the zero Spec: fleet defaults).
	// SpecErr is why they are unusable, if they are; it is also DecodeConnection's
	// error, kept here so a caller that reads a connection it owns (a renew) can stop
	// it with the reason.
	Spec    schema.Spec
	SpecErr error
	Epoch   int64 // sequence epoch, written by the owner on each accepted reset

	// fieldErr: nudged_at_ms or seq_epoch does not decode. No write repairs them (an
	// acquire writes neither), so an item with one is unrunnable until fixed.
	fieldErr error
}

// Owned reports whether the item names an owner with an unreleased lease. It says
// nothing about expiry: that needs a clock (see Expired).
func (c Connection) Owned() bool { return c.LeaseOwner != "" && c.LeaseExpiresAtMs != 0 }

// Expired reports whether an owned lease expired more than margin before nowMs.
func (c Connection) Expired(nowMs, marginMs int64) bool {
	return c.Owned() && c.LeaseExpiresAtMs < nowMs-marginMs
}

// Unrunnable says what an operator made unusable in a connection that is not STOPPED:
// an unknown desired_state (a lowercase "started"), an unusable ws_url, an unusable
// per-connection spec, or a field no write repairs (nudged_at_ms, seq_epoch) that
// does not decode, naming the field and why. It is nil for a STOPPED item (nothing
// runs it) and for an item whose only bad fields are ones the lease store repairs
// (lease_version, last_seq) or an acquire overwrites (the lease and status fields).
func (c Connection) Unrunnable() error {
	if c.DesiredState == schema.Stopped {
		return nil
	}
	if _, err := schema.ParseState(string(c.DesiredState)); err != nil {
		return err
	}
	if err := schema.ValidateURL(c.WSURL); err != nil {
		return err
	}
	if c.SpecErr != nil {
		return c.SpecErr
	}
	return c.fieldErr
}

// Worker is a worker registry item.
type Worker struct {
	ID                   string
	Addr                 string // host:port of the wakeup endpoint
	Capacity             int
	Load                 int
	Draining             bool
	HeartbeatExpiresAtMs int64
	TTL                  int64 // epoch seconds
	// Incarnation is new per process start (stream mode); empty on a tombstone and on
	// polling-mode items.
	Incarnation string
	DeadAtMs    int64 // when the reconciler declared the member dead; 0: not declared
}

// Dead reports whether the member was declared dead.
func (w Worker) Dead() bool { return w.DeadAtMs != 0 }

// Live reports whether the worker's heartbeat has not lapsed at nowMs.
func (w Worker) Live(nowMs int64) bool { return !w.Dead() && w.HeartbeatExpiresAtMs > nowMs }

// Spare is how many more connections the worker will take.
func (w Worker) Spare() int { return max(0, w.Capacity-w.Load) }

// EncodeConnection returns the full item for c. lease_expires_at_ms is always written
// (0: released or never owned), so a new connection is visible to the seed's index
// in polling mode too; other zero lease fields are left out.
func EncodeConnection(c Connection) Item {
	it := Item{
		schema.AttrPK:           S(schema.ConnKey(c.ID)),
		schema.AttrDesiredState: S(string(c.DesiredState)),
		schema.AttrWSURL:        S(c.WSURL),
	}
	putS(it, schema.AttrLeaseOwner, c.LeaseOwner)
	it[schema.AttrLeaseExpires] = N(c.LeaseExpiresAtMs)
	putN(it, schema.AttrLeaseVersion, c.LeaseVersion)
	putN(it, schema.AttrLastSeq, c.LastSeq)
	putS(it, schema.AttrStatus, c.Status)
	putS(it, schema.AttrStatusError, c.StatusError)
	putN(it, schema.AttrStatusAt, c.StatusAtMs)
	putN(it, schema.AttrNudgedAt, c.NudgedAtMs)
	putN(it, schema.AttrMovedAt, c.MovedAtMs)
	putN(it, schema.AttrEpoch, c.Epoch)
	EncodeSpec(it, c.Spec)
	return it
}

// DecodeConnection reads a connection item and validates the operator's fields.
func DecodeConnection(it Item) (Connection, error) {
	var c Connection
	pk, err := str(it, schema.AttrPK, true)
	if err != nil {
		return c, err
	}
	id, ok := schema.ConnID(pk)
	if !ok {
		return c, fmt.Errorf("%w %s %q: not a connection key", schema.ErrInvalid, schema.AttrPK, pk)
	}
	c.ID = id
	if err := schema.ValidateID(id); err != nil {
		return c, err
	}
	d := decoder{it: it}
	c.LeaseOwner = d.str(schema.AttrLeaseOwner)
	c.LeaseExpiresAtMs = d.num(schema.AttrLeaseExpires)
	c.LeaseVersion = d.num(schema.AttrLeaseVersion)
	c.LastSeq = d.num(schema.AttrLastSeq)
	c.Status = d.str(schema.AttrStatus)
	c.StatusError = d.str(schema.AttrStatusError)
	c.StatusAtMs = d.num(schema.AttrStatusAt)
	c.NudgedAtMs = c.unrepaired(&d, schema.AttrNudgedAt)
	c.MovedAtMs, _ = num(it, schema.AttrMovedAt) // advisory (cooling only): a bad value reads as never moved
	c.Epoch = c.unrepaired(&d, schema.AttrEpoch)
	state, err := str(it, schema.AttrDesiredState, true)
	if err == nil {
		c.DesiredState, err = schema.ParseState(state)
		if err != nil {
			c.DesiredState = schema.State(state) // kept as written, so it can be shown; never Started
		}
	}
	d.keep(err)
	rawURL, err := str(it, schema.AttrWSURL, true)
	if err == nil {
		c.WSURL = rawURL
		err = schema.ValidateURL(rawURL)
	}
	d.keep(err)
	c.Spec, c.SpecErr = DecodeSpec(it)
	if c.SpecErr == nil && c.Spec.TokenRequest == nil && len(schema.TokenRefs(c.WSURL)) > 0 {
		c.SpecErr = fmt.Errorf("%w %s: {{token:…}} without a %s", schema.ErrInvalid, schema.AttrWSURL, schema.AttrTokenRequest)
	}
	d.keep(c.SpecErr)
	if d.err != nil {
		return c, fmt.Errorf("connection %s: %w", id, d.err)
	}
	return c, nil
}

// EncodeWorker returns the full item for w.
func EncodeWorker(w Worker) Item {
	it := Item{
		schema.AttrPK:               S(schema.WorkerKey(w.ID)),
		schema.AttrRegistry:         S(schema.RegistryKey),
		schema.AttrAddr:             S(w.Addr),
		schema.AttrCapacity:         N(int64(w.Capacity)),
		schema.AttrLoad:             N(int64(w.Load)),
		schema.AttrDraining:         &types.AttributeValueMemberBOOL{Value: w.Draining},
		schema.AttrHeartbeatExpires: N(w.HeartbeatExpiresAtMs),
		schema.AttrTTL:              N(w.TTL),
	}
	putS(it, schema.AttrIncarnation, w.Incarnation)
	putN(it, schema.AttrDeadAt, w.DeadAtMs)
	return it
}

// DecodeWorker reads a worker registry item.
func DecodeWorker(it Item) (Worker, error) {
	var w Worker
	pk, err := str(it, schema.AttrPK, true)
	if err != nil {
		return w, err
	}
	id, ok := schema.WorkerID(pk)
	if !ok {
		return w, fmt.Errorf("%w %s %q: not a worker key", schema.ErrInvalid, schema.AttrPK, pk)
	}
	w.ID = id
	d := decoder{it: it}
	w.Addr = d.str(schema.AttrAddr)
	w.Capacity = int(d.num(schema.AttrCapacity))
	w.Load = int(d.num(schema.AttrLoad))
	w.HeartbeatExpiresAtMs = d.num(schema.AttrHeartbeatExpires)
	w.TTL = d.num(schema.AttrTTL)
	w.Incarnation = d.str(schema.AttrIncarnation)
	w.DeadAtMs = d.num(schema.AttrDeadAt)
	if v, ok := it[schema.AttrDraining]; ok {
		b, isBool := v.(*types.AttributeValueMemberBOOL)
		if !isBool {
			d.keep(typeErr(schema.AttrDraining, "BOOL", v))
		} else {
			w.Draining = b.Value
		}
	}
	if w.Addr == "" && !w.Dead() { // a tombstone (see registry.Tombstone) has no address
		d.keep(fmt.Errorf("%w %s: missing", schema.ErrInvalid, schema.AttrAddr))
	}
	if w.Capacity < 0 || w.Load < 0 {
		d.keep(fmt.Errorf("%w %s/%s: negative", schema.ErrInvalid, schema.AttrCapacity, schema.AttrLoad))
	}
	if d.err != nil {
		return w, fmt.Errorf("worker %s: %w", id, d.err)
	}
	return w, nil
}

// S is a string attribute value.
func S(s string) types.AttributeValue { return &types.AttributeValueMemberS{Value: s} }

// N is a number attribute value.
func N(n int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(n, 10)}
}

func putS(it Item, name, v string) {
	if v != "" {
		it[name] = S(v)
	}
}

func putN(it Item, name string, v int64) {
	if v != 0 {
		it[name] = N(v)
	}
}

// decoder reads optional attributes and keeps the first error.
type decoder struct {
	it  Item
	err error
}

func (d *decoder) keep(err error) {
	if d.err == nil && err != nil {
		d.err = err
	}
}

func (d *decoder) str(name string) string {
	s, err := str(d.it, name, false)
	d.keep(err)
	return s
}

// unrepaired reads a number no write repairs, keeping its error as Unrunnable's too.
func (c *Connection) unrepaired(d *decoder, name string) int64 {
	n, err := num(d.it, name)
	d.keep(err)
	if c.fieldErr == nil {
		c.fieldErr = err
	}
	return n
}

func (d *decoder) num(name string) int64 {
	n, err := num(d.it, name)
	d.keep(err)
	return n
}

func str(it Item, name string, required bool) (string, error) {
	v, ok := it[name]
	if !ok || isNull(v) {
		if required {
			return "", fmt.Errorf("%w %s: missing", schema.ErrInvalid, name)
		}
		return "", nil
	}
	s, ok := v.(*types.AttributeValueMemberS)
	if !ok {
		return "", typeErr(name, "S", v)
	}
	return s.Value, nil
}

// num reads an optional integer attribute; absent means 0.
func num(it Item, name string) (int64, error) {
	v, ok := it[name]
	if !ok || isNull(v) {
		return 0, nil
	}
	n, ok := v.(*types.AttributeValueMemberN)
	if !ok {
		return 0, typeErr(name, "N", v)
	}
	i, err := strconv.ParseInt(n.Value, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w %s %q: not an integer", schema.ErrInvalid, name, n.Value)
	}
	return i, nil
}

func isNull(v types.AttributeValue) bool {
	_, ok := v.(*types.AttributeValueMemberNULL)
	return ok || v == nil
}

func typeErr(name, want string, v types.AttributeValue) error {
	return fmt.Errorf("%w %s: type %s, want %s (value %s)", schema.ErrInvalid, name, typeName(v), want, Describe(v))
}

func typeName(v types.AttributeValue) string {
	switch v.(type) {
	case *types.AttributeValueMemberS:
		return "S"
	case *types.AttributeValueMemberN:
		return "N"
	case *types.AttributeValueMemberB:
		return "B"
	case *types.AttributeValueMemberBOOL:
		return "BOOL"
	case *types.AttributeValueMemberL:
		return "L"
	case *types.AttributeValueMemberM:
		return "M"
	case *types.AttributeValueMemberSS:
		return "SS"
	case *types.AttributeValueMemberNS:
		return "NS"
	case *types.AttributeValueMemberBS:
		return "BS"
	}
	return fmt.Sprintf("%T", v)
}

// Int reads an optional integer attribute of it (absent or NULL: 0). The error wraps
// schema.ErrInvalid and names the attribute and its value.
func Int(it Item, name string) (int64, error) { return num(it, name) }

// Describe renders an attribute value for a message a person reads, with its type:
// `S "abc"`, `N 1.5`, `BOOL true`. Long values are clipped; nil is "absent".
func Describe(v types.AttributeValue) string {
	const limit = 64
	clip := func(s string) string {
		if len(s) > limit {
			return s[:limit] + "…"
		}
		return s
	}
	switch v := v.(type) {
	case nil:
		return "absent"
	case *types.AttributeValueMemberS:
		return "S " + strconv.Quote(clip(v.Value))
	case *types.AttributeValueMemberN:
		return "N " + clip(v.Value)
	case *types.AttributeValueMemberBOOL:
		return "BOOL " + strconv.FormatBool(v.Value)
	case *types.AttributeValueMemberNULL:
		return "NULL"
	}
	return typeName(v)
}
