package handler

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/sockfleet/sockfleet/shared/schema"
)

// TaskStateChange is the detail-type of ECS task events on EventBridge.
const TaskStateChange = "ECS Task State Change"

// TaskEvent is the part of an ECS Task State Change the reconciler uses.
type TaskEvent struct {
	ClusterARN    string
	TaskARN       string
	WorkerID      string // the task id: the last path segment of the task ARN
	LastStatus    string
	StoppedReason string
}

// taskEnvelope is the EventBridge envelope and the fields of detail that matter.
type taskEnvelope struct {
	DetailType string `json:"detail-type"`
	Source     string `json:"source"`
	Detail     struct {
		ClusterARN    string `json:"clusterArn"`
		TaskARN       string `json:"taskArn"`
		LastStatus    string `json:"lastStatus"`
		StoppedReason string `json:"stoppedReason"`
	} `json:"detail"`
}

// DecodeTaskEvent parses an ECS Task State Change event. It checks the envelope and
// derives the worker id from the task ARN, which has the form
// arn:aws:ecs:REGION:ACCOUNT:task/CLUSTER/TASK_ID (or, in the old format, task/TASK_ID).
func DecodeTaskEvent(raw []byte) (TaskEvent, error) {
	var env taskEnvelope
	if err := json.Unmarshal(raw, &env); err != nil {
		return TaskEvent{}, fmt.Errorf("%w task event: %v", schema.ErrInvalid, err)
	}
	if env.DetailType != TaskStateChange {
		return TaskEvent{}, fmt.Errorf("%w task event: detail-type %q", schema.ErrInvalid, env.DetailType)
	}
	d := env.Detail
	if !strings.HasPrefix(d.TaskARN, "arn:") || !strings.Contains(d.TaskARN, ":task/") {
		return TaskEvent{}, fmt.Errorf("%w task event: task ARN %.200q", schema.ErrInvalid, d.TaskARN)
	}
	id := d.TaskARN[strings.LastIndexByte(d.TaskARN, '/')+1:]
	if err := schema.ValidateID(id); err != nil {
		return TaskEvent{}, fmt.Errorf("task event: worker id from task ARN: %w", err)
	}
	if d.ClusterARN == "" || d.LastStatus == "" {
		return TaskEvent{}, fmt.Errorf("%w task event %s: clusterArn or lastStatus missing", schema.ErrInvalid, id)
	}
	return TaskEvent{ClusterARN: d.ClusterARN, TaskARN: d.TaskARN, WorkerID: id, LastStatus: d.LastStatus, StoppedReason: d.StoppedReason}, nil
}
