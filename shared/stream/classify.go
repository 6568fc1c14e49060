// Package stream decides what a change to the table asks of the fleet, and wakes the
// workers that must act.
//
// Classify compares a stream record's old and new images:
//
//   - Needs an owner: a STARTED INSERT; STOPPED → STARTED; a lease released, or its
//     owner removed, while STARTED; an unowned STARTED item the sweep nudged (its
//     nudged_at_ms changed); a STARTED item whose previous image was unusable.
//   - Owner must act: STARTED → STOPPED while owned; REMOVE while owned; ws_url
//     changed while owned by the same owner at the same version.
//   - Ignore: heartbeats, checkpoints, acquisitions, worker items, and the rest.
//
// Deliver sends the resulting wakeups. Guarantees: one round never offers an id to two
// workers; an owner-must-act wakeup goes to the current owner only; ids a worker
// refused or could not take (full, draining, failed, unreachable) are offered to the
// next worker. Non-guarantees: a wakeup is a hint; whether a worker acquires is decided
// by the conditional write it makes, so a delivered wakeup may still end in LostRace.
package stream

import (
	"fmt"

	"github.com/aws/aws-lambda-go/events"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

// Action is what a record asks for.
type Action int

// Actions.
const (
	Ignore Action = iota
	NeedsOwner
	OwnerMustAct
)

func (a Action) String() string {
	switch a {
	case NeedsOwner:
		return "needs_owner"
	case OwnerMustAct:
		return "owner_must_act"
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
)

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
			return Decision{ID: id}, fmt.Errorf("record %s (%s) new image: %w", r.EventID, pk, curErr)
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

func changed(id string, old, cur *codec.Connection) Decision {
	d := Decision{ID: id, LeaseVersion: cur.LeaseVersion}
	switch cur.DesiredState {
	case schema.Started:
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
