package lease

import (
	"context"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

// Get reads connection id with a strongly consistent read.
func (s *Store) Get(ctx context.Context, id string) (codec.Connection, error) {
	if err := schema.ValidateID(id); err != nil {
		return codec.Connection{}, fmt.Errorf("get %s: %w", id, err)
	}
	c, _, err := s.get(ctx, id)
	if err == nil && c.ID == "" {
		return c, fmt.Errorf("get %s: %w", id, ErrNotFound)
	}
	return c, err
}

// get returns the item decoded (zero Connection if absent) and raw. A decode error is
// not returned: the lease fields are what lease operations need, and they are kept
// regardless; the raw item says which of them were unusable.
func (s *Store) get(ctx context.Context, id string) (codec.Connection, codec.Item, error) {
	out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{TableName: &s.cfg.Table, Key: key(id), ConsistentRead: aws.Bool(true)})
	if err != nil {
		return codec.Connection{}, nil, fmt.Errorf("read %s: %w", id, translate(err))
	}
	if out.Item == nil {
		return codec.Connection{}, nil, nil
	}
	c, _ := codec.DecodeConnection(out.Item)
	c.ID = id
	return c, out.Item, nil
}

// BatchGetLimit is the most keys one BatchGetItem request may carry.
const BatchGetLimit = 100

// Snapshot is what ReadOwned reads of one connection.
type Snapshot struct {
	Found        bool
	DesiredState schema.State // "" if unusable
	WSURL        string
	LeaseOwner   string
	LeaseVersion int64
}

// ReadOwned reads ids (at most BatchGetLimit) with one eventually consistent
// BatchGetItem, projecting only what an owner compares: desired_state, ws_url,
// lease_owner, lease_version. It returns a snapshot per id (Found false: absent) and
// the read units DynamoDB reports. Keys DynamoDB leaves unprocessed are absent from
// the map, to be read next time. An eventually consistent read may be stale: act on
// a difference only after confirming it with a conditional write (Checkpoint).
func (s *Store) ReadOwned(ctx context.Context, ids []string) (map[string]Snapshot, float64, error) {
	if len(ids) == 0 {
		return nil, 0, nil
	}
	if len(ids) > BatchGetLimit {
		return nil, 0, fmt.Errorf("read owned: %d ids, limit %d: %w", len(ids), BatchGetLimit, ErrInvalid)
	}
	keys := make([]map[string]types.AttributeValue, 0, len(ids))
	for _, id := range ids {
		if err := schema.ValidateID(id); err != nil {
			return nil, 0, fmt.Errorf("read owned %s: %w", id, err)
		}
		keys = append(keys, key(id))
	}
	out, err := s.db.BatchGetItem(ctx, &dynamodb.BatchGetItemInput{
		RequestItems: map[string]types.KeysAndAttributes{s.cfg.Table: {
			Keys:                 keys,
			ConsistentRead:       aws.Bool(false),
			ProjectionExpression: aws.String("#pk, #d, #u, #o, #v"),
			ExpressionAttributeNames: names("#pk", schema.AttrPK, "#d", schema.AttrDesiredState, "#u", schema.AttrWSURL,
				"#o", schema.AttrLeaseOwner, "#v", schema.AttrLeaseVersion),
		}},
		ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal,
	})
	if err != nil {
		return nil, 0, fmt.Errorf("read owned: %w", translate(err))
	}
	var units float64
	for _, c := range out.ConsumedCapacity {
		units += aws.ToFloat64(c.CapacityUnits)
	}
	snaps := make(map[string]Snapshot, len(ids))
	for _, id := range ids {
		snaps[id] = Snapshot{}
	}
	for _, it := range out.Responses[s.cfg.Table] {
		pk, _ := it[schema.AttrPK].(*types.AttributeValueMemberS)
		if pk == nil {
			continue
		}
		id, ok := schema.ConnID(pk.Value)
		if !ok {
			continue
		}
		c, _ := codec.DecodeConnection(it) // lease fields survive a bad operator field
		st := c.DesiredState
		if d, ok := it[schema.AttrDesiredState].(*types.AttributeValueMemberS); !ok || schema.State(d.Value) != st {
			st = "" // unusable: the caller confirms, and the checkpoint's item says why
		}
		snaps[id] = Snapshot{Found: true, DesiredState: st, WSURL: c.WSURL, LeaseOwner: c.LeaseOwner, LeaseVersion: c.LeaseVersion}
	}
	if un := out.UnprocessedKeys[s.cfg.Table]; len(un.Keys) > 0 {
		for _, k := range un.Keys {
			if pk, ok := k[schema.AttrPK].(*types.AttributeValueMemberS); ok {
				if id, ok := schema.ConnID(pk.Value); ok {
					delete(snaps, id)
				}
			}
		}
	}
	return snaps, units, nil
}
