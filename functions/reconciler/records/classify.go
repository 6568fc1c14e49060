// Package records decides what a change to the table asks of the fleet: one stream
// record in, one Decision out. Package dispatch turns decisions into wakeups.
//
// Classify compares a stream record's old and new images:
//
//   - Needs an owner: a STARTED INSERT; STOPPED → STARTED; a lease released, or its
//     owner removed, while STARTED; an unowned STARTED item the sweep nudged (its
//     nudged_at_ms changed); a STARTED item whose previous image was unusable.
//   - Owner must act: STARTED → STOPPED while owned; REMOVE while owned; ws_url
//     changed while owned by the same owner at the same version; an owned item an
//     operator made unusable (the owner stops it and says why on the item).
//   - Stale image: an ownership no acquire made. Acquires only raise lease_version
//     and versions never repeat, so a record whose version fell, or whose owner
//     changed without a higher version, is an outside write of an old image (a
//     console save). The displaced holder is asked to check (OwnerMustAct, WhyStale):
//     its lease store takes the lease back if the stale lease is free, else it stops.
//     If it no longer holds it, the handler repairs the item (Decision.Image): it
//     releases the stale lease, or, for a stale image already unowned, finds an owner.
//   - Named owner, no proof it runs the lease: an INSERT naming an owner with an
//     unreleased lease (no acquire inserts), and a STARTED item naming an owner whose
//     expiry was deleted or zeroed (a release removes the owner too). The named
//     owner is asked to check (OwnerMustAct, WhyNamedOwner or WhyExpiryDamaged): one
//     that holds the lease answers after its owner write (which restores the expiry);
//     if it does not, the handler releases the lease and finds an owner, as for a
//     stale image.
//   - Report invalid: an unowned item an operator made unusable whose status_error
//     does not say so yet; the handler writes status "invalid" and the problem, naming
//     the field and the value, on the item (a console user sees it there).
//   - Ignore: heartbeats, checkpoints, acquisitions, worker items, and the rest.
package records

import (
	"fmt"

	"github.com/aws/aws-lambda-go/events"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"go.opentelemetry.io/otel/trace"
)

// Action is what a record asks for.
type Action int

// Actions.
const (
	Ignore Action = iota
	NeedsOwner
	OwnerMustAct
	ReportInvalid
)

func (a Action) String() string {
	switch a {
	case NeedsOwner:
		return "needs_owner"
	case OwnerMustAct:
		return "owner_must_act"
	case ReportInvalid:
		return "report_invalid"
	}
	return "ignore"
}

// Decision is the classification of one record.
type Decision struct {
	Action Action
	ID     string // connection id; empty for other items
	// Owner is the worker to wake for OwnerMustAct.
	Owner string
	// LeaseVersion is the version the record shows: the owner's for OwnerMustAct, the
	// item's current one for NeedsOwner. Workers ignore wakeups older than what they hold.
	LeaseVersion int64
	// Why names the transition, for logs and tests.
	Why string
	// Problem, for ReportInvalid and WhyInvalid, says what is unusable, naming the
	// field and the value.
	Problem string
	// Image, for WhyStale, is the lease the stale image left: its owner ("" if none)
	// and version. LeaseVersion is then the displaced holder's.
	Image Image
	// Span is the reconcile.record span of the decision (set by the handler, not
	// Classify; nil: none): the wakeup it asks for joins its trace. A pointer keeps
	// Decision comparable.
	Span *trace.SpanContext
}

// Image is the lease fields of a stale image.
type Image struct {
	Owner   string
	Version int64
}

// Transition names (Decision.Why).
const (
	WhyInserted     = "inserted"
	WhyRestarted    = "restarted"
	WhyReleased     = "released"
	WhyOwnerRemoved = "owner removed"
	WhyNudged       = "nudged"
	WhyRepaired     = "repaired"
	WhyStopped      = "stopped"
	WhyDeleted      = "deleted"
	WhyURLChanged   = "url changed"
	WhyInvalid      = "invalid"
	WhyStale        = "stale image"
	// WhyNamedOwner: an item inserted naming an owner with an unreleased lease (a
	// console "Create item" or "Duplicate item", a delete then recreate). No acquire
	// inserts, so the named owner may run no session for it.
	WhyNamedOwner = "inserted naming an owner"
	// WhyExpiryDamaged: a STARTED item names an owner but its expiry was deleted or
	// zeroed by hand (a release removes the owner too).
	WhyExpiryDamaged = "lease expiry damaged"
)

// AsksHolder reports whether d asks a named owner whether it still runs the lease
// d.Image shows; if it answers that it does not, or is not a live member, the
// reconciler releases that lease itself (conditioned on exactly that owner and
// version) and finds an owner.
func (d Decision) AsksHolder() bool {
	return d.Why == WhyStale || d.Why == WhyNamedOwner || d.Why == WhyExpiryDamaged
}

// Key returns the partition key of a record, or "" if it has none usable.
func Key(r events.DynamoDBEventRecord) string {
	k, ok := r.Change.Keys[schema.AttrPK]
	if !ok || k.DataType() != events.DataTypeString {
		return ""
	}
	return k.String()
}

// Classify decides what r asks for. An error means an image could not be used: the
// caller logs it with the key and skips the record; the returned Decision is then
// Ignore. Items that are not connections are ignored without error.
func Classify(r events.DynamoDBEventRecord) (Decision, error) {
	pk := Key(r)
	if pk == "" {
		return Decision{}, fmt.Errorf("%w record %s: no string %s key", schema.ErrInvalid, r.EventID, schema.AttrPK)
	}
	id, ok := schema.ConnID(pk)
	if !ok {
		return Decision{}, nil // a worker item or anything else: nothing to do yet
	}
	old, oldErr := image(r.Change.OldImage)
	cur, curErr := image(r.Change.NewImage)
	switch r.EventName {
	case "REMOVE":
		return removed(id, old, oldErr)
	case "INSERT", "MODIFY":
		if cur == nil {
			return Decision{ID: id}, fmt.Errorf("%w record %s (%s): %s without a new image", schema.ErrInvalid, r.EventID, pk, r.EventName)
		}
		if curErr != nil {
			if cur.ID == "" || schema.ValidateID(cur.ID) != nil {
				return Decision{ID: id}, fmt.Errorf("record %s (%s) new image: %w", r.EventID, pk, curErr)
			}
			if p := cur.Unrunnable(); p != nil {
				return invalid(id, cur, p), nil
			}
			// Only fields the lease store repairs (lease_version, last_seq, status) or a
			// STOPPED item's: judge the record on what was readable.
		}
		if oldErr != nil {
			old = nil // an unusable old image tells nothing: judge by the new one alone
		}
		d := changed(id, old, cur)
		if oldErr != nil && d.Why == WhyInserted {
			d.Why = WhyRepaired
		}
		return d, nil
	}
	return Decision{ID: id}, fmt.Errorf("%w record %s (%s): event name %q", schema.ErrInvalid, r.EventID, pk, r.EventName)
}

// image decodes a stream image; nil if absent. On a decode error the connection
// returned still carries what was readable (the lease fields among it).
func image(img map[string]events.DynamoDBAttributeValue) (*codec.Connection, error) {
	if img == nil {
		return nil, nil
	}
	it, err := Item(img)
	if err != nil {
		return &codec.Connection{}, err
	}
	c, err := codec.DecodeConnection(it)
	return &c, err
}

func removed(id string, old *codec.Connection, oldErr error) (Decision, error) {
	if old == nil {
		return Decision{ID: id}, nil // no old image (a keys-only stream): nothing to tell
	}
	if owned(*old) {
		return Decision{Action: OwnerMustAct, ID: id, Owner: old.LeaseOwner, LeaseVersion: old.LeaseVersion, Why: WhyDeleted}, nil
	}
	if oldErr != nil {
		return Decision{ID: id}, fmt.Errorf("connection %s old image: %w", id, oldErr)
	}
	return Decision{ID: id}, nil
}

// invalid decides about an item an operator made unusable: its owner must stop it
// (and say why), or, unowned, it must say why on the item, once.
func invalid(id string, cur *codec.Connection, problem error) Decision {
	d := Decision{ID: id, LeaseVersion: cur.LeaseVersion, Problem: problem.Error()}
	switch {
	case owned(*cur):
		d.Action, d.Owner, d.Why = OwnerMustAct, cur.LeaseOwner, WhyInvalid
	case cur.StatusError != d.Problem:
		d.Action, d.Why = ReportInvalid, WhyInvalid
	default:
		d.Problem = "" // said already: this record is the report itself
	}
	return d
}

// stale reports whether cur's lease is one no acquire made from old: the version
// fell, or the owner changed without a higher version.
func stale(old, cur *codec.Connection) bool {
	if old == nil || old.LeaseVersion == 0 {
		return false
	}
	if cur.LeaseVersion < old.LeaseVersion {
		return true
	}
	return cur.LeaseOwner != "" && cur.LeaseOwner != old.LeaseOwner && cur.LeaseVersion <= old.LeaseVersion
}

func changed(id string, old, cur *codec.Connection) Decision {
	d := Decision{ID: id, LeaseVersion: cur.LeaseVersion}
	if stale(old, cur) && (owned(*old) || owned(*cur)) {
		// Ask the displaced holder; with none, the stale lease's own owner, who will
		// answer that it does not hold it (an acquire would have raised the version).
		d.Action, d.Owner, d.LeaseVersion, d.Why = OwnerMustAct, old.LeaseOwner, old.LeaseVersion, WhyStale
		if !owned(*old) {
			d.Owner, d.LeaseVersion = cur.LeaseOwner, cur.LeaseVersion
		}
		d.Image = Image{Version: cur.LeaseVersion}
		if owned(*cur) {
			d.Image.Owner = cur.LeaseOwner
		}
		return d
	}
	switch cur.DesiredState {
	case schema.Started:
		named := Image{Owner: cur.LeaseOwner, Version: cur.LeaseVersion}
		switch {
		case old == nil && owned(*cur):
			d.Action, d.Owner, d.Why, d.Image = OwnerMustAct, cur.LeaseOwner, WhyNamedOwner, named
			return d
		case cur.LeaseOwner != "" && !owned(*cur):
			d.Action, d.Owner, d.Why, d.Image = OwnerMustAct, cur.LeaseOwner, WhyExpiryDamaged, named
			return d
		}
		if !owned(*cur) {
			d.Why = needsOwnerWhy(old, cur)
			if d.Why != "" {
				d.Action = NeedsOwner
			}
			return d
		}
		if old != nil && owned(*old) && old.DesiredState == schema.Started &&
			old.LeaseOwner == cur.LeaseOwner && old.LeaseVersion == cur.LeaseVersion && old.WSURL != cur.WSURL {
			d.Action, d.Owner, d.Why = OwnerMustAct, cur.LeaseOwner, WhyURLChanged
		}
	case schema.Stopped:
		if owned(*cur) && (old == nil || old.DesiredState == schema.Started) {
			d.Action, d.Owner, d.Why = OwnerMustAct, cur.LeaseOwner, WhyStopped
		}
	}
	return d
}

// needsOwnerWhy names why an unowned STARTED item needs an owner now, or returns "".
func needsOwnerWhy(old, cur *codec.Connection) string {
	switch {
	case old == nil:
		return WhyInserted // INSERT, or an old image that could not be used
	case old.DesiredState == schema.Stopped:
		return WhyRestarted
	case owned(*old) && cur.LeaseOwner == "" && cur.LeaseExpiresAtMs == 0:
		return WhyReleased
	case owned(*old):
		return WhyOwnerRemoved
	case old.NudgedAtMs != cur.NudgedAtMs:
		return WhyNudged
	}
	return ""
}

// owned: an owner is named and the lease is not released. Expiry is not judged here:
// a stream record carries no trustworthy clock, and expiry is the sweep's business.
func owned(c codec.Connection) bool { return c.LeaseOwner != "" && c.LeaseExpiresAtMs != 0 }
