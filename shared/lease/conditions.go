package lease

import (
	"maps"
	"slices"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

// The conditions every lease write is made of. They are expression builders, not
// text: a request's expression, names and values are produced together from them
// (see dynamo.go), so a condition can be shared with other packages and cannot
// drift from the maps that go with it.

// Attribute names as expression operands.
var (
	namePK          = name(schema.AttrPK)
	nameState       = name(schema.AttrDesiredState)
	nameOwner       = name(schema.AttrLeaseOwner)
	nameExpires     = name(schema.AttrLeaseExpires)
	nameVersion     = name(schema.AttrLeaseVersion)
	nameStatusError = name(schema.AttrStatusError)
	nameUnheld      = name(schema.AttrUnheldSince)
)

func name(attr string) expression.NameBuilder { return expression.NameNoDotSplit(attr) }

func num(n int64) expression.ValueBuilder { return expression.Value(codec.N(n)) }

func str(s string) expression.ValueBuilder { return expression.Value(codec.S(s)) }

// FreeCondition is the condition that a lease is free to take at staleMs (the
// taker's clock less the skew margin, in epoch ms): it names no owner and has no
// expiry or is released (expiry 0), or its expiry passed before staleMs. A membership
// lease (schema.LeaseHeldByMember) never expires, so it is free only once released.
// A lease with one of its two fields missing is not free: a release writes both (no
// owner, expiry 0), so an owner with no expiry or an expiry with no owner is an
// operator's edit of a lease someone may still hold, and only that holder or the
// reconciler, after asking it, puts it right (see the package doc). Acquire writes
// under it; a query for candidates may filter with it, but only Acquire's write
// decides.
func FreeCondition(staleMs int64) expression.ConditionBuilder {
	return expression.Or(
		expression.And(nameOwner.AttributeNotExists(), expression.Or(nameExpires.AttributeNotExists(), nameExpires.Equal(num(0)))),
		expression.And(nameExpires.NotEqual(num(0)), nameExpires.LessThan(num(staleMs))))
}

// ReleasedCondition is the condition that the item names no owner, has no expiry, or
// is released (expiry 0). It needs no clock: writes that must never race a live
// owner's checkpoint, however late, use it (a report on an unusable item, the
// sweep's nudge). It is wider than FreeCondition: a lease with one field missing
// matches it, so the sweep's nudge brings such an item to the reconciler.
func ReleasedCondition() expression.ConditionBuilder {
	return expression.Or(nameOwner.AttributeNotExists(), nameExpires.AttributeNotExists(),
		nameExpires.Equal(num(0)))
}

// free is FreeCondition evaluated on a raw item (DynamoDB compares a number with a
// string as false, so an unusable expiry is not free).
func free(raw codec.Item, staleMs int64) bool {
	ownerless := raw[schema.AttrLeaseOwner] == nil
	if raw[schema.AttrLeaseExpires] == nil {
		return ownerless
	}
	e, err := codec.Int(raw, schema.AttrLeaseExpires)
	return err == nil && ((ownerless && e == 0) || (e != 0 && e < staleMs))
}

// unheldSince: the item carries the reconciler's mark (unheld_since_ms), written at
// sinceMs or earlier (a mark of another type compares as false).
func unheldSince(sinceMs int64) expression.ConditionBuilder {
	return expression.And(nameUnheld.GreaterThan(num(0)), nameUnheld.LessThanEqual(num(sinceMs)))
}

// markedSince is unheldSince evaluated on a raw item.
func markedSince(raw codec.Item, sinceMs int64) bool {
	m, err := codec.Int(raw, schema.AttrUnheldSince)
	return raw[schema.AttrUnheldSince] != nil && err == nil && m > 0 && m <= sinceMs
}

// startedCondition: the item exists and its desired_state is STARTED.
func startedCondition() expression.ConditionBuilder {
	return expression.And(namePK.AttributeExists(), nameState.Equal(str(string(schema.Started))))
}

// ownerCondition is the condition of every owner write: the item exists, and l's
// owner holds it at l's version.
func ownerCondition(l Lease) expression.ConditionBuilder {
	return heldBy(l.Owner, nameVersion.Equal(num(l.Version)))
}

// heldBy: the item exists, owner holds it, and version (a condition on the
// lease_version) holds.
func heldBy(owner string, version expression.ConditionBuilder) expression.ConditionBuilder {
	return expression.And(namePK.AttributeExists(), nameOwner.Equal(str(owner)), version)
}

// expiredBefore: the lease is unreleased and expired before staleMs (the sweep's
// release).
func expiredBefore(staleMs int64) expression.ConditionBuilder {
	return expression.And(nameExpires.GreaterThan(num(0)), nameExpires.LessThan(num(staleMs)))
}

// valueIs is the condition that attribute n is exactly v as read: absent, the same
// number or string, or, for any other type, still neither a number nor a string.
func valueIs(n expression.NameBuilder, v types.AttributeValue) expression.ConditionBuilder {
	switch v.(type) {
	case nil:
		return n.AttributeNotExists()
	case *types.AttributeValueMemberN, *types.AttributeValueMemberS:
		return n.Equal(expression.Value(v))
	}
	return expression.And(n.AttributeExists(), expression.Not(n.AttributeType(expression.Number)),
		expression.Not(n.AttributeType(expression.String)))
}

// all is the conjunction of the conditions that are set (the zero ConditionBuilder
// is not).
func all(cs ...expression.ConditionBuilder) expression.ConditionBuilder {
	var set []expression.ConditionBuilder
	for _, c := range cs {
		if c.IsSet() {
			set = append(set, c)
		}
	}
	switch len(set) {
	case 0:
		return expression.ConditionBuilder{}
	case 1:
		return set[0]
	}
	return expression.And(set[0], set[1], set[2:]...)
}

// setAll is the update that sets each attribute of set to its value, in name order
// (so the expression text is the same for the same writes).
func setAll(set codec.Item) expression.UpdateBuilder {
	var u expression.UpdateBuilder
	for _, k := range slices.Sorted(maps.Keys(set)) {
		u = u.Set(name(k), expression.Value(set[k]))
	}
	return u
}
