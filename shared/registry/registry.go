// Package registry reads and writes worker items (WORKER#<id>): each worker's wakeup
// address, capacity, load, draining flag and heartbeat expiry. In polling mode workers
// refresh their own item once per renew tick with Put; in stream mode the item is the
// worker's membership lease (Join, Renew, Leave, DeclareDead, Tombstone: see
// member.go and docs/MEMBERSHIP.md). Either way it is one write per worker, not per
// connection. The
// reconciler and the CLI list it through the sparse registry index, which holds
// worker items only, so listing never reads connection items. The index is KEYS_ONLY,
// so a renew writes only the item: List reads the keys there and the items with
// BatchGetItem.
package registry

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

// DynamoDB is the part of the SDK client the registry uses.
type DynamoDB interface {
	PutItem(context.Context, *dynamodb.PutItemInput, ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error)
	UpdateItem(context.Context, *dynamodb.UpdateItemInput, ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
	DeleteItem(context.Context, *dynamodb.DeleteItemInput, ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error)
	Query(context.Context, *dynamodb.QueryInput, ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error)
	BatchGetItem(context.Context, *dynamodb.BatchGetItemInput, ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error)
}

// Registry is the worker registry in one table.
type Registry struct {
	DB    DynamoDB
	Table string
}

// TTLGrace is how long after its heartbeat lapses DynamoDB's TTL may delete a dead
// worker's item (TTL deletion is lazy; readers check the heartbeat themselves).
const TTLGrace = time.Hour

// Put writes w's item, setting its TTL from its heartbeat expiry.
func (r *Registry) Put(ctx context.Context, w codec.Worker) error {
	if err := schema.ValidateID(w.ID); err != nil {
		return fmt.Errorf("register worker: %w", err)
	}
	w.TTL = time.UnixMilli(w.HeartbeatExpiresAtMs).Add(TTLGrace).Unix()
	_, err := r.DB.PutItem(ctx, &dynamodb.PutItemInput{TableName: &r.Table, Item: codec.EncodeWorker(w)})
	if err != nil {
		return fmt.Errorf("register worker %s: %w", w.ID, err)
	}
	return nil
}

// Delete removes worker id's item.
func (r *Registry) Delete(ctx context.Context, id string) error {
	_, err := r.DB.DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName: &r.Table,
		Key:       map[string]types.AttributeValue{schema.AttrPK: codec.S(schema.WorkerKey(id))},
	})
	if err != nil {
		return fmt.Errorf("deregister worker %s: %w", id, err)
	}
	return nil
}

// List returns every worker item, live or not, sorted by id, and the items that did
// not decode (as errors, so a bad item is reported, never fatal).
//
// It queries the KEYS_ONLY registry index for the keys, then reads the items with
// eventually consistent BatchGetItem, 100 keys a request, retrying unprocessed keys
// with backoff. The index is eventually consistent anyway, so a consistent item read
// would not make the listing consistent, and every decision taken on a listing is a
// conditional write that checks the item again (DeclareDead, Tombstone, a wakeup's
// acquire); an eventually consistent read costs half as much. Until the index
// exists and is active (a deployed table moving from the old ALL index), it lists the
// legacy index instead, whose entries are the items.
func (r *Registry) List(ctx context.Context) ([]codec.Worker, []error, error) {
	items, err := r.query(ctx, schema.IndexRegistry)
	if missingIndex(err, schema.IndexRegistry) {
		items, err = r.query(ctx, schema.LegacyIndexRegistry)
	} else if err == nil {
		items, err = r.batchGet(ctx, items)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("list workers: %w", err)
	}
	var out []codec.Worker
	var bad []error
	for _, it := range items {
		w, err := codec.DecodeWorker(it)
		if err != nil {
			bad = append(bad, err)
			continue
		}
		out = append(out, w)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, bad, nil
}

// query returns every entry of the registry index named index.
func (r *Registry) query(ctx context.Context, index string) ([]codec.Item, error) {
	var out []codec.Item
	var start map[string]types.AttributeValue
	for {
		page, err := r.DB.Query(ctx, &dynamodb.QueryInput{
			TableName:                 &r.Table,
			IndexName:                 aws.String(index),
			KeyConditionExpression:    aws.String("#r = :r"),
			ExpressionAttributeNames:  map[string]string{"#r": schema.AttrRegistry},
			ExpressionAttributeValues: map[string]types.AttributeValue{":r": codec.S(schema.RegistryKey)},
			ExclusiveStartKey:         start,
		})
		if err != nil {
			return nil, err
		}
		out = append(out, page.Items...)
		if len(page.LastEvaluatedKey) == 0 {
			return out, nil
		}
		start = page.LastEvaluatedKey
	}
}

// missingIndex reports whether err says that index cannot be queried: it does not
// exist ("The table does not have the specified index") or is still backfilling.
func missingIndex(err error, index string) bool {
	var api smithy.APIError
	return errors.As(err, &api) && api.ErrorCode() == "ValidationException" && strings.Contains(api.ErrorMessage(), index)
}

// Backoff for keys BatchGetItem leaves unprocessed (DynamoDB does so when a request
// exceeds its size limit or the table is throttled): BatchGetAttempts requests in
// all, waiting BatchGetBackoff, doubling, between them.
const (
	BatchGetAttempts = 8
	BatchGetBackoff  = 25 * time.Millisecond
	batchGetLimit    = 100 // keys per BatchGetItem request
)

// batchGet reads the items whose keys are in keys (index entries: only Pk is used).
// An item deleted since the index listed it is left out.
func (r *Registry) batchGet(ctx context.Context, keys []codec.Item) ([]codec.Item, error) {
	var out []codec.Item
	for len(keys) > 0 {
		n := min(len(keys), batchGetLimit)
		pending := make([]map[string]types.AttributeValue, 0, n)
		for _, k := range keys[:n] {
			pending = append(pending, map[string]types.AttributeValue{schema.AttrPK: k[schema.AttrPK]})
		}
		keys = keys[n:]
		wait := BatchGetBackoff
		for attempt := 1; len(pending) > 0; attempt++ {
			page, err := r.DB.BatchGetItem(ctx, &dynamodb.BatchGetItemInput{
				RequestItems: map[string]types.KeysAndAttributes{r.Table: {Keys: pending, ConsistentRead: aws.Bool(false)}},
			})
			if err != nil {
				return nil, err
			}
			out = append(out, page.Responses[r.Table]...)
			pending = page.UnprocessedKeys[r.Table].Keys
			if len(pending) == 0 {
				break
			}
			if attempt == BatchGetAttempts {
				return nil, fmt.Errorf("%d worker items still unprocessed after %d BatchGetItem requests", len(pending), attempt)
			}
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(wait):
			}
			wait *= 2
		}
	}
	return out, nil
}

// Live filters ws to workers whose heartbeat has not lapsed at now.
func Live(ws []codec.Worker, now time.Time) []codec.Worker {
	var out []codec.Worker
	for _, w := range ws {
		if w.Live(now.UnixMilli()) {
			out = append(out, w)
		}
	}
	return out
}
