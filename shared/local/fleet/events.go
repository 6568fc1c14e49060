package fleet

import (
	"encoding/json"
	"errors"
	"os/exec"
	"syscall"
	"time"

	"github.com/sockfleet/sockfleet/shared/schema"
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

// TaskStoppedEvent is the EventBridge event ECS sends when a task has reached
// lastStatus STOPPED (the last of a stopping task's events), in the shape the
// reconciler receives in AWS. The worker id is the task id.
func TaskStoppedEvent(cluster, taskID, reason string, at time.Time) []byte {
	return taskEvent(cluster, taskID, "STOPPED", reason, nil, at)
}

// WorkerExitedEvent is the event ECS sends first when a task's worker container
// exits on its own (a crash, a kill): the container is STOPPED with its exit code,
// while the task is still DEPROVISIONING. The local supervisor sends this one when a
// worker process exits, so the local fleet fails over on the container's exit, as
// the reconciler does in AWS.
func WorkerExitedEvent(cluster, taskID string, exitCode int, reason string, at time.Time) []byte {
	return taskEvent(cluster, taskID, "DEPROVISIONING", reason, &exitCode, at)
}

// ExitCode is the exit code ECS would report for a process that ended with err (the
// result of exec.Cmd.Wait): its status, or 128+signal for one killed by a signal.
func ExitCode(err error) int {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return 0
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ee.ExitCode()
}

func taskEvent(cluster, taskID, lastStatus, reason string, exitCode *int, at time.Time) []byte {
	taskARN := "arn:aws:ecs:" + LocalRegion + ":" + LocalAccount + ":task/" + cluster + "/" + taskID
	container := map[string]any{
		"containerArn": "arn:aws:ecs:" + LocalRegion + ":" + LocalAccount + ":container/" + cluster + "/" + taskID + "/" + schema.WorkerContainer,
		"lastStatus":   "STOPPED",
		"name":         schema.WorkerContainer,
		"taskArn":      taskARN,
	}
	if exitCode != nil {
		container["exitCode"] = *exitCode
	}
	detail := map[string]any{
		"clusterArn":         ClusterARN(cluster),
		"taskArn":            taskARN,
		"containers":         []any{container},
		"lastStatus":         lastStatus,
		"desiredStatus":      "STOPPED",
		"stopCode":           "EssentialContainerExited",
		"stoppedReason":      reason,
		"executionStoppedAt": at.UTC().Format(time.RFC3339Nano),
		"group":              "service:" + cluster,
		"launchType":         "FARGATE",
	}
	if lastStatus == "STOPPED" {
		detail["stoppedAt"] = at.UTC().Format(time.RFC3339Nano)
	}
	ev := map[string]any{
		"version":     "0",
		"id":          "local-" + taskID + "-" + lastStatus,
		"detail-type": "ECS Task State Change",
		"source":      "aws.ecs",
		"account":     LocalAccount,
		"time":        at.UTC().Format(time.RFC3339),
		"region":      LocalRegion,
		"resources":   []string{taskARN},
		"detail":      detail,
	}
	b, _ := json.Marshal(ev)
	return b
}
