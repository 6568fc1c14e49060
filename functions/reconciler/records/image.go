package records

import (
	"encoding/json"
	"fmt"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

// EventSource is the eventSource of every DynamoDB stream record.
const EventSource = "aws:dynamodb"

// DecodeRecord parses one stream record as Lambda delivers it. Decoding records one
// by one lets a caller skip a record that will not parse instead of failing a batch.
func DecodeRecord(raw []byte) (events.DynamoDBEventRecord, error) {
	var r events.DynamoDBEventRecord
	if err := json.Unmarshal(raw, &r); err != nil {
		return events.DynamoDBEventRecord{}, fmt.Errorf("%w stream record: %v", schema.ErrInvalid, err)
	}
	return r, nil
}

// Item converts an image of a stream record (Lambda's attribute values) to the SDK's
// item type, which the codec reads. It never panics: a value whose type it cannot
// tell is an error.
func Item(img map[string]events.DynamoDBAttributeValue) (codec.Item, error) {
	if img == nil {
		return nil, nil
	}
	out := make(codec.Item, len(img))
	for k, v := range img {
		av, err := attr(v)
		if err != nil {
			return nil, fmt.Errorf("%w attribute %s: %v", schema.ErrInvalid, k, err)
		}
		out[k] = av
	}
	return out, nil
}

func attr(v events.DynamoDBAttributeValue) (types.AttributeValue, error) {
	switch v.DataType() {
	case events.DataTypeString:
		return &types.AttributeValueMemberS{Value: v.String()}, nil
	case events.DataTypeNumber:
		return &types.AttributeValueMemberN{Value: v.Number()}, nil
	case events.DataTypeBoolean:
		return &types.AttributeValueMemberBOOL{Value: v.Boolean()}, nil
	case events.DataTypeNull:
		return &types.AttributeValueMemberNULL{Value: true}, nil
	case events.DataTypeBinary:
		return &types.AttributeValueMemberB{Value: v.Binary()}, nil
	case events.DataTypeStringSet:
		return &types.AttributeValueMemberSS{Value: v.StringSet()}, nil
	case events.DataTypeNumberSet:
		return &types.AttributeValueMemberNS{Value: v.NumberSet()}, nil
	case events.DataTypeBinarySet:
		return &types.AttributeValueMemberBS{Value: v.BinarySet()}, nil
	case events.DataTypeList:
		var l []types.AttributeValue
		for _, e := range v.List() {
			av, err := attr(e)
			if err != nil {
				return nil, err
			}
			l = append(l, av)
		}
		return &types.AttributeValueMemberL{Value: l}, nil
	case events.DataTypeMap:
		m := make(map[string]types.AttributeValue, len(v.Map()))
		for k, e := range v.Map() {
			av, err := attr(e)
			if err != nil {
				return nil, err
			}
			m[k] = av
		}
		return &types.AttributeValueMemberM{Value: m}, nil
	}
	return nil, fmt.Errorf("unknown type %d", v.DataType())
}
