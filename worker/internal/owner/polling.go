package owner

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/shared/wakeup"
)

// Polling mode reproduces the seed's design for users who cannot deploy the
// reconciler, and as the baseline the benchmarks compare against: every worker
// queries the seed's index for orphans on an interval with jitter and tries to
// acquire each one, and reads each owned connection's desired_state every tick.
// Acquisitions still go through the lease store's conditional writes, so safety is
// the same as in stream mode; what polling costs is time (failover waits for lease
// expiry plus a poll), reads, index writes, and lost races between workers.

// DB is what polling mode reads with.
type DB interface {
	Query(context.Context, *dynamodb.QueryInput, ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error)
	GetItem(context.Context, *dynamodb.GetItemInput, ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error)
}

// QueryOrphans is the seed's reconciliation query: STARTED connections whose
// lease_expires_at_ms is below now − margin (0 means released), on the seed's index,
// with eventually consistent reads as the seed makes them. It returns at most limit.
func QueryOrphans(ctx context.Context, db DB, table string, now time.Time, margin time.Duration, limit int) ([]string, error) {
	var ids []string
	var start map[string]types.AttributeValue
	for {
		out, err := db.Query(ctx, &dynamodb.QueryInput{
			TableName:                &table,
			IndexName:                aws.String(schema.PollingIndex.Name),
			KeyConditionExpression:   aws.String("#d = :s AND #e < :stale"),
			ExpressionAttributeNames: map[string]string{"#d": schema.AttrDesiredState, "#e": schema.AttrLeaseExpires},
			ExpressionAttributeValues: map[string]types.AttributeValue{
				":s": codec.S(string(schema.Started)), ":stale": codec.N(now.Add(-margin).UnixMilli()),
			},
			ExclusiveStartKey: start,
		})
		if err != nil {
			return ids, fmt.Errorf("orphan query: %w", err)
		}
		ids = appendConnIDs(ids, out.Items)
		if len(out.LastEvaluatedKey) == 0 || len(ids) >= limit {
			return ids, nil
		}
		start = out.LastEvaluatedKey
	}
}

// ReadDesiredState is the seed's per-connection check_desired_state read.
func ReadDesiredState(ctx context.Context, db DB, table, id string) (schema.State, error) {
	out, err := db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: &table, Key: map[string]types.AttributeValue{schema.AttrPK: codec.S(schema.ConnKey(id))},
		ProjectionExpression:     aws.String("#d"),
		ExpressionAttributeNames: map[string]string{"#d": schema.AttrDesiredState},
	})
	if err != nil {
		return "", fmt.Errorf("read desired_state of %s: %w", id, err)
	}
	if s, ok := out.Item[schema.AttrDesiredState].(*types.AttributeValueMemberS); ok {
		return schema.State(s.Value), nil
	}
	return "", nil
}

// pollOrphans runs until ctx ends: sleep PollInterval ±50 %, list orphans, try each.
func (m *Manager) pollOrphans(ctx context.Context) {
	r := m.cfg.Rand
	if r == nil {
		r = rand.Float64
	}
	for {
		d := time.Duration(float64(m.cfg.PollInterval) * (0.5 + r()))
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
		m.cfg.Metrics.OrphanPolls.Add(1)
		ids, err := m.cfg.Orphans(ctx)
		if err != nil {
			m.cfg.Log.Warn("orphan poll failed", "err", err)
			continue
		}
		for _, id := range ids {
			if ctx.Err() != nil {
				return
			}
			if res, _ := m.Acquire(ctx, id); res == wakeup.NoCapacity || res == wakeup.Draining {
				break
			}
		}
	}
}

// readDesiredStates reads every owned connection's desired_state, as the seed does,
// and re-checks (renews and acts on) the ones no longer STARTED.
func (m *Manager) readDesiredStates(ctx context.Context) {
	m.mu.Lock()
	list := make([]*owned, 0, len(m.conns))
	for _, o := range m.conns {
		list = append(list, o)
	}
	m.mu.Unlock()
	var wg sync.WaitGroup
	sem := make(chan struct{}, m.cfg.RenewConcurrency)
	for _, o := range list {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			st, err := m.cfg.DesiredState(ctx, o.lease.ID)
			if err == nil && st != schema.Started {
				m.check(ctx, o)
			}
		})
	}
	wg.Wait()
}
