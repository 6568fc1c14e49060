package rounds

import (
	"context"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/sockfleet/sockfleet/shared/lease"
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
const BatchLimit = lease.BatchGetLimit

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
	var ids []string
	units, err := lease.OwnedBy(ctx, r.DB, r.Table, worker, func(page []string) { ids = append(ids, page...) })
	if err != nil {
		return ids, units, fmt.Errorf("connections of %s: %w", worker, err)
	}
	return ids, units, nil
}

// Read reads ids (at most BatchLimit) with one eventually consistent BatchGetItem,
// projecting the key, desired_state, the lease fields and moved_at_ms, and returns
// a Candidate per id it answered for (absent items with Found false; unprocessed
// keys are left out) and the read units consumed.
func (r *Reader) Read(ctx context.Context, ids []string) (map[string]Candidate, float64, error) {
	items, units, err := lease.ReadItems(ctx, r.DB, r.Table, ids, schema.AttrDesiredState,
		schema.AttrLeaseOwner, schema.AttrLeaseExpires, schema.AttrLeaseVersion, schema.AttrMovedAt)
	if err != nil {
		return nil, 0, fmt.Errorf("read candidates: %w", err)
	}
	if items == nil {
		return nil, 0, nil
	}
	got := make(map[string]Candidate, len(items))
	for id, it := range items {
		if it == nil {
			got[id] = Candidate{}
			continue
		}
		c, _ := codec.DecodeConnection(it) // the lease fields survive a bad operator field
		got[id] = Candidate{Found: true, Owner: c.LeaseOwner, Held: c.Owned(), Started: c.DesiredState == schema.Started,
			LeaseVersion: c.LeaseVersion, MovedAtMs: max(0, c.MovedAtMs)}
	}
	return got, units, nil
}
