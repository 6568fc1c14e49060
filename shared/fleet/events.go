package fleet

import (
	"encoding/json"
	"time"
)

// LocalAccount and LocalRegion are what local ARNs are made of.
const (
	LocalAccount = "000000000000"
	LocalRegion  = "us-east-1"
)

// ClusterARN is the ARN of a local "cluster".
func ClusterARN(name string) string {
	return "arn:aws:ecs:" + LocalRegion + ":" + LocalAccount + ":cluster/" + name
}

// TaskStoppedEvent is the EventBridge event ECS sends when a task stops, in the
// shape the reconciler receives in AWS. The worker id is the task id.
func TaskStoppedEvent(cluster, taskID, reason string, at time.Time) []byte {
	taskARN := "arn:aws:ecs:" + LocalRegion + ":" + LocalAccount + ":task/" + cluster + "/" + taskID
	ev := map[string]any{
		"version":     "0",
		"id":          "local-" + taskID,
		"detail-type": "ECS Task State Change",
		"source":      "aws.ecs",
		"account":     LocalAccount,
		"time":        at.UTC().Format(time.RFC3339),
		"region":      LocalRegion,
		"resources":   []string{taskARN},
		"detail": map[string]any{
			"clusterArn":    ClusterARN(cluster),
			"taskArn":       taskARN,
			"lastStatus":    "STOPPED",
			"desiredStatus": "STOPPED",
			"stoppedReason": reason,
			"stoppedAt":     at.UTC().Format(time.RFC3339Nano),
			"group":         "service:" + cluster,
		},
	}
	b, _ := json.Marshal(ev)
	return b
}
