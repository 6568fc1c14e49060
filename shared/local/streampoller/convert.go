package streampoller

import (
	"fmt"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	stypes "github.com/aws/aws-sdk-go-v2/service/dynamodbstreams/types"
	"github.com/sockfleet/sockfleet/functions/reconciler/records"
)

// Convert turns a record read with the dynamodbstreams SDK into the record Lambda
// would pass for it: eventID, eventName, eventVersion, eventSource, awsRegion (region
// when the record has none), eventSourceARN (streamARN), userIdentity, and the
// dynamodb part: Keys, NewImage, OldImage, SequenceNumber, SizeBytes, StreamViewType
// and ApproximateCreationDateTime.
func Convert(r stypes.Record, streamARN, region string) (events.DynamoDBEventRecord, error) {
	out := events.DynamoDBEventRecord{
		EventID:        aws.ToString(r.EventID),
		EventName:      string(r.EventName),
		EventVersion:   aws.ToString(r.EventVersion),
		EventSource:    aws.ToString(r.EventSource),
		AWSRegion:      aws.ToString(r.AwsRegion),
		EventSourceArn: streamARN,
	}
	if out.EventSource == "" {
		out.EventSource = records.EventSource
	}
	if out.AWSRegion == "" {
		out.AWSRegion = region
	}
	if r.UserIdentity != nil {
		out.UserIdentity = &events.DynamoDBUserIdentity{Type: aws.ToString(r.UserIdentity.Type), PrincipalID: aws.ToString(r.UserIdentity.PrincipalId)}
	}
	sr := r.Dynamodb
	if sr == nil {
		return out, fmt.Errorf("record %s: no dynamodb part", out.EventID)
	}
	var err error
	if out.Change.Keys, err = image(sr.Keys); err != nil {
		return out, fmt.Errorf("record %s keys: %w", out.EventID, err)
	}
	if out.Change.NewImage, err = image(sr.NewImage); err != nil {
		return out, fmt.Errorf("record %s new image: %w", out.EventID, err)
	}
	if out.Change.OldImage, err = image(sr.OldImage); err != nil {
		return out, fmt.Errorf("record %s old image: %w", out.EventID, err)
	}
	out.Change.SequenceNumber = aws.ToString(sr.SequenceNumber)
	out.Change.SizeBytes = aws.ToInt64(sr.SizeBytes)
	out.Change.StreamViewType = string(sr.StreamViewType)
	if sr.ApproximateCreationDateTime != nil {
		out.Change.ApproximateCreationDateTime = events.SecondsEpochTime{Time: *sr.ApproximateCreationDateTime}
	}
	return out, nil
}

func image(m map[string]stypes.AttributeValue) (map[string]events.DynamoDBAttributeValue, error) {
	if m == nil {
		return nil, nil
	}
	out := make(map[string]events.DynamoDBAttributeValue, len(m))
	for k, v := range m {
		a, err := attr(v)
		if err != nil {
			return nil, fmt.Errorf("attribute %s: %w", k, err)
		}
		out[k] = a
	}
	return out, nil
}

func attr(v stypes.AttributeValue) (events.DynamoDBAttributeValue, error) {
	switch v := v.(type) {
	case *stypes.AttributeValueMemberS:
		return events.NewStringAttribute(v.Value), nil
	case *stypes.AttributeValueMemberN:
		return events.NewNumberAttribute(v.Value), nil
	case *stypes.AttributeValueMemberB:
		return events.NewBinaryAttribute(v.Value), nil
	case *stypes.AttributeValueMemberBOOL:
		return events.NewBooleanAttribute(v.Value), nil
	case *stypes.AttributeValueMemberNULL:
		return events.NewNullAttribute(), nil
	case *stypes.AttributeValueMemberSS:
		return events.NewStringSetAttribute(v.Value), nil
	case *stypes.AttributeValueMemberNS:
		return events.NewNumberSetAttribute(v.Value), nil
	case *stypes.AttributeValueMemberBS:
		return events.NewBinarySetAttribute(v.Value), nil
	case *stypes.AttributeValueMemberL:
		l := make([]events.DynamoDBAttributeValue, len(v.Value))
		for i, e := range v.Value {
			a, err := attr(e)
			if err != nil {
				return events.DynamoDBAttributeValue{}, err
			}
			l[i] = a
		}
		return events.NewListAttribute(l), nil
	case *stypes.AttributeValueMemberM:
		m, err := image(v.Value)
		if err != nil {
			return events.DynamoDBAttributeValue{}, err
		}
		return events.NewMapAttribute(m), nil
	}
	return events.DynamoDBAttributeValue{}, fmt.Errorf("unsupported attribute type %T", v)
}
