package lease

import (
	"fmt"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

// free mirrors the acquire condition on a raw item: no owner, or a lease that is
// absent, released, or expired before stale.
func free(raw codec.Item, stale int64) bool {
	if raw[schema.AttrLeaseOwner] == nil || raw[schema.AttrLeaseExpires] == nil {
		return true
	}
	e, err := codec.Int(raw, schema.AttrLeaseExpires)
	return err == nil && (e == 0 || e < stale)
}

// valueIs is a condition that the attribute (name ref) is exactly v as read: absent,
// the same number or string, or, for any other type, still not a number or string.
func valueIs(ref, val string, v types.AttributeValue) (string, map[string]types.AttributeValue) {
	switch v.(type) {
	case nil:
		return "attribute_not_exists(" + ref + ")", nil
	case *types.AttributeValueMemberN, *types.AttributeValueMemberS:
		return ref + " = " + val, map[string]types.AttributeValue{val: v}
	}
	return fmt.Sprintf("attribute_exists(%[1]s) AND NOT attribute_type(%[1]s, %[2]sn) AND NOT attribute_type(%[1]s, %[2]ss)", ref, val),
		map[string]types.AttributeValue{val + "n": codec.S("N"), val + "s": codec.S("S")}
}
