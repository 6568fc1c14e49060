package owner

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/lease"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/shared/wakeup"
)

// Scanner is the one SDK call the start-up pass makes. It only finds candidates:
// every acquisition still goes through the lease store's conditional write.
type Scanner interface {
	Scan(context.Context, *dynamodb.ScanInput, ...func(*dynamodb.Options)) (*dynamodb.ScanOutput, error)
}

// ScanCandidates lists STARTED connections that are unowned, released, or expired
// more than margin before now, stopping once it has limit of them.
//
// It is a paginated Scan with a filter, which reads the whole table: acceptable
// because it runs once per worker start, never periodically (events drive everything
// after that). No index keyed on lease expiry exists to query instead: in polling
// mode every renew moves lease_expires_at_ms, so such an index would be written on
// every heartbeat of every connection (the seed's index, schema.PollingIndex, is
// created only for polling fleets, which pay that); in stream mode a held lease's
// expiry is the membership constant, so an expiry index could not tell a dead
// member's leases from a live one's anyway (docs/MEMBERSHIP.md, "Dead-member
// detection", is how those are found).
func ScanCandidates(ctx context.Context, db Scanner, table string, now time.Time, margin time.Duration, limit int) ([]string, error) {
	filter := expression.And(expression.Name(schema.AttrPK).BeginsWith(schema.ConnPrefix),
		expression.Name(schema.AttrDesiredState).Equal(expression.Value(codec.S(string(schema.Started)))),
		lease.FreeCondition(now.Add(-margin).UnixMilli()))
	e, err := expression.NewBuilder().WithFilter(filter).WithProjection(expression.NamesList(expression.Name(schema.AttrPK))).Build()
	if err != nil {
		return nil, fmt.Errorf("start-up scan: %w", err)
	}
	var ids []string
	var start map[string]types.AttributeValue
	for {
		out, err := db.Scan(ctx, &dynamodb.ScanInput{
			TableName:                 &table,
			ProjectionExpression:      e.Projection(),
			FilterExpression:          e.Filter(),
			ExpressionAttributeNames:  e.Names(),
			ExpressionAttributeValues: e.Values(),
			ExclusiveStartKey:         start,
		})
		if err != nil {
			return ids, fmt.Errorf("start-up scan: %w", err)
		}
		ids = appendConnIDs(ids, out.Items)
		if len(out.LastEvaluatedKey) == 0 || len(ids) >= limit {
			return ids, nil
		}
		start = out.LastEvaluatedKey
	}
}

// startup is the one start-up pass: acquire candidates, in random order so workers
// starting together do not all race for the same items, until capacity is reached.
func (m *Manager) startup(ctx context.Context) {
	ids, err := m.cfg.Candidates(ctx)
	if err != nil {
		m.cfg.Log.Warn("start-up pass: listing candidates failed; waiting for wakeups", "err", err)
	}
	rand.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
	var (
		mu       sync.Mutex
		acquired int
		full     bool
		wg       sync.WaitGroup
	)
	sem := make(chan struct{}, m.cfg.WakeupConcurrency)
	for _, id := range ids {
		mu.Lock()
		stop := full
		mu.Unlock()
		if stop || ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			r, _ := m.Acquire(ctx, id)
			mu.Lock()
			defer mu.Unlock()
			switch r {
			case wakeup.Acquired:
				acquired++
			case wakeup.NoCapacity, wakeup.Draining:
				full = true
			}
		})
	}
	wg.Wait()
	m.cfg.Log.Info("start-up pass done", "candidates", len(ids), "acquired", acquired)
}

// appendConnIDs appends the connection ids of items' keys, skipping anything else.
func appendConnIDs(ids []string, items []map[string]types.AttributeValue) []string {
	for _, it := range items {
		if pk, ok := it[schema.AttrPK].(*types.AttributeValueMemberS); ok {
			if id, ok := schema.ConnID(pk.Value); ok && schema.ValidateID(id) == nil {
				ids = append(ids, id)
			}
		}
	}
	return ids
}
