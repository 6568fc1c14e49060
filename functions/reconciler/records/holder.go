package records

import (
	"github.com/aws/aws-lambda-go/events"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

// Holder returns the owner a connection record's new image names with an unreleased
// lease, or "". The reconciler checks such owners against the registry: a
// connection owned by a worker that is not a live member must not wait for anything
// but that worker's fence (see functions/reconciler/reaper).
func Holder(r events.DynamoDBEventRecord) string {
	if r.Change.NewImage == nil {
		return ""
	}
	it, err := Item(r.Change.NewImage)
	if err != nil {
		return ""
	}
	c, _ := codec.DecodeConnection(it) // the lease fields survive a bad operator field
	if c.ID == "" || !owned(c) {
		return ""
	}
	return c.LeaseOwner
}

// Joined reports whether a worker-item record is a worker joining: its item inserted,
// or replaced by a new incarnation (a restart under the same id). Rebalance rounds
// start from it (functions/reconciler/rounds).
func Joined(r events.DynamoDBEventRecord) bool {
	if _, ok := schema.WorkerID(Key(r)); !ok || r.Change.NewImage == nil {
		return false
	}
	if r.EventName == "INSERT" {
		return true
	}
	inc := func(img map[string]events.DynamoDBAttributeValue) string {
		v, ok := img[schema.AttrIncarnation]
		if !ok || v.DataType() != events.DataTypeString {
			return ""
		}
		return v.String()
	}
	n := inc(r.Change.NewImage)
	return n != "" && n != inc(r.Change.OldImage)
}
