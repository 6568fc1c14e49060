// Package filters holds the event filter patterns of the reconciler's DynamoDB event
// source, as data. The CDK stack renders them into the event source mapping and the
// local stream poller applies them (matched by shared/local/filtermatch), so
// production and local runs see the same records.
//
// What passes: INSERT and REMOVE of connection and worker items; a connection released while STARTED
// (lease_expires_at_ms = 0, or absent); any write whose new desired_state is not
// STARTED (a stop, or an operator's typo such as "started"); and every worker item
// change, membership renewals included: they are the reconciler's
// clock for detecting dead members (see docs/MEMBERSHIP.md), at O(workers)
// invocations, never O(connections).
// What never passes: connection checkpoints and polling-mode renews (an owned
// STARTED item whose last_seq or expiry moves), and any write to a connect-quota
// item (QUOTA#host: one per dial, docs/CONNECTIONS.md).
// A changed ws_url does not pass either: no pattern can compare old and new images,
// so the owner sees the new URL at its next checkpoint or backstop read.
package filters

import (
	"encoding/json"

	"github.com/sockfleet/sockfleet/shared/schema"
)

// Pattern is one Lambda event filter pattern.
type Pattern = map[string]any

func newImage(fields Pattern) Pattern {
	return Pattern{"eventName": []any{"MODIFY"}, "dynamodb": Pattern{"NewImage": fields}}
}

func s(v ...any) Pattern { return Pattern{"S": v} }

// Patterns are OR-ed: a record passes if any one matches.
var Patterns = []Pattern{
	// Created and deleted connections and workers, by key: a connect-quota item
	// (QUOTA#host) is created at a host's first dial and removed by TTL, and must
	// not cost an invocation. A positive list, with the prefix operator Lambda
	// documents (not anything-but-prefix, which Lambda's filtering lacks).
	{"eventName": []any{"INSERT", "REMOVE"}, "dynamodb": Pattern{"Keys": Pattern{
		schema.AttrPK: s(Pattern{"prefix": schema.ConnPrefix}, Pattern{"prefix": schema.WorkerPrefix}),
	}}},
	newImage(Pattern{
		schema.AttrDesiredState: s(string(schema.Started)),
		schema.AttrLeaseExpires: Pattern{"N": []any{"0"}},
	}),
	newImage(Pattern{
		schema.AttrDesiredState: s(string(schema.Started)),
		// exists looks at leaves only, and an attribute is {"N": "…"}: the type must be
		// named, or the pattern would match every STARTED item, heartbeats included.
		schema.AttrLeaseExpires: Pattern{"N": []any{Pattern{"exists": false}}},
	}),
	// Anything but STARTED: an owned connection turned STOPPED, and an operator's
	// unknown desired_state (a lowercase "started"), whose problem the reconciler
	// writes on the item or whose owner it wakes to stop it. One pattern for both:
	// Lambda allows five per event source by default. It also passes writes to
	// unowned STOPPED items (an operator's edit, the owner's release after a stop),
	// which the classifier ignores; no heartbeat or checkpoint is ever one of them.
	newImage(Pattern{
		schema.AttrDesiredState: s(Pattern{"anything-but": []any{string(schema.Started)}}),
	}),
	// Every worker item change: membership renewals drive dead-member detection
	// (docs/MEMBERSHIP.md). The fifth and last of Lambda's default five patterns.
	{"eventName": []any{"MODIFY"}, "dynamodb": Pattern{"Keys": Pattern{
		schema.AttrPK: s(Pattern{"prefix": schema.WorkerPrefix}),
	}}},
}

// JSON renders each pattern as the string Lambda expects in FilterCriteria.
func JSON() []string {
	out := make([]string, len(Patterns))
	for i, p := range Patterns {
		b, err := json.Marshal(p)
		if err != nil {
			panic(err) // static data; a failure here is a programming error caught by tests
		}
		out[i] = string(b)
	}
	return out
}
