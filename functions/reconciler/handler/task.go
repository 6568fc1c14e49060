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
	LastStatus    string // the task's
	DesiredStatus string // the task's
	StopCode      string
	StoppedReason string
	Containers    []Container
}

// Container is one entry of the event's containers.
type Container struct {
	Name       string
	LastStatus string
	ExitCode   *int // set once the container has exited
}

// WorkerGone reports whether the worker process of the task has exited, so its
// leases can be released at once, and why.
//
// It acts on the container, not the task. When the worker container (named
// schema.WorkerContainer in the task definition) exits, ECS reports that container
// as lastStatus STOPPED with an exitCode while the task itself is still
// DEACTIVATING, STOPPING or DEPROVISIONING, which can last tens of seconds: the
// process is gone, so a release cannot overlap it. A task whose desiredStatus is
// STOPPED but whose worker container still runs is draining (ECS sent it SIGTERM):
// it releases its own leases, and releasing them under it would let a second owner
// stream beside it. Another container's exit says nothing about the worker. A task
// at lastStatus STOPPED has no running containers, so it counts as gone whatever its
// containers list says.
func (e TaskEvent) WorkerGone() (bool, string) {
	if e.LastStatus == "STOPPED" {
		return true, "task stopped"
	}
	for _, c := range e.Containers {
		if c.Name == schema.WorkerContainer && c.LastStatus == "STOPPED" {
			return true, "worker container exited"
		}
	}
	return false, ""
}

// taskEnvelope is the EventBridge envelope and the fields of detail that matter.
type taskEnvelope struct {
	DetailType string `json:"detail-type"`
	Source     string `json:"source"`
	Detail     struct {
		ClusterARN    string `json:"clusterArn"`
		TaskARN       string `json:"taskArn"`
		LastStatus    string `json:"lastStatus"`
		DesiredStatus string `json:"desiredStatus"`
		StopCode      string `json:"stopCode"`
		StoppedReason string `json:"stoppedReason"`
		Containers    []struct {
			Name       string `json:"name"`
			LastStatus string `json:"lastStatus"`
			ExitCode   *int   `json:"exitCode"`
		} `json:"containers"`
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
	ev := TaskEvent{
		ClusterARN: d.ClusterARN, TaskARN: d.TaskARN, WorkerID: id, LastStatus: d.LastStatus,
		DesiredStatus: d.DesiredStatus, StopCode: d.StopCode, StoppedReason: d.StoppedReason,
	}
	for _, c := range d.Containers {
		ev.Containers = append(ev.Containers, Container{Name: c.Name, LastStatus: c.LastStatus, ExitCode: c.ExitCode})
	}
	return ev, nil
}
