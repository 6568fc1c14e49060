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

// UnheldHold is how long, in stream mode, a free lease must have carried the
// reconciler's unheld mark (schema.AttrUnheldSince) before the start-up pass takes
// it: longer than a holder takes to find a stale released image written back over
// its lease (its checkpoint, at most checkpoint plus a renew tick, or its backstop
// read, backstop plus a tick) and take it back, which removes the mark; plus the skew
// margin between the marker's clock and this worker's. The pass is the one acquire
// no stream record drives, so it cannot tell such an image from a release, as the
// reconciler does by the record's old image (docs/MEMBERSHIP.md, "Operator edits").
func UnheldHold(checkpoint, backstop, renew, margin time.Duration) time.Duration {
	return max(checkpoint, backstop) + renew + margin
}

// ScanCandidates lists STARTED connections that are unowned, released, or expired
// more than margin before now, stopping once it has limit of them. With a non-zero
// unheldBefore (stream mode) it lists only those that carried the unheld mark since
// then (see UnheldHold); the acquire checks it again.
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
func ScanCandidates(ctx context.Context, db Scanner, table string, now time.Time, margin time.Duration, limit int, unheldBefore time.Time) ([]string, error) {
	filter := expression.And(expression.Name(schema.AttrPK).BeginsWith(schema.ConnPrefix),
		expression.Name(schema.AttrDesiredState).Equal(expression.Value(codec.S(string(schema.Started)))),
		lease.FreeCondition(now.Add(-margin).UnixMilli()))
	if !unheldBefore.IsZero() {
		mark := expression.Name(schema.AttrUnheldSince)
		filter = expression.And(filter, mark.GreaterThan(expression.Value(codec.N(0))),
			mark.LessThanEqual(expression.Value(codec.N(unheldBefore.UnixMilli()))))
	}
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
// In stream mode it takes only leases that carried the unheld mark for UnheldHold:
// a free lease without one may be a stale image its holder is taking back, and is
// left to the reconciler, which sees the record (its wakeups and its sweep's nudge).
func (m *Manager) startup(ctx context.Context) {
	var unheldMs int64
	if mc := m.cfg.Member; mc != nil {
		now := time.Now
		if mc.Now != nil {
			now = mc.Now
		}
		unheldMs = now().Add(-UnheldHold(mc.CheckpointInterval, mc.BackstopInterval, m.cfg.RenewInterval, m.cfg.SkewMargin)).UnixMilli()
	}
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
			r, _ := m.acquire(ctx, id, 0, unheldMs)
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
