package handler

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/sockfleet/sockfleet/functions/reconciler/sweep"
	"github.com/sockfleet/sockfleet/shared/local/fleet"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/shared/wakeup"
)

const cluster = "arn:aws:ecs:eu-west-1:111122223333:cluster/sockfleet"

var now = time.UnixMilli(1_764_680_000_000)

// Strict fakes: any call the test did not arrange fails it.

type fakeRegistry struct {
	t       *testing.T
	workers []codec.Worker
	listErr error
	deletes []string
	allowDe bool
}

func (f *fakeRegistry) List(context.Context) ([]codec.Worker, []error, error) {
	return f.workers, nil, f.listErr
}

func (f *fakeRegistry) Gone(_ context.Context, id string, _ time.Time) error {
	if !f.allowDe {
		f.t.Errorf("unexpected registry delete of %s", id)
	}
	f.deletes = append(f.deletes, id)
	return nil
}

type fakeLeases struct {
	t      *testing.T
	allow  bool
	calls  []string
	err    error
	marked []string // MarkUnheld calls, id@version
}

func (f *fakeLeases) ReleaseAllOwnedBy(_ context.Context, worker string) ([]string, error) {
	if !f.allow {
		f.t.Errorf("unexpected release of %s's leases", worker)
	}
	f.calls = append(f.calls, worker)
	return []string{"c1", "c2"}, f.err
}

func (f *fakeLeases) ReleaseAllOwnedByAfter(ctx context.Context, worker string, _ time.Duration) ([]string, error) {
	return f.ReleaseAllOwnedBy(ctx, worker)
}

func (f *fakeLeases) MarkUnheld(_ context.Context, id string, version int64, _ time.Time) error {
	f.marked = append(f.marked, fmt.Sprintf("%s@%d", id, version))
	return nil
}

func (f *fakeLeases) ReleaseStale(_ context.Context, id, owner string, version, holderVersion int64) error {
	if !f.allow {
		f.t.Errorf("unexpected release of the stale lease of %s", id)
	}
	f.calls = append(f.calls, fmt.Sprintf("stale %s %s@%d over %d", id, owner, version, holderVersion))
	return f.err
}

func (f *fakeLeases) ReportInvalid(_ context.Context, id, problem string) error {
	if !f.allow {
		f.t.Errorf("unexpected report on %s", id)
	}
	f.calls = append(f.calls, "invalid "+id+": "+problem)
	return f.err
}

type fakeSweeper struct {
	t      *testing.T
	allow  bool
	report sweep.Report
	runs   int
}

func (f *fakeSweeper) Run(context.Context, time.Time) (sweep.Report, error) {
	if !f.allow {
		f.t.Error("unexpected sweep")
	}
	f.runs++
	return f.report, nil
}

type fakeSender struct {
	t     *testing.T
	mu    sync.Mutex
	by    map[string]wakeup.Result
	down  map[string]bool // addresses that do not answer
	calls map[string][]wakeup.Conn
}

func (f *fakeSender) Send(_ context.Context, addr string, req wakeup.Request) (wakeup.Response, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down[addr] {
		return wakeup.Response{}, errors.New("connection refused")
	}
	r, ok := f.by[addr]
	if !ok {
		f.t.Errorf("unexpected wakeup to %s: %+v", addr, req)
		return wakeup.Response{}, errors.New("unexpected")
	}
	f.calls[addr] = append(f.calls[addr], req.Conns...)
	var out wakeup.Response
	for _, c := range req.Conns {
		out.Results = append(out.Results, wakeup.ConnResult{ID: c.ID, Result: r})
	}
	return out, nil
}

type rig struct {
	h       *Handler
	reg     *fakeRegistry
	leases  *fakeLeases
	sweeper *fakeSweeper
	sender  *fakeSender
	metrics *bytes.Buffer
}

func newRig(t *testing.T, workers ...codec.Worker) *rig {
	r := &rig{
		reg:     &fakeRegistry{t: t, workers: workers},
		leases:  &fakeLeases{t: t},
		sweeper: &fakeSweeper{t: t},
		sender:  &fakeSender{t: t, by: map[string]wakeup.Result{}, calls: map[string][]wakeup.Conn{}},
		metrics: &bytes.Buffer{},
	}
	h, err := New(Config{ClusterARN: cluster}, Deps{Registry: r.reg, Leases: r.leases, Sweeper: r.sweeper, Sender: r.sender,
		Now: func() time.Time { return now }, Metrics: r.metrics})
	if err != nil {
		t.Fatal(err)
	}
	r.h = h
	return r
}

func worker(id string, load int) codec.Worker {
	return codec.Worker{ID: id, Addr: id + ":8080", Capacity: 10, Load: load, HeartbeatExpiresAtMs: now.Add(time.Minute).UnixMilli()}
}

func fixture(t *testing.T, name string) json.RawMessage {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// metric returns the value of name in the EMF lines written so far.
func (r *rig) metric(t *testing.T, name string) (float64, bool) {
	t.Helper()
	for _, line := range strings.Split(strings.TrimSpace(r.metrics.String()), "\n") {
		var m map[string]any
		if line == "" || json.Unmarshal([]byte(line), &m) != nil {
			continue
		}
		if _, ok := m["_aws"]; !ok {
			t.Errorf("metric line without _aws: %s", line)
		}
		if v, ok := m[name].(float64); ok {
			return v, true
		}
	}
	return 0, false
}

func TestStreamBatch(t *testing.T) {
	r := newRig(t, worker("w1", 5), worker("w2", 1))
	r.sender.by["w2:8080"] = wakeup.Acquired                                        // least loaded: gets the new connection
	r.sender.by["w1:8080"] = wakeup.AlreadyOwned                                    // owner of the removed one
	r.reg.workers = append(r.reg.workers, codec.Worker{ID: "dead", Addr: "dead:1"}) // lapsed: never called
	out, err := r.h.Handle(context.Background(), fixture(t, "stream_batch.json"))
	if err != nil {
		t.Fatal(err)
	}
	resp, ok := out.(events.DynamoDBEventResponse)
	if !ok || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("response %#v, want no failures", out)
	}
	if got := r.sender.calls["w2:8080"]; len(got) != 1 || got[0] != (wakeup.Conn{ID: "new", Reason: wakeup.NeedsOwner}) {
		t.Errorf("w2 got %+v", got)
	}
	// w1 owns "gone" (removed) and "c1", whose desired_state an operator set to
	// RUNNING: both are checks, so w1 stops them and says why.
	got := r.sender.calls["w1:8080"]
	sort.Slice(got, func(i, j int) bool { return got[i].ID < got[j].ID })
	want := []wakeup.Conn{{ID: "c1", LeaseVersion: 3, Reason: wakeup.Check}, {ID: "gone", LeaseVersion: 3, Reason: wakeup.Check}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("w1 got %+v, want %+v", got, want)
	}
	if v, ok := r.metric(t, schema.MetricWakeupsUndelivered); !ok || v != 0 {
		t.Errorf("undelivered metric %v %v", v, ok)
	}
}

func TestStreamReportsOnlyUndeliverable(t *testing.T) {
	r := newRig(t) // no workers at all
	out, err := r.h.Handle(context.Background(), fixture(t, "stream_batch.json"))
	if err != nil {
		t.Fatal(err)
	}
	resp := out.(events.DynamoDBEventResponse)
	// "new" needs an owner and nobody can take it; "gone"'s owner is not live, so
	// there is nobody to tell. Ignored and malformed records are never reported.
	if len(resp.BatchItemFailures) != 1 || resp.BatchItemFailures[0].ItemIdentifier != "40000000000000001001" {
		t.Errorf("failures %+v", resp.BatchItemFailures)
	}
	if v, _ := r.metric(t, schema.MetricWakeupsUndelivered); v != 1 {
		t.Errorf("undelivered metric %v", v)
	}
}

func TestStreamRegistryDown(t *testing.T) {
	r := newRig(t)
	r.reg.listErr = errors.New("throttled")
	out, err := r.h.Handle(context.Background(), fixture(t, "stream_batch.json"))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(out.(events.DynamoDBEventResponse).BatchItemFailures); n != 3 {
		t.Errorf("%d failures, want the three actionable records", n)
	}
}

func TestStreamLaterRecordSupersedes(t *testing.T) {
	var batch events.DynamoDBEvent
	for _, name := range []string{"insert_started", "stopped_owned", "stopped_renewed"} {
		raw, err := os.ReadFile(filepath.Join("..", "records", "testdata", name+".json"))
		if err != nil {
			t.Fatal(err)
		}
		var ev events.DynamoDBEvent
		if err := json.Unmarshal(raw, &ev); err != nil {
			t.Fatal(err)
		}
		batch.Records = append(batch.Records, ev.Records...)
	}
	r := newRig(t, worker("w1", 5), worker("w2", 0))
	r.sender.by["w1:8080"] = wakeup.AlreadyOwned
	resp, err := r.h.HandleStream(context.Background(), batch)
	if err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("%+v %v", resp, err)
	}
	// c1 was inserted, then stopped while owned by w1: only w1 is told, to check.
	if got := r.sender.calls["w1:8080"]; len(got) != 1 || got[0].Reason != wakeup.Check {
		t.Errorf("w1 got %+v", got)
	}
}

func TestTaskEvents(t *testing.T) {
	// Release when the worker container has exited, whatever the task's own state;
	// never while it runs, even if the task is asked to stop (it is draining).
	cases := []struct {
		file    string
		release bool
	}{
		{"ecs_task_crash_deactivating.json", true}, // worker container STOPPED (137), task DEACTIVATING
		{"ecs_task_deprovisioning.json", true},     // worker container STOPPED, task DEPROVISIONING
		{"ecs_task_stopped.json", true},            // task STOPPED
		{"ecs_task_draining.json", false},          // desiredStatus STOPPED, task STOPPING, worker RUNNING: draining
		{"ecs_task_stop_requested.json", false},    // desiredStatus STOPPED, task DEACTIVATING, worker RUNNING
		{"ecs_task_sidecar_exited.json", false},    // another container exited; the worker runs on
		{"ecs_task_other_cluster.json", false},
	}
	for _, tc := range cases {
		t.Run(tc.file, func(t *testing.T) {
			r := newRig(t)
			r.leases.allow, r.reg.allowDe = tc.release, tc.release
			out, err := r.h.Handle(context.Background(), fixture(t, tc.file))
			if err != nil || out != nil {
				t.Fatalf("%v %v", out, err)
			}
			if tc.release {
				const id = "a1b2c3d4e5f60718293a4b5c6d7e8f90"
				if len(r.leases.calls) != 1 || r.leases.calls[0] != id || len(r.reg.deletes) != 1 || r.reg.deletes[0] != id {
					t.Errorf("released %v, deleted %v", r.leases.calls, r.reg.deletes)
				}
				// A duplicate (or late) event is harmless: the same conditional releases.
				if _, err := r.h.Handle(context.Background(), fixture(t, tc.file)); err != nil {
					t.Error(err)
				}
			}
		})
	}
	t.Run("release fails", func(t *testing.T) {
		r := newRig(t)
		r.leases.allow, r.reg.allowDe = true, true
		r.leases.err = errors.New("throttled")
		if _, err := r.h.Handle(context.Background(), fixture(t, "ecs_task_stopped.json")); err == nil {
			t.Error("want an error, so EventBridge retries")
		}
	})
}

func TestSweepEvents(t *testing.T) {
	for _, file := range []string{"sweep.json", "scheduled_event.json"} {
		r := newRig(t)
		r.sweeper.allow = true
		r.sweeper.report = sweep.Report{Pages: 3, Scanned: 100, Complete: true, Orphaned: 4, OldestOrphan: 90 * time.Second}
		if _, err := r.h.Handle(context.Background(), fixture(t, file)); err != nil {
			t.Fatal(err)
		}
		if r.sweeper.runs != 1 {
			t.Errorf("%s: %d sweeps", file, r.sweeper.runs)
		}
		if v, _ := r.metric(t, schema.MetricOrphaned); v != 4 {
			t.Errorf("%s: orphaned metric %v", file, v)
		}
		if v, _ := r.metric(t, schema.MetricOrphanedOldest); v != 90 {
			t.Errorf("%s: oldest metric %v", file, v)
		}
	}
}

func TestUnknownEvent(t *testing.T) {
	r := newRig(t)
	for _, raw := range []string{`{}`, `{"Records":[{"eventSource":"aws:sqs"}]}`, `[1]`, `nope`, `{"detail-type":"EC2 Instance State-change Notification"}`} {
		if _, err := r.h.Handle(context.Background(), json.RawMessage(raw)); !errors.Is(err, ErrUnknownEvent) {
			t.Errorf("%s: %v", raw, err)
		}
	}
}

func TestDecodeTaskEventGolden(t *testing.T) {
	ev, err := DecodeTaskEvent(fixture(t, "ecs_task_stopped.json"))
	if err != nil {
		t.Fatal(err)
	}
	exit := 137
	want := TaskEvent{ClusterARN: cluster, TaskARN: "arn:aws:ecs:eu-west-1:111122223333:task/sockfleet/a1b2c3d4e5f60718293a4b5c6d7e8f90",
		WorkerID: "a1b2c3d4e5f60718293a4b5c6d7e8f90", LastStatus: "STOPPED", DesiredStatus: "STOPPED",
		StopCode: "EssentialContainerExited", StoppedReason: "Essential container in task exited",
		Containers: []Container{{Name: schema.WorkerContainer, LastStatus: "STOPPED", ExitCode: &exit}}}
	if !reflect.DeepEqual(ev, want) {
		t.Errorf("got %+v\nwant %+v", ev, want)
	}
	// The events the local supervisor plays decode the same way, and say the worker is gone.
	for name, raw := range map[string][]byte{
		"task stopped":  fleet.TaskStoppedEvent("local", "worker-2", "exited", now),
		"worker exited": fleet.WorkerExitedEvent("local", "worker-2", 137, "exited", now),
	} {
		local, err := DecodeTaskEvent(raw)
		gone, _ := local.WorkerGone()
		if err != nil || local.WorkerID != "worker-2" || local.ClusterARN != fleet.ClusterARN("local") || !gone {
			t.Errorf("local %s event %+v, %v", name, local, err)
		}
	}
	if ev, _ := DecodeTaskEvent(fleet.WorkerExitedEvent("local", "w", 2, "exited", now)); ev.LastStatus == "STOPPED" ||
		len(ev.Containers) != 1 || ev.Containers[0].ExitCode == nil || *ev.Containers[0].ExitCode != 2 {
		t.Errorf("the worker-exited event should show the container stopped before the task: %+v", ev)
	}
	for _, bad := range []string{
		`{"detail-type":"ECS Task State Change","detail":{"clusterArn":"c","lastStatus":"STOPPED","taskArn":"arn:aws:ecs:r:a:task/c/"}}`,
		`{"detail-type":"ECS Task State Change","detail":{"clusterArn":"c","lastStatus":"STOPPED","taskArn":"arn:aws:ecs:r:a:task/c/a#b"}}`,
		`{"detail-type":"ECS Task State Change","detail":{"clusterArn":"c","lastStatus":"STOPPED","taskArn":"not-an-arn"}}`,
		`{"detail-type":"ECS Task State Change","detail":{"lastStatus":"STOPPED","taskArn":"arn:aws:ecs:r:a:task/c/t"}}`,
		`{"detail-type":"Other","detail":{"clusterArn":"c","lastStatus":"STOPPED","taskArn":"arn:aws:ecs:r:a:task/c/t"}}`,
		`{"detail-type":"ECS Task State Change","detail":"x"}`,
	} {
		if _, err := DecodeTaskEvent([]byte(bad)); !errors.Is(err, schema.ErrInvalid) {
			t.Errorf("%s: %v", bad, err)
		}
	}
}

func FuzzDecodeTaskEvent(f *testing.F) {
	for _, name := range []string{"ecs_task_stopped.json", "ecs_task_deprovisioning.json", "ecs_task_sidecar_exited.json", "scheduled_event.json", "sweep.json"} {
		b, _ := os.ReadFile(filepath.Join("testdata", name))
		f.Add(b)
	}
	f.Add(fleet.TaskStoppedEvent("local", "w", "x", now))
	f.Fuzz(func(t *testing.T, raw []byte) {
		ev, err := DecodeTaskEvent(raw)
		if err != nil {
			return
		}
		if schema.ValidateID(ev.WorkerID) != nil || !strings.HasSuffix(ev.TaskARN, "/"+ev.WorkerID) || ev.ClusterARN == "" {
			t.Fatalf("accepted %+v", ev)
		}
	})
}

func FuzzHandle(f *testing.F) {
	for _, name := range []string{"stream_batch.json", "ecs_task_other_cluster.json", "ecs_task_draining.json"} {
		b, _ := os.ReadFile(filepath.Join("testdata", name))
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		r := newRig(t) // no workers, strict fakes: nothing may be released or swept
		if bytes.Contains(raw, []byte("sockfleet")) || bytes.Contains(raw, []byte("Scheduled Event")) ||
			bytes.Contains(raw, []byte(TaskStateChange)) {
			return // those kinds act; the point here is that no input panics the dispatch
		}
		_, _ = r.h.Handle(context.Background(), raw)
	})
}

// The stack's schedule sends {SweepInputKey: SweepInputValue}; the dispatch must
// recognise exactly that object.
func TestSweepInputMatchesSchema(t *testing.T) {
	b, _ := json.Marshal(map[string]string{schema.SweepInputKey: schema.SweepInputValue})
	if !bytes.Equal(bytes.TrimSpace(fixture(t, "sweep.json")), b) {
		t.Fatalf("testdata/sweep.json is not %s", b)
	}
	var s shape
	if err := json.Unmarshal(b, &s); err != nil || s.Sockfleet != schema.SweepInputValue {
		t.Fatalf("the dispatch does not read %s (key %q): %+v", b, schema.SweepInputKey, s)
	}
}
