// Package connquota keeps the fleet-wide connect quota and the upstreams' rate-limit
// holds in the table: one item per upstream host (schema.QuotaKey), written only with
// conditional updates, so that N dials per window hold across every worker behind
// the same egress address, and a 429's Retry-After holds back every worker.
//
// The item holds the current window's start (window_ms, epoch ms, windows aligned
// to multiples of the window since the Unix epoch), the dials admitted in it
// (dials) and the time before which no dial may go (blocked_until_ms). An admitted
// dial is one UpdateItem: ADD dials 1 if the window is the caller's, dials < N and
// the host is not held; the first dial of a window resets the count instead.
//
// Guarantees: at most N admissions per aligned window per host, whatever the number
// of workers, as long as their clocks agree on the window (a worker whose clock runs
// behind the item's window waits for its own clock to reach it). A hold only grows:
// a shorter Retry-After never shortens a longer one. Every write sets ttl past both
// the window's end and the hold, so TTL removes only items of hosts no longer dialed.
//
// Non-guarantees: the window is fixed, not sliding: an upstream that counts any
// sliding window of the same length may see up to 2N around a boundary (set N to
// half its limit if it counts that way). A dial is counted when admitted, not when
// it reaches the upstream.
package connquota

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

// DB is the SDK calls the store makes.
type DB interface {
	UpdateItem(context.Context, *dynamodb.UpdateItemInput, ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
	GetItem(context.Context, *dynamodb.GetItemInput, ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error)
}

// MaxHold bounds a hold (a Retry-After): an upstream asking for more is retried
// after MaxHold. Binance's 418 bans run from 2 minutes to 3 days; a fleet silent for
// days on one header is worse than one more refused dial an hour.
const MaxHold = time.Hour

// ttlMargin keeps an item past its window and its hold. It exceeds MaxHold, so a
// later write (which sets ttl from its own window) can never bring ttl before a hold
// set earlier.
const ttlMargin = 2 * time.Hour

// Store reads and writes the quota items of one table.
type Store struct {
	DB    DB
	Table string
}

// Verdict is the answer to an admission.
type Verdict struct {
	Admitted bool
	// Held: the host asked for no dial before HeldUntil.
	HeldUntil time.Time
	// Retry: not admitted (window full, or the caller's clock behind the item's
	// window); ask again at Retry.
	Retry time.Time
	// WindowEnd: when the window an admitted dial was counted in ends.
	WindowEnd time.Time
}

// Window returns the window of the given length that now falls in: windows are
// aligned to multiples of their length (in whole milliseconds) since the Unix epoch,
// so every worker computes the same ones.
func Window(now time.Time, length time.Duration) (start, end time.Time) {
	ms := max(length.Milliseconds(), 1)
	s := now.UnixMilli() / ms * ms
	return time.UnixMilli(s), time.UnixMilli(s + ms)
}

// Admit counts one dial to host at now against n per window, fleet-wide. n = 0
// checks only the hold, with one eventually consistent read and no write.
func (s *Store) Admit(ctx context.Context, host string, n int, window time.Duration, now time.Time) (Verdict, error) {
	if host == "" || window <= 0 || n < 0 {
		return Verdict{}, fmt.Errorf("admit %q: want a host, n >= 0 and a positive window (got %d per %s)", host, n, window)
	}
	if n == 0 {
		return s.held(ctx, host, now)
	}
	startT, end := Window(now, window)
	start := startT.UnixMilli()
	ttl := end.Add(ttlMargin).Unix()
	// Two shapes of write: count in the current window, or open a new one. Each
	// failure says (from the old image) which one applies; three tries cover a
	// window opened by another worker between them.
	sameWindow := true
	for range 3 {
		in := s.update(host, sameWindow, start, n, now, ttl)
		_, err := s.DB.UpdateItem(ctx, in)
		var ccf *types.ConditionalCheckFailedException
		if !errors.As(err, &ccf) {
			if err != nil {
				return Verdict{}, fmt.Errorf("admit %s: %w", host, err)
			}
			return Verdict{Admitted: true, WindowEnd: end}, nil
		}
		old := decode(ccf.Item)
		switch {
		case old.heldUntil > now.UnixMilli():
			return Verdict{HeldUntil: time.UnixMilli(old.heldUntil)}, nil
		case !old.exists || old.window < start:
			sameWindow = false
		case old.window > start:
			return Verdict{Retry: end}, nil // this clock is behind: its window ends first
		case old.dials >= int64(n):
			return Verdict{Retry: end}, nil
		default:
			sameWindow = true // opened by another worker meanwhile
		}
	}
	return Verdict{Retry: now.Add(window / 100)}, nil // contended: ask again soon
}

func (s *Store) update(host string, sameWindow bool, start int64, n int, now time.Time, ttl int64) *dynamodb.UpdateItemInput {
	names := map[string]string{"#w": schema.AttrQuotaWindow, "#d": schema.AttrQuotaDials,
		"#b": schema.AttrBlockedUntil, "#t": schema.AttrTTL}
	vals := map[string]types.AttributeValue{":w": codec.N(start), ":now": codec.N(now.UnixMilli()),
		":one": codec.N(1), ":ttl": codec.N(ttl), ":num": codec.S("N")}
	// A mistyped attribute (an operator's edit) counts as absent, so it cannot wedge
	// the host: the next window's write replaces it.
	notHeld := "(attribute_not_exists(#b) OR NOT attribute_type(#b, :num) OR #b <= :now)"
	in := &dynamodb.UpdateItemInput{
		TableName:                           &s.Table,
		Key:                                 key(host),
		ExpressionAttributeNames:            names,
		ExpressionAttributeValues:           vals,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}
	if sameWindow {
		vals[":n"] = codec.N(int64(n))
		in.UpdateExpression = aws.String("ADD #d :one SET #t = :ttl")
		in.ConditionExpression = aws.String("#w = :w AND #d < :n AND " + notHeld)
	} else {
		vals[":zero"] = codec.N(0) // no hold (also repairs a mistyped one)
		in.UpdateExpression = aws.String("SET #w = :w, #d = :one, #b = :zero, #t = :ttl")
		in.ConditionExpression = aws.String("(attribute_not_exists(#w) OR NOT attribute_type(#w, :num) OR #w < :w) AND " + notHeld)
	}
	return in
}

// held reads host's hold, for a fleet without a quota.
func (s *Store) held(ctx context.Context, host string, now time.Time) (Verdict, error) {
	out, err := s.DB.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:                &s.Table,
		Key:                      key(host),
		ProjectionExpression:     aws.String("#b"),
		ExpressionAttributeNames: map[string]string{"#b": schema.AttrBlockedUntil},
	})
	if err != nil {
		return Verdict{}, fmt.Errorf("read hold of %s: %w", host, err)
	}
	if old := decode(out.Item); old.heldUntil > now.UnixMilli() {
		return Verdict{HeldUntil: time.UnixMilli(old.heldUntil)}, nil
	}
	return Verdict{Admitted: true}, nil
}

// Hold records that host asked for no dial before until (at most MaxHold after now).
// A longer hold already there is kept.
func (s *Store) Hold(ctx context.Context, host string, until, now time.Time) error {
	if host == "" {
		return errors.New("hold: no host")
	}
	if limit := now.Add(MaxHold); until.After(limit) {
		until = limit
	}
	_, err := s.DB.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                &s.Table,
		Key:                      key(host),
		UpdateExpression:         aws.String("SET #b = :u, #t = :ttl"),
		ConditionExpression:      aws.String("attribute_not_exists(#b) OR NOT attribute_type(#b, :num) OR #b < :u"),
		ExpressionAttributeNames: map[string]string{"#b": schema.AttrBlockedUntil, "#t": schema.AttrTTL},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":u": codec.N(until.UnixMilli()), ":ttl": codec.N(until.Add(ttlMargin).Unix()), ":num": codec.S("N"),
		},
	})
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		return nil // a longer hold is already there
	}
	if err != nil {
		return fmt.Errorf("hold %s: %w", host, err)
	}
	return nil
}

func key(host string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{schema.AttrPK: codec.S(schema.QuotaKey(host))}
}

type item struct {
	exists                   bool
	window, dials, heldUntil int64
}

// decode reads the old image of a failed condition; a missing or mistyped attribute
// reads as 0 (an operator's edit must not wedge the host: the next write repairs it).
func decode(it map[string]types.AttributeValue) item {
	num := func(name string) int64 {
		n, ok := it[name].(*types.AttributeValueMemberN)
		if !ok {
			return 0
		}
		v, _ := strconv.ParseInt(n.Value, 10, 64)
		return v
	}
	return item{exists: len(it) > 0, window: num(schema.AttrQuotaWindow), dials: num(schema.AttrQuotaDials),
		heldUntil: num(schema.AttrBlockedUntil)}
}
