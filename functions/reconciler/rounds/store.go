package rounds

import (
	"context"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

// DynamoDB is the part of the SDK client the Reader uses.
type DynamoDB interface {
	Query(context.Context, *dynamodb.QueryInput, ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error)
	BatchGetItem(context.Context, *dynamodb.BatchGetItemInput, ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error)
}

// Reader reads what a round needs from the table: a donor's connection ids from the
// lease_owner index (keys only), and, for the candidates only, their lease and
// moved_at_ms. Every read is eventually consistent: a stale answer only makes a
// move fail its owner's check (stale or lost_race), never a wrong move.
type Reader struct {
	DB    DynamoDB
	Table string
}

// BatchLimit is the most keys one BatchGetItem request carries.
const BatchLimit = 100

// Candidate is what a round reads of one connection.
type Candidate struct {
	Found        bool
	Owner        string // lease_owner; "" if released
	Held         bool   // an unreleased lease
	Started      bool   // desired_state STARTED
	LeaseVersion int64
	MovedAtMs    int64 // 0: never moved (or unreadable: cooling is advisory)
}

// OwnedBy returns the ids the lease_owner index lists under worker, and the read
// units the queries consumed. The index lags the table, and names released
// connections too (a release keeps lease_owner): Read tells them apart.
func (r *Reader) OwnedBy(ctx context.Context, worker string) ([]string, float64, error) {
	if err := schema.ValidateID(worker); err != nil {
		return nil, 0, fmt.Errorf("connections of %s: %w", worker, err)
	}
	var ids []string
	var units float64
	var start map[string]types.AttributeValue
	for {
		out, err := r.DB.Query(ctx, &dynamodb.QueryInput{
			TableName:                 &r.Table,
			IndexName:                 aws.String(schema.IndexLeaseOwner),
			KeyConditionExpression:    aws.String("#o = :w"),
			ExpressionAttributeNames:  map[string]string{"#o": schema.AttrLeaseOwner},
			ExpressionAttributeValues: map[string]types.AttributeValue{":w": codec.S(worker)},
			ExclusiveStartKey:         start,
			ReturnConsumedCapacity:    types.ReturnConsumedCapacityTotal,
		})
		if err != nil {
			return ids, units, fmt.Errorf("connections of %s: %w", worker, err)
		}
		if out.ConsumedCapacity != nil {
			units += aws.ToFloat64(out.ConsumedCapacity.CapacityUnits)
		}
		for _, k := range out.Items {
			if pk, ok := k[schema.AttrPK].(*types.AttributeValueMemberS); ok {
				if id, ok := schema.ConnID(pk.Value); ok {
					ids = append(ids, id)
				}
			}
		}
		if len(out.LastEvaluatedKey) == 0 {
			return ids, units, nil
		}
		start = out.LastEvaluatedKey
	}
}

// Read reads ids (at most BatchLimit) with one eventually consistent BatchGetItem,
// projecting the key, desired_state, the lease fields and moved_at_ms, and returns
// a Candidate per id it answered for (absent items with Found false; unprocessed
// keys are left out) and the read units consumed.
func (r *Reader) Read(ctx context.Context, ids []string) (map[string]Candidate, float64, error) {
	if len(ids) == 0 {
		return nil, 0, nil
	}
	if len(ids) > BatchLimit {
		return nil, 0, fmt.Errorf("read candidates: %d ids, limit %d", len(ids), BatchLimit)
	}
	keys := make([]map[string]types.AttributeValue, 0, len(ids))
	for _, id := range ids {
		if err := schema.ValidateID(id); err != nil {
			return nil, 0, fmt.Errorf("read candidate %q: %w", id, err)
		}
		keys = append(keys, map[string]types.AttributeValue{schema.AttrPK: codec.S(schema.ConnKey(id))})
	}
	out, err := r.DB.BatchGetItem(ctx, &dynamodb.BatchGetItemInput{
		RequestItems: map[string]types.KeysAndAttributes{r.Table: {
			Keys:                 keys,
			ConsistentRead:       aws.Bool(false),
			ProjectionExpression: aws.String("#pk, #d, #o, #e, #v, #m"),
			ExpressionAttributeNames: map[string]string{"#pk": schema.AttrPK, "#d": schema.AttrDesiredState,
				"#o": schema.AttrLeaseOwner, "#e": schema.AttrLeaseExpires, "#v": schema.AttrLeaseVersion, "#m": schema.AttrMovedAt},
		}},
		ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal,
	})
	if err != nil {
		return nil, 0, fmt.Errorf("read candidates: %w", err)
	}
	var units float64
	for _, c := range out.ConsumedCapacity {
		units += aws.ToFloat64(c.CapacityUnits)
	}
	got := make(map[string]Candidate, len(ids))
	for _, id := range ids {
		got[id] = Candidate{}
	}
	for _, it := range out.Responses[r.Table] {
		pk, _ := it[schema.AttrPK].(*types.AttributeValueMemberS)
		if pk == nil {
			continue
		}
		id, ok := schema.ConnID(pk.Value)
		if !ok {
			continue
		}
		c, _ := codec.DecodeConnection(it) // the lease fields survive a bad operator field
		got[id] = Candidate{Found: true, Owner: c.LeaseOwner, Held: c.Owned(), Started: c.DesiredState == schema.Started,
			LeaseVersion: c.LeaseVersion, MovedAtMs: max(0, c.MovedAtMs)}
	}
	for _, k := range out.UnprocessedKeys[r.Table].Keys {
		if pk, ok := k[schema.AttrPK].(*types.AttributeValueMemberS); ok {
			if id, ok := schema.ConnID(pk.Value); ok {
				delete(got, id)
			}
		}
	}
	return got, units, nil
}
