// Package registry reads and writes worker items (WORKER#<id>): each worker's wakeup
// address, capacity, load, draining flag and heartbeat expiry. In polling mode workers
// refresh their own item once per renew tick with Put; in stream mode the item is the
// worker's membership lease (Join, Renew, Leave, DeclareDead, Tombstone: see
// member.go and docs/MEMBERSHIP.md). Either way it is one write per worker, not per
// connection. The
// reconciler and the CLI list it through the sparse registry index, which holds
// worker items only, so listing never reads connection items.
package registry

import (
	"context"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

// DynamoDB is the part of the SDK client the registry uses.
type DynamoDB interface {
	PutItem(context.Context, *dynamodb.PutItemInput, ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error)
	UpdateItem(context.Context, *dynamodb.UpdateItemInput, ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
	DeleteItem(context.Context, *dynamodb.DeleteItemInput, ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error)
	Query(context.Context, *dynamodb.QueryInput, ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error)
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

// List returns every worker item, live or not, and the items that did not decode
// (as errors, so a bad item is reported, never fatal).
func (r *Registry) List(ctx context.Context) ([]codec.Worker, []error, error) {
	var out []codec.Worker
	var bad []error
	var start map[string]types.AttributeValue
	for {
		page, err := r.DB.Query(ctx, &dynamodb.QueryInput{
			TableName:                 &r.Table,
			IndexName:                 aws.String(schema.IndexRegistry),
			KeyConditionExpression:    aws.String("#r = :r"),
			ExpressionAttributeNames:  map[string]string{"#r": schema.AttrRegistry},
			ExpressionAttributeValues: map[string]types.AttributeValue{":r": codec.S(schema.RegistryKey)},
			ExclusiveStartKey:         start,
		})
		if err != nil {
			return out, bad, fmt.Errorf("list workers: %w", err)
		}
		for _, it := range page.Items {
			w, err := codec.DecodeWorker(it)
			if err != nil {
				bad = append(bad, err)
				continue
			}
			out = append(out, w)
		}
		if len(page.LastEvaluatedKey) == 0 {
			return out, bad, nil
		}
		start = page.LastEvaluatedKey
	}
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
