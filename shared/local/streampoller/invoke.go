package streampoller

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/aws/aws-lambda-go/events"
)

// Invoke adapts a function that invokes the reconciler with a raw event (such as the
// Lambda runtime emulator running the real binary) into a Handler: the batch goes
// out as the JSON Lambda would send, and the reply is read as the
// events.DynamoDBEventResponse Lambda would read.
func Invoke(invoke func(ctx context.Context, event []byte) ([]byte, error)) Handler {
	return func(ctx context.Context, ev events.DynamoDBEvent) (events.DynamoDBEventResponse, error) {
		b, err := json.Marshal(ev)
		if err != nil {
			return events.DynamoDBEventResponse{}, fmt.Errorf("encode stream batch: %w", err)
		}
		out, err := invoke(ctx, b)
		if err != nil {
			return events.DynamoDBEventResponse{}, err
		}
		var resp events.DynamoDBEventResponse
		if len(out) > 0 && string(out) != "null" {
			if err := json.Unmarshal(out, &resp); err != nil {
				return events.DynamoDBEventResponse{}, fmt.Errorf("reconciler reply %.200q: %w", out, err)
			}
		}
		return resp, nil
	}
}
