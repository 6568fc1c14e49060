package records

import (
	"testing"

	"github.com/aws/aws-lambda-go/events"
	"github.com/sockfleet/sockfleet/shared/schema"
)

// A worker joining is its registry item inserted, or replaced by a new incarnation.
func TestJoined(t *testing.T) {
	wk := map[string]events.DynamoDBAttributeValue{schema.AttrPK: events.NewStringAttribute(schema.WorkerKey("w"))}
	img := func(inc string) map[string]events.DynamoDBAttributeValue {
		return map[string]events.DynamoDBAttributeValue{schema.AttrIncarnation: events.NewStringAttribute(inc)}
	}
	rec := func(event string, keys, old, new map[string]events.DynamoDBAttributeValue) events.DynamoDBEventRecord {
		return events.DynamoDBEventRecord{EventName: event, Change: events.DynamoDBStreamRecord{Keys: keys, OldImage: old, NewImage: new}}
	}
	conn := map[string]events.DynamoDBAttributeValue{schema.AttrPK: events.NewStringAttribute(schema.ConnKey("c"))}
	for name, tc := range map[string]struct {
		r    events.DynamoDBEventRecord
		want bool
	}{
		"insert":                {rec("INSERT", wk, nil, img("a")), true},
		"new incarnation":       {rec("MODIFY", wk, img("a"), img("b")), true},
		"renew":                 {rec("MODIFY", wk, img("a"), img("a")), false},
		"gone (no incarnation)": {rec("MODIFY", wk, img("a"), map[string]events.DynamoDBAttributeValue{}), false},
		"removed":               {rec("REMOVE", wk, img("a"), nil), false},
		"a connection":          {rec("INSERT", conn, nil, img("a")), false},
	} {
		if got := Joined(tc.r); got != tc.want {
			t.Errorf("%s: Joined = %v", name, got)
		}
	}
}
