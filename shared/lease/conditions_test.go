package lease

import (
	"context"
	"errors"
	"maps"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/local/ddbtest"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

// The free-lease condition is evaluated in two places: by DynamoDB (FreeCondition,
// ReleasedCondition) and in Go on an item as read (free). They must agree on every
// shape an operator can leave the lease fields in.
func TestFreeConditionMatchesItsMirror(t *testing.T) {
	env := ddbtest.New(t)
	ctx := context.Background()
	const stale = 1_000_000
	owned := func(exp types.AttributeValue) codec.Item {
		return codec.Item{schema.AttrLeaseOwner: codec.S("w"), schema.AttrLeaseExpires: exp}
	}
	cases := map[string]struct {
		item           codec.Item
		free, released bool
	}{
		"unowned": {codec.Item{}, true, true},
		// A lease with one of its two fields gone is an operator's edit of a lease
		// someone may hold: not free (a release removes the owner and writes 0).
		"no expiry":       {codec.Item{schema.AttrLeaseOwner: codec.S("w")}, false, true},
		"expiry only":     {codec.Item{schema.AttrLeaseExpires: codec.N(stale + 1)}, false, true},
		"membership only": {codec.Item{schema.AttrLeaseExpires: codec.N(schema.LeaseHeldByMember)}, false, true},
		"zeroed":          {owned(codec.N(0)), false, true},
		"released":        {codec.Item{schema.AttrLeaseExpires: codec.N(0)}, true, true},
		"expired unowned": {codec.Item{schema.AttrLeaseExpires: codec.N(stale - 1)}, true, true},
		"expired":         {owned(codec.N(stale - 1)), true, false},
		"negative":        {owned(codec.N(-5)), true, false},
		"at stale":        {owned(codec.N(stale)), false, false},
		"live":            {owned(codec.N(stale + 1)), false, false},
		"membership":      {owned(codec.N(schema.LeaseHeldByMember)), false, false},
		"string expiry":   {owned(codec.S("0")), false, false},
		"boolean expiry":  {owned(&types.AttributeValueMemberBOOL{Value: false}), false, false},
		// A non-integer expiry is where the two differ: DynamoDB compares the number,
		// free refuses what does not decode. The Go side is the stricter one, the
		// safe direction: what it calls free, DynamoDB does too.
		"fraction": {owned(&types.AttributeValueMemberN{Value: "0.5"}), true, false},
	}
	// holds reports whether cond holds on the stored item, by a conditional write of
	// an attribute nothing reads.
	holds := func(id string, cond expression.ConditionBuilder) bool {
		t.Helper()
		e, err := expression.NewBuilder().WithCondition(cond).
			WithUpdate(expression.Set(expression.Name("probe"), expression.Value(codec.N(1)))).Build()
		if err != nil {
			t.Fatal(err)
		}
		_, err = env.DB.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: &env.Table, Key: key(id),
			UpdateExpression: e.Update(), ConditionExpression: e.Condition(),
			ExpressionAttributeNames: e.Names(), ExpressionAttributeValues: e.Values()})
		var ccf *types.ConditionalCheckFailedException
		if err != nil && !errors.As(err, &ccf) {
			t.Fatal(err)
		}
		return err == nil
	}
	for id, c := range cases {
		t.Run(id, func(t *testing.T) {
			id := strings.ReplaceAll(id, " ", "-")
			it := maps.Clone(c.item)
			it[schema.AttrPK] = codec.S(schema.ConnKey(id))
			if _, err := env.DB.PutItem(ctx, &dynamodb.PutItemInput{TableName: &env.Table, Item: it}); err != nil {
				t.Fatal(err)
			}
			if got := holds(id, FreeCondition(stale)); got != c.free {
				t.Errorf("FreeCondition holds: %v, want %v", got, c.free)
			}
			if got := holds(id, ReleasedCondition()); got != c.released {
				t.Errorf("ReleasedCondition holds: %v, want %v", got, c.released)
			}
			if got, want := free(it, stale), c.free && id != "fraction"; got != want {
				t.Errorf("free: %v, want %v", got, want)
			}
		})
	}
}
