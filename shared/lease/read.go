package lease

import (
	"context"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
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
	ExpiresAtMs  int64 // 0 if absent or released
	Spec         schema.Spec
	SpecErr      error // the spec does not decode
	// Unrunnable is codec.Connection.Unrunnable of what was read: an unusable field
	// no write repairs (nudged_at_ms, seq_epoch mistyped by hand) among others.
	Unrunnable error
}

// ReadOwned reads ids (at most BatchGetLimit) with one eventually consistent
// BatchGetItem, projecting only what an owner compares: desired_state, ws_url,
// the lease fields, the fields no write repairs (nudged_at_ms, seq_epoch) and the
// spec's attributes (a read costs the whole
// item's size whatever it projects). It returns a snapshot per id (Found false: absent) and
// the read units DynamoDB reports. Keys DynamoDB leaves unprocessed are absent from
// the map, to be read next time. An eventually consistent read may be stale: act on
// a difference only after confirming it with a conditional write (Checkpoint).
func (s *Store) ReadOwned(ctx context.Context, ids []string) (map[string]Snapshot, float64, error) {
	attrs := append([]string{schema.AttrDesiredState, schema.AttrWSURL, schema.AttrLeaseOwner, schema.AttrLeaseVersion,
		schema.AttrLeaseExpires, schema.AttrNudgedAt, schema.AttrEpoch}, codec.SpecAttrs()...)
	items, units, err := ReadItems(ctx, s.db, s.cfg.Table, ids, attrs...)
	if err != nil {
		return nil, 0, fmt.Errorf("read owned: %w", err)
	}
	if items == nil {
		return nil, 0, nil
	}
	snaps := make(map[string]Snapshot, len(items))
	for id, it := range items {
		if it == nil {
			snaps[id] = Snapshot{}
			continue
		}
		c, _ := codec.DecodeConnection(it) // lease fields survive a bad operator field
		st := c.DesiredState
		if d, ok := it[schema.AttrDesiredState].(*types.AttributeValueMemberS); !ok || schema.State(d.Value) != st {
			st = "" // unusable: the caller confirms, and the checkpoint's item says why
		}
		snaps[id] = Snapshot{Found: true, DesiredState: st, WSURL: c.WSURL, LeaseOwner: c.LeaseOwner, LeaseVersion: c.LeaseVersion,
			Spec: c.Spec, SpecErr: c.SpecErr, Unrunnable: c.Unrunnable(), ExpiresAtMs: c.LeaseExpiresAtMs}
	}
	return snaps, units, nil
}

// BatchGetter is the SDK call ReadItems makes.
type BatchGetter interface {
	BatchGetItem(context.Context, *dynamodb.BatchGetItemInput, ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error)
}

// ReadItems reads the connection items of ids (at most BatchGetLimit) from table with
// one eventually consistent BatchGetItem, projecting the key and attrs. It returns
// an entry per id DynamoDB answered for (a nil item: absent; keys it left unprocessed
// are left out, to be read next time), and the read units consumed. An eventually
// consistent read may be stale: it only decides whether to look closer, never what
// to write unconditionally.
func ReadItems(ctx context.Context, db BatchGetter, table string, ids []string, attrs ...string) (map[string]codec.Item, float64, error) {
	if len(ids) == 0 {
		return nil, 0, nil
	}
	if len(ids) > BatchGetLimit {
		return nil, 0, fmt.Errorf("%d ids, limit %d: %w", len(ids), BatchGetLimit, ErrInvalid)
	}
	keys := make([]map[string]types.AttributeValue, 0, len(ids))
	for _, id := range ids {
		if err := schema.ValidateID(id); err != nil {
			return nil, 0, fmt.Errorf("%s: %w", id, err)
		}
		keys = append(keys, key(id))
	}
	proj := expression.NamesList(namePK)
	for _, a := range attrs {
		proj = proj.AddNames(name(a))
	}
	e, err := expression.NewBuilder().WithProjection(proj).Build()
	if err != nil {
		return nil, 0, fmt.Errorf("%w: build expression: %v", ErrInvalid, err)
	}
	out, err := db.BatchGetItem(ctx, &dynamodb.BatchGetItemInput{
		RequestItems: map[string]types.KeysAndAttributes{table: {
			Keys:                     keys,
			ConsistentRead:           aws.Bool(false),
			ProjectionExpression:     e.Projection(),
			ExpressionAttributeNames: e.Names(),
		}},
		ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal,
	})
	if err != nil {
		return nil, 0, translate(err)
	}
	var units float64
	for _, c := range out.ConsumedCapacity {
		units += aws.ToFloat64(c.CapacityUnits)
	}
	items := make(map[string]codec.Item, len(ids))
	for _, id := range ids {
		items[id] = nil
	}
	for _, it := range out.Responses[table] {
		if id, ok := connID(it); ok {
			items[id] = it
		}
	}
	for _, k := range out.UnprocessedKeys[table].Keys {
		if id, ok := connID(k); ok {
			delete(items, id)
		}
	}
	return items, units, nil
}

// Querier is the SDK call OwnedBy makes.
type Querier interface {
	Query(context.Context, *dynamodb.QueryInput, ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error)
}

// OwnedBy pages the lease_owner index of table for the connections it lists under
// worker, calling page with each page's ids before reading the next, and returns the
// read units consumed. The index lags the table: what it lists must be confirmed
// (read, or written under a condition) before it is acted on.
func OwnedBy(ctx context.Context, db Querier, table, worker string, page func(ids []string)) (float64, error) {
	if err := schema.ValidateID(worker); err != nil {
		return 0, fmt.Errorf("worker %w", err)
	}
	e, err := expression.NewBuilder().
		WithKeyCondition(expression.KeyEqual(expression.Key(schema.AttrLeaseOwner), expression.Value(codec.S(worker)))).Build()
	if err != nil {
		return 0, fmt.Errorf("%w: build expression: %v", ErrInvalid, err)
	}
	var units float64
	var start map[string]types.AttributeValue
	for {
		out, err := db.Query(ctx, &dynamodb.QueryInput{
			TableName:                 &table,
			IndexName:                 aws.String(schema.IndexLeaseOwner),
			KeyConditionExpression:    e.KeyCondition(),
			ExpressionAttributeNames:  e.Names(),
			ExpressionAttributeValues: e.Values(),
			ExclusiveStartKey:         start,
			ReturnConsumedCapacity:    types.ReturnConsumedCapacityTotal,
		})
		if err != nil {
			return units, translate(err)
		}
		if out.ConsumedCapacity != nil {
			units += aws.ToFloat64(out.ConsumedCapacity.CapacityUnits)
		}
		ids := make([]string, 0, len(out.Items))
		for _, k := range out.Items {
			if id, ok := connID(k); ok {
				ids = append(ids, id)
			}
		}
		page(ids)
		if len(out.LastEvaluatedKey) == 0 {
			return units, nil
		}
		start = out.LastEvaluatedKey
	}
}

// connID is the connection id of an item's key; false if it is not a connection's.
func connID(it codec.Item) (string, bool) {
	pk, ok := it[schema.AttrPK].(*types.AttributeValueMemberS)
	if !ok {
		return "", false
	}
	return schema.ConnID(pk.Value)
}

// Naming lists the connections the lease_owner index names worker as the owner of,
// every page, with the read units consumed. The index is keys only, so a pass costs
// about 0.5 read units per 4 KB of keys (some 60 connections), 0.5 at the least. The
// index lags the table: confirm what it lists (Get) before acting on it.
func (s *Store) Naming(ctx context.Context, worker string) ([]string, float64, error) {
	var ids []string
	units, err := OwnedBy(ctx, s.db, s.cfg.Table, worker, func(page []string) { ids = append(ids, page...) })
	if err != nil {
		return nil, units, fmt.Errorf("connections naming %s: %w", worker, err)
	}
	return ids, units, nil
}
