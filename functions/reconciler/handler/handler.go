// Package handler is the reconciler: one function that takes three kinds of event,
// told apart by the shape of their JSON.
//
//   - A DynamoDB stream batch ({"Records": [{"eventSource": "aws:dynamodb", …}]}):
//     each record is classified (functions/reconciler/records) and the workers that
//     must act are woken; an unusable item's problem is written on the item, and a
//     lease nobody may run (a stale image, an inserted item naming an owner, an
//     expiry deleted under an owner) is released once the worker asked about it
//     answered that it does not hold it, or is not a live member.
//     The answer lists, by SequenceNumber, only the records that still need action
//     and could not be delivered anywhere; a record that will not decode is logged
//     with its key and skipped, never retried.
//   - An ECS Task State Change from EventBridge ("detail-type": "ECS Task State
//     Change") from the configured cluster that says the worker process is gone: its
//     worker container is STOPPED (the task may still be DEACTIVATING, STOPPING or
//     DEPROVISIONING), or the task is. A task merely asked to stop (desiredStatus
//     STOPPED) is draining and left alone (TaskEvent.WorkerGone). The task id is the
//     worker id; its leases are released (conditioned on owner and version) and its
//     registry item deleted. The releases then reach the workers through the stream.
//     Duplicate and late events are harmless: task ids are never reused, and releasing
//     what is already released does nothing.
//   - The scheduled sweep: {"sockfleet": "sweep"} (the input the stack's schedule rule
//     sends), or EventBridge's own scheduled-event shape ("detail-type": "Scheduled
//     Event"). See functions/reconciler/sweep.
//
// The same Handler serves Lambda (functions/reconciler) and the local stack, which
// feeds it stream batches from shared/local/streampoller and task events from its
// supervisor.
package handler

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/sockfleet/sockfleet/functions/reconciler/dispatch"
	"github.com/sockfleet/sockfleet/functions/reconciler/reaper"
	"github.com/sockfleet/sockfleet/functions/reconciler/records"
	"github.com/sockfleet/sockfleet/functions/reconciler/rounds"
	"github.com/sockfleet/sockfleet/functions/reconciler/sweep"
	"github.com/sockfleet/sockfleet/shared/emf"
	"github.com/sockfleet/sockfleet/shared/lease"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/shared/tracing"
	"github.com/sockfleet/sockfleet/shared/wakeup"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// Registry is the worker registry (*registry.Registry).
type Registry interface {
	List(ctx context.Context) ([]codec.Worker, []error, error)
	// Gone marks a worker whose process exited as dead, so that anything still
	// naming it is released at once (see functions/reconciler/reaper).
	Gone(ctx context.Context, id string, now time.Time) error
}

// Leases releases a dead worker's leases and repairs operator edits (*lease.Store).
type Leases interface {
	ReleaseAllOwnedBy(ctx context.Context, worker string) ([]string, error)
	ReleaseStale(ctx context.Context, id, owner string, version, holderVersion int64) error
	MarkUnheld(ctx context.Context, id string, version int64, now time.Time) error
	ReportInvalid(ctx context.Context, id, problem string) error
}

// Sweeper runs the backstop sweep (*sweep.Sweeper).
type Sweeper interface {
	Run(ctx context.Context, now time.Time) (sweep.Report, error)
}

// Config configures a Handler.
type Config struct {
	// ClusterARN: task events from any other cluster are ignored. Required.
	ClusterARN string
	// WakeupTimeout bounds each wakeup request. Default dispatch.DefaultWakeupTimeout.
	WakeupTimeout time.Duration
}

// Validate checks c and fills defaults.
func (c *Config) Validate() error {
	if c.ClusterARN == "" {
		return errors.New("reconciler config: cluster ARN is empty")
	}
	if c.WakeupTimeout == 0 {
		c.WakeupTimeout = dispatch.DefaultWakeupTimeout
	}
	if c.WakeupTimeout < 0 {
		return fmt.Errorf("reconciler config: wakeup timeout %s", c.WakeupTimeout)
	}
	return nil
}

// Deps are the Handler's collaborators.
type Deps struct {
	Registry Registry
	Leases   Leases
	Sweeper  Sweeper
	Sender   dispatch.Sender
	Log      *slog.Logger
	Now      func() time.Time // default time.Now
	Metrics  io.Writer        // EMF lines; default: discarded
	// Members, if set, runs the membership protocol's dead-member detection: on a
	// worker heartbeat record (at most once per Members.Every), for owners that
	// stream records or the sweep show are not live members, and at each sweep.
	Members *reaper.Reaper
	// Rounds, if set, runs rebalance rounds: checked on worker-item records (a join,
	// a renew carrying its load) at most once per its CheckEvery, and at each sweep.
	Rounds *rounds.Rounds
}

// Handler handles reconciler events.
type Handler struct {
	cfg      Config
	d        Deps
	delivery dispatch.Delivery
}

// New returns a Handler.
func New(cfg Config, d Deps) (*Handler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if d.Registry == nil || d.Leases == nil || d.Sweeper == nil || d.Sender == nil {
		return nil, errors.New("reconciler: registry, leases, sweeper and sender are required")
	}
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.Metrics == nil {
		d.Metrics = io.Discard
	}
	return &Handler{cfg: cfg, d: d, delivery: dispatch.Delivery{
		Sender: d.Sender, Timeout: cfg.WakeupTimeout, Log: d.Log,
		Recent: &dispatch.Recent{}, // lives as long as the warm process: spreads bursts across invocations
	}}, nil
}

// ErrUnknownEvent: the payload is none of the three kinds.
var ErrUnknownEvent = errors.New("reconciler: unknown event")

// shape is just enough of any payload to tell the three kinds apart.
type shape struct {
	Records []struct {
		EventSource string `json:"eventSource"`
	} `json:"Records"`
	DetailType string `json:"detail-type"`
	Source     string `json:"source"`
	Sockfleet  string `json:"sockfleet"` // schema.SweepInputKey
}

// Handle is the Lambda entry point: it dispatches on the payload's shape. A stream
// batch returns events.DynamoDBEventResponse; the other kinds return nil.
func (h *Handler) Handle(ctx context.Context, raw json.RawMessage) (any, error) {
	var s shape
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnknownEvent, err)
	}
	switch {
	case len(s.Records) > 0 && s.Records[0].EventSource == records.EventSource:
		return h.handleRawStream(ctx, raw)
	case s.DetailType == TaskStateChange:
		ev, err := DecodeTaskEvent(raw)
		if err != nil {
			// Retrying cannot fix it: log and drop.
			h.d.Log.ErrorContext(ctx, "task event will not decode; dropped", "err", err)
			return nil, nil
		}
		return nil, h.HandleTask(ctx, ev)
	case s.Sockfleet == schema.SweepInputValue || (s.DetailType == "Scheduled Event" && s.Source == "aws.events"):
		_, err := h.Sweep(ctx)
		return nil, err
	}
	return nil, fmt.Errorf("%w: %.200s", ErrUnknownEvent, bytes.TrimSpace(raw))
}

// handleRawStream decodes records one at a time, so one that will not decode is
// skipped rather than failing the batch (Lambda would retry it forever).
func (h *Handler) handleRawStream(ctx context.Context, raw json.RawMessage) (events.DynamoDBEventResponse, error) {
	var batch struct {
		Records []json.RawMessage `json:"Records"`
	}
	if err := json.Unmarshal(raw, &batch); err != nil {
		return events.DynamoDBEventResponse{}, fmt.Errorf("stream batch: %w", err)
	}
	var ev events.DynamoDBEvent
	for i, rr := range batch.Records {
		r, err := records.DecodeRecord(rr)
		if err != nil {
			var peek struct {
				Dynamodb struct {
					Keys           json.RawMessage `json:"Keys"`
					SequenceNumber string          `json:"SequenceNumber"`
				} `json:"dynamodb"`
			}
			_ = json.Unmarshal(rr, &peek)
			h.d.Log.ErrorContext(ctx, "stream record will not decode; skipped", "index", i,
				"keys", string(peek.Dynamodb.Keys), "seq", peek.Dynamodb.SequenceNumber, "err", err)
			continue
		}
		ev.Records = append(ev.Records, r)
	}
	return h.HandleStream(ctx, ev)
}

// pending is the latest actionable decision about one id in a batch.
type pending struct {
	d   records.Decision
	seq string
}

// HandleStream handles one stream batch.
func (h *Handler) HandleStream(ctx context.Context, ev events.DynamoDBEvent) (events.DynamoDBEventResponse, error) {
	// The batch's span is started (back-dated) at its first actionable connection
	// record: a batch of heartbeats, every renew interval, makes none. What the reaper
	// or a rebalance round does on a heartbeat starts spans of its own when it acts.
	t0 := time.Now()
	bctx, batch := ctx, trace.Span(nil)
	traced := func() context.Context {
		if batch == nil {
			bctx, batch = tracer.Start(ctx, "reconcile.batch", trace.WithTimestamp(t0), trace.WithAttributes(
				attribute.String("sockfleet.event", "stream"), attribute.Int("sockfleet.records", len(ev.Records))))
		}
		return bctx
	}
	defer func() {
		if batch != nil {
			batch.End()
		}
	}()
	log := h.d.Log
	var order []string
	latest := map[string]pending{}
	spans := map[string]trace.Span{} // the reconcile.record span of each id's latest decision
	defer func() {
		for _, sp := range spans {
			sp.End()
		}
	}()
	heartbeat, joined := false, false
	var owners []string // owners named by the records' new images
	for _, r := range ev.Records {
		if _, ok := schema.WorkerID(records.Key(r)); ok {
			heartbeat = true // a membership renew: the reconciler's clock for dead-member detection
			joined = joined || records.Joined(r)
			continue
		}
		if o := records.Holder(r); o != "" {
			owners = append(owners, o)
		}
		d, err := records.Classify(r)
		if err != nil {
			log.ErrorContext(ctx, "stream record unusable; skipped", "key", records.Key(r), "seq", r.Change.SequenceNumber,
				"event", r.EventName, "err", err)
			continue
		}
		if d.Action == records.Ignore {
			log.DebugContext(ctx, "stream record ignored", "key", records.Key(r), "event", r.EventName)
			continue
		}
		// A later record about the same id supersedes an earlier one: it describes
		// the item as it now is. Ignored records never do (they are not news).
		if _, seen := latest[d.ID]; !seen {
			order = append(order, d.ID)
		}
		if sp := spans[d.ID]; sp != nil {
			sp.AddEvent("superseded by a later record in the batch")
			sp.End()
		}
		var sp trace.Span
		d.Span, sp = recordSpan(traced(), r, d)
		spans[d.ID] = sp
		latest[d.ID] = pending{d: d, seq: r.Change.SequenceNumber}
		log.InfoContext(trace.ContextWithSpan(ctx, sp), "stream record needs action", "id", d.ID, "action", d.Action.String(), "why", d.Why,
			"owner", d.Owner, "version", d.LeaseVersion)
	}
	ctx = bctx // the batch's span, if it has one
	var resp events.DynamoDBEventResponse
	now := h.d.Now()
	var workers []codec.Worker
	listed := false
	if heartbeat && h.d.Members != nil && h.d.Members.Due(now) {
		rep, ws, err := h.d.Members.Reap(ctx, now)
		h.logReap(ctx, "heartbeat", rep, err)
		workers, listed = ws, err == nil
	}
	if heartbeat && h.d.Rounds != nil && h.d.Rounds.Due(now) {
		why := "heartbeat"
		if joined {
			why = rounds.WhyJoined
		}
		workers, listed = h.rebalance(ctx, now, workers, listed, why)
	}
	if len(order) == 0 && len(owners) == 0 {
		return resp, nil
	}
	ds := make([]records.Decision, len(order))
	for i, id := range order {
		ds[i] = latest[id].d
	}
	h.restartMarks(ctx, now, ds)
	var bad []error
	var err error
	if !listed {
		workers, bad, err = h.d.Registry.List(ctx)
	}
	if err == nil && h.d.Members != nil {
		h.notLive(ctx, now, workers, owners)
	}
	for _, b := range bad {
		log.WarnContext(ctx, "worker item will not decode; not a candidate", "err", b)
	}
	var out map[string]dispatch.Outcome
	if err != nil {
		log.ErrorContext(ctx, "list workers; the batch's actionable records will be retried", "err", err)
	} else {
		out = h.delivery.Deliver(ctx, workers, now, ds)
		h.repair(ctx, workers, now, ds, out)
	}
	for _, id := range order {
		o, ok := out[id]
		spans[id].SetAttributes(attribute.Bool("sockfleet.wakeup.done", ok && o.Done), tracing.Worker(o.Worker),
			tracing.Result(string(o.Result)))
		ctx := trace.ContextWithSpan(ctx, spans[id]) // the line leads to the record's trace
		switch {
		case ok && o.Done:
			log.InfoContext(ctx, "wakeup delivered", "id", id, "worker", o.Worker, "result", string(o.Result), "note", o.Why)
		default:
			why := o.Why
			if !ok {
				why = "registry unavailable"
			}
			log.WarnContext(ctx, "wakeup undelivered; record reported for retry", "id", id, "seq", latest[id].seq, "why", why)
			resp.BatchItemFailures = append(resp.BatchItemFailures, events.DynamoDBBatchItemFailure{ItemIdentifier: latest[id].seq})
		}
	}
	h.metric(ctx, now, emf.Metric{Name: schema.MetricWakeupsUndelivered, Unit: emf.Count, Value: float64(len(resp.BatchItemFailures))})
	return resp, nil
}

// restartMarks restarts the unheld mark of each stale image that left its item
// unowned over a holder's lease (lease.Store.MarkUnheld), before the holder is
// asked: the mark the image carried may be old enough for a worker's start-up pass
// or the sweep's nudge to take the lease before the holder takes it back. A failure
// is logged: the check to the holder still goes out.
func (h *Handler) restartMarks(ctx context.Context, now time.Time, ds []records.Decision) {
	for _, d := range ds {
		if d.Why != records.WhyStale || d.Image.Owner != "" {
			continue
		}
		if err := h.d.Leases.MarkUnheld(ctx, d.ID, d.Image.Version, now); err != nil && !errors.Is(err, lease.ErrLost) {
			h.d.Log.WarnContext(ctx, "restart the unheld mark of a stale image", "id", d.ID, "err", err)
		}
	}
}

// repair finishes what delivery cannot: it writes an unusable item's problem on the
// item, and repairs a stale image whose displaced holder no longer holds the lease
// (it answered so, or is not a live member) — releasing the stale lease, or, for a
// stale image already unowned, finding an owner. A holder that still holds it has
// taken it back itself (AlreadyOwned); one that is draining releases it itself.
func (h *Handler) repair(ctx context.Context, workers []codec.Worker, now time.Time, ds []records.Decision, out map[string]dispatch.Outcome) {
	var needs []records.Decision
	for _, d := range ds {
		switch o := out[d.ID]; {
		case d.Action == records.ReportInvalid:
			if err := h.d.Leases.ReportInvalid(ctx, d.ID, d.Problem); err != nil {
				out[d.ID] = dispatch.Outcome{Why: "report invalid: " + err.Error()}
				continue
			}
			out[d.ID] = dispatch.Outcome{Done: true, Why: "reported on the item: " + d.Problem}
		case !d.AsksHolder() || !o.Done:
		case o.Result != "" && o.Result != wakeup.LostRace && o.Result != wakeup.NotStartable:
		case d.Image.Owner != "":
			err := h.d.Leases.ReleaseStale(ctx, d.ID, d.Image.Owner, d.Image.Version, d.LeaseVersion)
			switch {
			case err == nil:
				h.d.Log.InfoContext(ctx, "lease nobody runs released", "id", d.ID, "why", d.Why, "named_owner", d.Image.Owner,
					"version", d.Image.Version, "holder", d.Owner, "holder_version", d.LeaseVersion)
				out[d.ID] = dispatch.Outcome{Done: true, Worker: o.Worker, Result: o.Result, Why: "lease nobody runs released"}
				if d.Why == records.WhyExpiryDamaged {
					// Its release record says nothing new (the expiry was 0 already, or
					// absent, so the old image was not owned): find an owner now.
					needs = append(needs, records.Decision{Action: records.NeedsOwner, ID: d.ID, Why: d.Why})
				}
			case errors.Is(err, lease.ErrLost):
				out[d.ID] = dispatch.Outcome{Done: true, Worker: o.Worker, Result: o.Result, Why: "stale lease changed since"}
			default:
				out[d.ID] = dispatch.Outcome{Worker: o.Worker, Result: o.Result, Why: err.Error()}
			}
		default:
			// The floor of the next acquire: above the displaced holder's version, not
			// only the stale image's (shared/lease AcquireAbove).
			needs = append(needs, records.Decision{Action: records.NeedsOwner, ID: d.ID, LeaseVersion: max(d.Image.Version, d.LeaseVersion), Why: records.WhyStale, Span: d.Span})
		}
	}
	if len(needs) > 0 {
		maps.Copy(out, h.delivery.Deliver(ctx, workers, now, needs))
	}
}

// rebalance runs a rebalance check on the registry as listed (listing it if not),
// and returns the listing for the rest of the batch.
func (h *Handler) rebalance(ctx context.Context, now time.Time, workers []codec.Worker, listed bool, why string) ([]codec.Worker, bool) {
	if !listed {
		ws, _, err := h.d.Registry.List(ctx)
		if err != nil {
			h.d.Log.WarnContext(ctx, "rebalance: list workers; checked again on a later heartbeat", "err", err)
			return workers, false
		}
		workers, listed = ws, true
	}
	rep := h.d.Rounds.Check(ctx, now, workers, why)
	if rep.Skipped == "" {
		h.metric(ctx, now,
			emf.Metric{Name: schema.MetricRebalanceMoves, Unit: emf.Count, Value: float64(rep.Accepted())},
			emf.Metric{Name: schema.MetricRebalanceMinimum, Unit: emf.Count, Value: float64(rep.Plan.Min)})
	} else {
		h.d.Log.DebugContext(ctx, "rebalance: no round", "why", why, "skipped", rep.Skipped, "err", rep.Err)
	}
	return workers, listed
}

// notLive hands the owners that are not live members to the reaper.
func (h *Handler) notLive(ctx context.Context, now time.Time, workers []codec.Worker, owners []string) {
	live := map[string]bool{}
	for _, w := range workers {
		live[w.ID] = w.Live(now.UnixMilli())
	}
	var gone []string
	for _, o := range owners {
		if !live[o] {
			gone = append(gone, o)
		}
	}
	if len(gone) == 0 {
		return
	}
	rep, err := h.d.Members.Owners(ctx, now, workers, gone)
	h.logReap(ctx, "owners not live", rep, err)
}

func (h *Handler) logReap(ctx context.Context, why string, rep reaper.Report, err error) {
	if err != nil {
		h.d.Log.WarnContext(ctx, "membership: some actions failed; retried on a later heartbeat or sweep", "why", why, "err", err)
	}
	if len(rep.Declared)+len(rep.Tombstoned)+len(rep.Released) > 0 {
		h.d.Log.InfoContext(ctx, "membership", "why", why, "declared_dead", rep.Declared, "tombstoned", rep.Tombstoned,
			"released", len(rep.Released))
	}
}

// HandleTask handles a task state change.
func (h *Handler) HandleTask(ctx context.Context, ev TaskEvent) error {
	log := h.d.Log.With("task", ev.TaskARN, "worker", ev.WorkerID, "last_status", ev.LastStatus, "desired_status", ev.DesiredStatus)
	gone, why := ev.WorkerGone()
	if !gone {
		log.DebugContext(ctx, "worker container not stopped (running, or draining); ignored")
		return nil
	}
	if ev.ClusterARN != h.cfg.ClusterARN {
		log.InfoContext(ctx, "task of another cluster; ignored", "cluster", ev.ClusterARN)
		return nil
	}
	// Spans only for a worker gone: not for the task's other state changes.
	ctx, batch := tracer.Start(ctx, "reconcile.batch", trace.WithAttributes(attribute.String("sockfleet.event", "task")))
	defer batch.End()
	rctx, span := tracer.Start(ctx, "reaper.release", trace.WithAttributes(tracing.Cause("task_stopped"), tracing.Worker(ev.WorkerID)))
	// Each release carries this span's traceparent (trace_parent): the records they
	// cause, and the wakeups those bring, join this trace.
	released, err := h.d.Leases.ReleaseAllOwnedBy(rctx, ev.WorkerID)
	reaper.Released(span, released, err)
	span.End()
	log.InfoContext(ctx, "released stopped worker's leases", "released", len(released), "ids", released,
		"why", why, "stop_code", ev.StopCode, "reason", ev.StoppedReason)
	if derr := h.d.Registry.Gone(ctx, ev.WorkerID, h.d.Now()); derr != nil {
		err = errors.Join(err, derr)
	}
	if err != nil {
		return fmt.Errorf("task %s stopped: %w", ev.WorkerID, err)
	}
	return nil
}

// Sweep runs the backstop sweep and emits the orphan metrics.
func (h *Handler) Sweep(ctx context.Context) (sweep.Report, error) {
	ctx, batch := tracer.Start(ctx, "reconcile.batch", trace.WithAttributes(attribute.String("sockfleet.event", "sweep")))
	defer batch.End()
	now := h.d.Now()
	var ws []codec.Worker
	if h.d.Members != nil {
		// The last net for a fleet whose heartbeats stopped (one worker, or none).
		rep, listed, rerr := h.d.Members.Reap(ctx, now)
		h.logReap(ctx, "sweep", rep, rerr)
		ws = listed
	}
	if h.d.Rounds != nil {
		ws, _ = h.rebalance(ctx, now, ws, ws != nil, "sweep")
	}
	sctx, span := tracer.Start(ctx, "sweep.run", trace.WithAttributes(tracing.Cause("sweep")))
	r, err := h.d.Sweeper.Run(sctx, now)
	span.SetAttributes(attribute.Int("sockfleet.sweep.released", r.Released), attribute.Int("sockfleet.sweep.nudged", r.Nudged))
	if err != nil {
		span.RecordError(err)
	}
	span.End()
	if h.d.Members != nil && len(r.NotLiveOwners) > 0 && ws != nil {
		rep, oerr := h.d.Members.Owners(ctx, now, ws, r.NotLiveOwners)
		h.logReap(ctx, "sweep: owners not live", rep, oerr)
	}
	h.d.Log.InfoContext(ctx, "sweep done", "segment", r.Segment, "segments", r.Segments, "pages", r.Pages,
		"scanned", r.Scanned, "complete", r.Complete, "released", r.Released, "nudged", r.Nudged,
		"workers_cleared", r.WorkersCleared, "orphaned", r.Orphaned, "oldest_orphan", r.OldestOrphan, "errors", r.Errors)
	if r.Pages > 0 {
		h.metric(ctx, now,
			emf.Metric{Name: schema.MetricOrphaned, Unit: emf.Count, Value: float64(r.Orphaned)},
			emf.Metric{Name: schema.MetricOrphanedOldest, Unit: emf.Seconds, Value: r.OldestOrphan.Seconds()})
	}
	if err != nil {
		return r, fmt.Errorf("sweep: %w", err)
	}
	return r, nil
}

var tracer = tracing.Tracer("functions/reconciler/handler")

// recordSpan starts the reconcile.record span of decision d about record r: a child of
// the span whose write caused r when the write carried one (records.TraceParent: a
// release or a transfer), linked to the batch's span; else a child of the batch's.
func recordSpan(ctx context.Context, r events.DynamoDBEventRecord, d records.Decision) (*trace.SpanContext, trace.Span) {
	opts := []trace.SpanStartOption{trace.WithAttributes(tracing.Conn(d.ID), tracing.Decision(d.Action.String()),
		tracing.Cause(recordCause(d.Why)), tracing.Version(d.LeaseVersion), attribute.String("sockfleet.why", d.Why),
		attribute.String("aws.dynamodb.stream.sequence_number", r.Change.SequenceNumber))}
	if d.Owner != "" {
		opts = append(opts, trace.WithAttributes(tracing.Worker(d.Owner)))
	}
	if cause, ok := records.TraceParent(r); ok {
		opts = append(opts, trace.WithLinks(trace.LinkFromContext(ctx)))
		ctx = trace.ContextWithRemoteSpanContext(ctx, cause)
	}
	_, sp := tracer.Start(ctx, "reconcile.record", opts...)
	sc := sp.SpanContext()
	return &sc, sp
}

// recordCause names the cause of a decision (sockfleet.cause): an operator's flip of
// desired_state, a new item, a release (a stopped worker's, a dead member's, a
// fallback handoff's, an owner's), and so on.
func recordCause(why string) string {
	switch why {
	case records.WhyInserted:
		return "insert"
	case records.WhyRestarted, records.WhyStopped:
		return "flip"
	}
	return strings.ReplaceAll(why, " ", "_")
}

func (h *Handler) metric(ctx context.Context, now time.Time, ms ...emf.Metric) {
	if err := emf.Write(h.d.Metrics, schema.MetricNamespace, now, ms...); err != nil {
		h.d.Log.WarnContext(ctx, "write metric", "err", err)
	}
}
