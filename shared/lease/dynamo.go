package lease

import (
	"context"
	"errors"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

// DynamoDB is the part of the SDK client the store uses.
type DynamoDB interface {
	UpdateItem(context.Context, *dynamodb.UpdateItemInput, ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
	GetItem(context.Context, *dynamodb.GetItemInput, ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error)
	BatchGetItem(context.Context, *dynamodb.BatchGetItemInput, ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error)
	Query(context.Context, *dynamodb.QueryInput, ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error)
}

// conditionFailed carries the item as it was when a condition failed.
type conditionFailed struct{ item codec.Item }

func (conditionFailed) Error() string { return "condition failed" }

// updateInput is the conditional UpdateItem of upd on connection id under cond,
// returning ret on success and the item as it was on a condition failure. Its
// expressions, names and values come from one expression builder, so they always
// agree.
func (s *Store) updateInput(id string, upd expression.UpdateBuilder, cond expression.ConditionBuilder,
	ret types.ReturnValue) (*dynamodb.UpdateItemInput, error) {
	e, err := expression.NewBuilder().WithUpdate(upd).WithCondition(cond).Build()
	if err != nil {
		return nil, fmt.Errorf("%w: build expression: %v", ErrInvalid, err)
	}
	return &dynamodb.UpdateItemInput{
		TableName:                           &s.cfg.Table,
		Key:                                 key(id),
		UpdateExpression:                    e.Update(),
		ConditionExpression:                 e.Condition(),
		ExpressionAttributeNames:            e.Names(),
		ExpressionAttributeValues:           e.Values(),
		ReturnValues:                        ret,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}, nil
}

// write runs the conditional UpdateItem of upd on id under cond (see updateInput).
func (s *Store) write(ctx context.Context, id string, upd expression.UpdateBuilder, cond expression.ConditionBuilder,
	ret types.ReturnValue) (codec.Item, error) {
	in, err := s.updateInput(id, upd, cond, ret)
	if err != nil {
		return nil, err
	}
	return s.update(ctx, in)
}

// update runs in, turning a condition failure into conditionFailed.
func (s *Store) update(ctx context.Context, in *dynamodb.UpdateItemInput) (codec.Item, error) {
	out, err := s.db.UpdateItem(ctx, in)
	if err == nil {
		return out.Attributes, nil
	}
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		return nil, conditionFailed{item: ccf.Item}
	}
	return nil, err
}

func isCondition(err error) bool {
	var cf conditionFailed
	return errors.As(err, &cf)
}

// resolve turns a failed write into the item as it now is. A condition failure
// carries the item; anything else is ambiguous (the write may have been applied), so
// the item is read back on a fresh context in case ctx is what expired.
func (s *Store) resolve(ctx context.Context, id string, err error) (codec.Connection, codec.Item, error) {
	var cf conditionFailed
	if errors.As(err, &cf) {
		if cf.item == nil {
			return codec.Connection{}, nil, nil
		}
		c, _ := codec.DecodeConnection(cf.item)
		c.ID = id
		return c, cf.item, nil
	}
	var api smithy.APIError
	if errors.As(err, &api) && api.ErrorFault() == smithy.FaultClient && !retryableCode(api.ErrorCode()) {
		return codec.Connection{}, nil, fmt.Errorf("%w: %s", ErrInvalid, api.ErrorMessage()) // refused before applying
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ReadBackTimeout)
	defer cancel()
	c, raw, rerr := s.get(rctx, id)
	if rerr != nil {
		return codec.Connection{}, nil, fmt.Errorf("%w: write: %v; read-back: %v", ErrUnavailable, translateMsg(err), rerr)
	}
	return c, raw, nil
}

func retryableCode(code string) bool {
	switch code {
	case "ThrottlingException", "ProvisionedThroughputExceededException", "RequestLimitExceeded",
		"TransactionConflictException", "RequestTimeout", "RequestTimeoutException":
		return true
	}
	return false
}

// translate hides SDK error types behind ErrUnavailable, keeping the message.
func translate(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrUnavailable, translateMsg(err))
}

func translateMsg(err error) string {
	var api smithy.APIError
	if errors.As(err, &api) {
		return api.ErrorCode() + ": " + api.ErrorMessage()
	}
	return err.Error()
}

func key(id string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{schema.AttrPK: codec.S(schema.ConnKey(id))}
}
