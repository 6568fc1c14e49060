// Package metrics holds the worker's counters, serves them on GET /metrics through
// the Prometheus client library (prometheus/client_golang), and writes CloudWatch Embedded Metric Format (EMF) lines (encoded by
// shared/emf).
//
// Counters are monotonic since process start; the fields marked gauge are not. Nothing
// here is exact across a crash: the numbers are for dashboards and alarms.
package metrics

import (
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sockfleet/sockfleet/shared/emf"
	"github.com/sockfleet/sockfleet/shared/schema"
)

// Counters are the worker's counters. The zero value is ready to use.
type Counters struct {
	Owned          atomic.Int64 // gauge: leases held now
	Acquisitions   atomic.Int64
	RenewFailures  atomic.Int64
	LeasesLost     atomic.Int64
	SelfFences     atomic.Int64
	Releases       atomic.Int64
	Messages       atomic.Int64 // delivered to the sink and acknowledged
	Bytes          atomic.Int64
	Reconnects     atomic.Int64 // dials after the first of a connection's life
	DialFailures   atomic.Int64
	SinkErrors     atomic.Int64
	SinkRetries    atomic.Int64 // records a sink sent again after a partial failure (Kinesis)
	SinkThrottles  atomic.Int64 // sink calls refused for throughput (Kinesis)
	SinkWrites     atomic.Int64 // sink writes finished, failed or not
	SinkWriteNanos atomic.Int64 // their total duration
	SinkSlowWrites atomic.Int64 // writes that held their connection back (status sink_slow)
	SinkSlow       atomic.Int64 // gauge: connections held back by a slow sink now
	SinkQueued     atomic.Int64 // gauge: messages read and not yet acknowledged by the sink
	BadMessages    atomic.Int64 // no parsable sequence, or binary where a sequence is needed
	Duplicates     atomic.Int64 // sequence at or below the one already delivered; dropped
	Wakeups        atomic.Int64 // authenticated wakeup requests
	WakeupsRefused atomic.Int64 // 401/400/413/503 answers
	RegistryErrors atomic.Int64
	LostRaces      atomic.Int64 // acquires refused because another worker holds the lease
	OrphanPolls    atomic.Int64 // polling mode: index queries for orphans
	// Stream mode (membership).
	MemberRenewFailures atomic.Int64 // membership renews that failed (not "not a member")
	Checkpoints         atomic.Int64 // checkpoint writes
	BackstopReads       atomic.Int64 // BatchGetItem requests of the backstop
	BackstopReadUnits   atomic.Int64 // their read units, in thousandths
	ReleaseRetries      atomic.Int64 // releases retried after a failure
	// The backstop's reconciliation (owner/reconcile.go): lease_owner index queries
	// and their read units (thousandths), leases that named this worker although it
	// ran no session, and of those the ones taken up and the ones released.
	ReconcileQueries   atomic.Int64
	ReconcileReadUnits atomic.Int64
	PhantomsFound      atomic.Int64
	PhantomsAdopted    atomic.Int64
	PhantomsReleased   atomic.Int64

	// Per-connection spec (docs/CONNECTIONS.md).
	SeqResets     atomic.Int64 // upstream numbering restarted (accepted or halted)
	SeqGaps       atomic.Int64 // forward gaps in the upstream's numbering
	SeqGapMissing atomic.Int64 // sequences skipped over by those gaps
	OverLimit     atomic.Int64 // frames over the read limit (also counted as bad)
	BogusJumps    atomic.Int64 // sequences further than max_seq_jump ahead (also counted as bad)
	OpenFailures  atomic.Int64 // open_messages reply or keepalive pong missing in time
	Idle          atomic.Int64 // times a connection went idle (no data for idle_timeout)
	IdleNow       atomic.Int64 // gauge: connections idle now
	Rotations     atomic.Int64 // sockets replaced make-before-break (max_lifetime or announced shutdown)
	Overlap       atomic.Int64 // gauge: extra sockets held now while rotating
	OverlapPeak   atomic.Int64 // the most extra sockets held at once while rotating
	QuotaWaits    atomic.Int64 // dials that waited for the per-host connect quota
	QuotaWaiting  atomic.Int64 // gauge: dials waiting for the quota now
	// QuotaTableErrors: admissions the table (the fleet-wide quota and the 429
	// holds) could not answer.
	QuotaTableErrors atomic.Int64
	RateLimited      atomic.Int64 // handshakes answered 429 or 418 (rate limited or banned)
	SecretErrors     atomic.Int64 // secret references that could not be resolved
	// REST requests of the spec (token_request, refresh, snapshot).
	TokenErrors     atomic.Int64 // token requests that failed (the dial did not happen)
	RefreshFailures atomic.Int64 // refresh requests that failed (the socket rotated)
	Snapshots       atomic.Int64 // snapshot records queued for delivery
	SnapshotErrors  atomic.Int64 // snapshot requests that failed
	SnapshotsStale  atomic.Int64 // snapshots older than what was delivered; not delivered
	DecodeErrors    atomic.Int64 // frames the spec's decode could not decompress within the read limit (also counted as bad)

	// Planned handoffs (docs/HANDOFF.md).
	Handoffs         atomic.Int64 // leases this worker transferred to another
	HandoffFallbacks atomic.Int64 // handoffs that ended in a release instead
	HandoffsTaken    atomic.Int64 // leases taken over from a committed standby
	HandoffsAdopted  atomic.Int64 // leases taken up from the table (no usable standby, or no commit)
	StandbyOverflows atomic.Int64 // standbys given up because their buffer filled
}

// A series is one metric of GET /metrics, read from one field of Counters at scrape
// time. The names, and whether each is a counter or a gauge, are what the docs and
// the benchmarks read (docs/SINKS.md, docs/CONNECTIONS.md, docs/HANDOFF.md).
type series struct {
	name, help string
	gauge      bool
	field      func(*Counters) *atomic.Int64
}

var table = []series{
	{"sockfleet_owned_connections", "Leases held now.", true, func(c *Counters) *atomic.Int64 { return &c.Owned }},
	{"sockfleet_acquisitions_total", "Leases acquired.", false, func(c *Counters) *atomic.Int64 { return &c.Acquisitions }},
	{"sockfleet_renew_failures_total", "Lease renewals that failed.", false, func(c *Counters) *atomic.Int64 { return &c.RenewFailures }},
	{"sockfleet_leases_lost_total", "Leases found held by another worker.", false, func(c *Counters) *atomic.Int64 { return &c.LeasesLost }},
	{"sockfleet_self_fences_total", "Connections stopped because their lease could not be renewed in time.", false, func(c *Counters) *atomic.Int64 { return &c.SelfFences }},
	{"sockfleet_releases_total", "Leases released.", false, func(c *Counters) *atomic.Int64 { return &c.Releases }},
	{"sockfleet_messages_total", "Messages delivered to the sink and acknowledged.", false, func(c *Counters) *atomic.Int64 { return &c.Messages }},
	{"sockfleet_bytes_total", "Payload bytes of the messages delivered.", false, func(c *Counters) *atomic.Int64 { return &c.Bytes }},
	{"sockfleet_reconnects_total", "Dials after the first of a connection's life.", false, func(c *Counters) *atomic.Int64 { return &c.Reconnects }},
	{"sockfleet_dial_failures_total", "Upstream dials that failed.", false, func(c *Counters) *atomic.Int64 { return &c.DialFailures }},
	{"sockfleet_sink_errors_total", "Sink writes that failed (timeouts included).", false, func(c *Counters) *atomic.Int64 { return &c.SinkErrors }},
	{"sockfleet_sink_retried_records_total", "Records a sink sent again after a partial failure (Kinesis).", false, func(c *Counters) *atomic.Int64 { return &c.SinkRetries }},
	{"sockfleet_sink_throttles_total", "Sink calls refused for throughput (Kinesis).", false, func(c *Counters) *atomic.Int64 { return &c.SinkThrottles }},
	{"sockfleet_sink_writes_total", "Sink writes finished, failed or not.", false, func(c *Counters) *atomic.Int64 { return &c.SinkWrites }},
	{"sockfleet_sink_slow_writes_total", "Sink writes that held their connection back (status sink_slow).", false, func(c *Counters) *atomic.Int64 { return &c.SinkSlowWrites }},
	{"sockfleet_sink_slow_connections", "Connections held back by a slow sink now.", true, func(c *Counters) *atomic.Int64 { return &c.SinkSlow }},
	{"sockfleet_sink_queue_depth", "Messages read and not yet acknowledged by the sink.", true, func(c *Counters) *atomic.Int64 { return &c.SinkQueued }},
	{"sockfleet_bad_messages_total", "Messages with no parsable sequence, or binary where a sequence is needed.", false, func(c *Counters) *atomic.Int64 { return &c.BadMessages }},
	{"sockfleet_duplicates_dropped_total", "Messages at or below the sequence already delivered, dropped.", false, func(c *Counters) *atomic.Int64 { return &c.Duplicates }},
	{"sockfleet_wakeups_total", "Authenticated wakeup requests.", false, func(c *Counters) *atomic.Int64 { return &c.Wakeups }},
	{"sockfleet_member_renew_failures_total", "Membership renewals that failed.", false, func(c *Counters) *atomic.Int64 { return &c.MemberRenewFailures }},
	{"sockfleet_checkpoints_total", "Checkpoint writes.", false, func(c *Counters) *atomic.Int64 { return &c.Checkpoints }},
	{"sockfleet_backstop_reads_total", "BatchGetItem requests of the backstop.", false, func(c *Counters) *atomic.Int64 { return &c.BackstopReads }},
	{"sockfleet_backstop_read_milliunits_total", "Read units of the backstop, in thousandths.", false, func(c *Counters) *atomic.Int64 { return &c.BackstopReadUnits }},
	{"sockfleet_reconcile_queries_total", "Queries of the lease_owner index for items naming this worker (the reconciliation).", false, func(c *Counters) *atomic.Int64 { return &c.ReconcileQueries }},
	{"sockfleet_reconcile_read_milliunits_total", "Read units of the reconciliation, in thousandths.", false, func(c *Counters) *atomic.Int64 { return &c.ReconcileReadUnits }},
	{"sockfleet_phantoms_found_total", "Items naming this worker that it did not run.", false, func(c *Counters) *atomic.Int64 { return &c.PhantomsFound }},
	{"sockfleet_phantoms_adopted_total", "Phantom leases adopted after their quarantine.", false, func(c *Counters) *atomic.Int64 { return &c.PhantomsAdopted }},
	{"sockfleet_phantoms_released_total", "Phantom leases released (not STARTED).", false, func(c *Counters) *atomic.Int64 { return &c.PhantomsReleased }},
	{"sockfleet_release_retries_total", "Releases retried after a failure.", false, func(c *Counters) *atomic.Int64 { return &c.ReleaseRetries }},
	{"sockfleet_wakeups_refused_total", "Wakeup and handoff requests refused (401, 400, 413, 503).", false, func(c *Counters) *atomic.Int64 { return &c.WakeupsRefused }},
	{"sockfleet_registry_errors_total", "Worker registry calls that failed.", false, func(c *Counters) *atomic.Int64 { return &c.RegistryErrors }},
	{"sockfleet_lost_races_total", "Acquires refused because another worker holds the lease.", false, func(c *Counters) *atomic.Int64 { return &c.LostRaces }},
	{"sockfleet_orphan_polls_total", "Polling mode: index queries for orphans.", false, func(c *Counters) *atomic.Int64 { return &c.OrphanPolls }},
	{"sockfleet_seq_resets_total", "Upstream numbering restarts (accepted or halted).", false, func(c *Counters) *atomic.Int64 { return &c.SeqResets }},
	{"sockfleet_seq_gaps_total", "Forward gaps in the upstream's numbering.", false, func(c *Counters) *atomic.Int64 { return &c.SeqGaps }},
	{"sockfleet_seq_gap_missing_total", "Sequences skipped over by those gaps.", false, func(c *Counters) *atomic.Int64 { return &c.SeqGapMissing }},
	{"sockfleet_over_limit_frames_total", "Frames over the read limit (also counted as bad).", false, func(c *Counters) *atomic.Int64 { return &c.OverLimit }},
	{"sockfleet_bogus_seq_jumps_total", "Sequences further than max_seq_jump ahead (also counted as bad).", false, func(c *Counters) *atomic.Int64 { return &c.BogusJumps }},
	{"sockfleet_decode_errors_total", "Frames the spec's decode could not decompress within the read limit (also counted as bad).", false, func(c *Counters) *atomic.Int64 { return &c.DecodeErrors }},
	{"sockfleet_open_failures_total", "Open-message replies or keepalive pongs missing in time.", false, func(c *Counters) *atomic.Int64 { return &c.OpenFailures }},
	{"sockfleet_idle_total", "Times a connection went idle (no data for idle_timeout).", false, func(c *Counters) *atomic.Int64 { return &c.Idle }},
	{"sockfleet_idle_connections", "Connections idle now.", true, func(c *Counters) *atomic.Int64 { return &c.IdleNow }},
	{"sockfleet_rotations_total", "Sockets replaced make-before-break (max_lifetime or announced shutdown).", false, func(c *Counters) *atomic.Int64 { return &c.Rotations }},
	{"sockfleet_rotation_overlap_sockets", "Extra sockets held now while rotating.", true, func(c *Counters) *atomic.Int64 { return &c.Overlap }},
	{"sockfleet_rotation_overlap_peak_sockets", "The most extra sockets held at once while rotating.", true, func(c *Counters) *atomic.Int64 { return &c.OverlapPeak }},
	{"sockfleet_quota_waits_total", "Dials that waited for the per-host connect quota.", false, func(c *Counters) *atomic.Int64 { return &c.QuotaWaits }},
	{"sockfleet_quota_waiting", "Dials waiting for the connect quota now.", true, func(c *Counters) *atomic.Int64 { return &c.QuotaWaiting }},
	{"sockfleet_quota_table_errors_total", "Admissions the table could not answer (fleet-wide quota and 429 holds).", false, func(c *Counters) *atomic.Int64 { return &c.QuotaTableErrors }},
	{"sockfleet_rate_limited_total", "Handshakes answered 429 or 418 (rate limited or banned).", false, func(c *Counters) *atomic.Int64 { return &c.RateLimited }},
	{"sockfleet_secret_errors_total", "Secret references that could not be resolved.", false, func(c *Counters) *atomic.Int64 { return &c.SecretErrors }},
	{"sockfleet_token_errors_total", "Token requests that failed (the dial did not happen).", false, func(c *Counters) *atomic.Int64 { return &c.TokenErrors }},
	{"sockfleet_token_refresh_failures_total", "Refresh requests that failed (the socket rotated).", false, func(c *Counters) *atomic.Int64 { return &c.RefreshFailures }},
	{"sockfleet_snapshots_total", "Snapshot records queued for delivery.", false, func(c *Counters) *atomic.Int64 { return &c.Snapshots }},
	{"sockfleet_snapshot_errors_total", "Snapshot requests that failed.", false, func(c *Counters) *atomic.Int64 { return &c.SnapshotErrors }},
	{"sockfleet_snapshots_stale_total", "Snapshots older than what was delivered; not delivered.", false, func(c *Counters) *atomic.Int64 { return &c.SnapshotsStale }},
	{"sockfleet_handoffs_total", "Leases this worker transferred to another.", false, func(c *Counters) *atomic.Int64 { return &c.Handoffs }},
	{"sockfleet_handoff_fallbacks_total", "Handoffs that ended in a release instead.", false, func(c *Counters) *atomic.Int64 { return &c.HandoffFallbacks }},
	{"sockfleet_handoffs_taken_total", "Leases taken over from a committed standby.", false, func(c *Counters) *atomic.Int64 { return &c.HandoffsTaken }},
	{"sockfleet_handoffs_adopted_total", "Leases taken up from the table (no usable standby, or no commit).", false, func(c *Counters) *atomic.Int64 { return &c.HandoffsAdopted }},
	{"sockfleet_standby_overflows_total", "Standbys given up because their buffer filled.", false, func(c *Counters) *atomic.Int64 { return &c.StandbyOverflows }},
}

// Register registers every series of c with r: counters and gauges whose value is
// read from c at scrape time. The message path keeps its one atomic add per counter;
// nothing is allocated or looked up per message.
func (c *Counters) Register(r prometheus.Registerer) error {
	cs := make([]prometheus.Collector, 0, len(table)+1)
	for _, s := range table {
		v := s.field(c)
		opts := prometheus.Opts{Name: s.name, Help: s.help}
		read := func() float64 { return float64(v.Load()) }
		if s.gauge {
			cs = append(cs, prometheus.NewGaugeFunc(prometheus.GaugeOpts(opts), read))
		} else {
			cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts(opts), read))
		}
	}
	// With sockfleet_sink_writes_total, the mean sink latency.
	cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "sockfleet_sink_write_seconds_total",
		Help: "Total duration of the sink writes, in seconds.",
	}, func() float64 { return float64(c.SinkWriteNanos.Load()) / 1e9 }))
	for _, col := range cs {
		if err := r.Register(col); err != nil {
			return fmt.Errorf("register metrics: %w", err)
		}
	}
	return nil
}

// Handler serves GET /metrics: c's series, and the Go runtime's and the process's
// (go_*, process_*), in the Prometheus exposition format the client asks for (text by
// default). It panics only if the series table is broken (a name twice, an invalid
// name), which TestRegisterPedantic catches.
func Handler(c *Counters) http.Handler {
	reg := prometheus.NewRegistry()
	if err := c.Register(reg); err != nil {
		panic(err)
	}
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
}

// EMF writes CloudWatch Embedded Metric Format lines, one JSON object per line, to W
// (stderr in production, where the log driver ships them to CloudWatch Logs).
type EMF struct {
	W       io.Writer
	Service string // value of the ServiceName dimension; empty: no dimension
	Now     func() time.Time

	mu sync.Mutex // one line per Write, never interleaved
}

// Value is one metric value of an EMF line.
type Value struct {
	Name string
	V    int64
}

// Put writes one metric value with unit "Count".
func (e *EMF) Put(name string, v int64) { e.PutAll(Value{name, v}) }

// PutAll writes several metric values, all with unit "Count", on one line.
func (e *EMF) PutAll(vals ...Value) {
	if e == nil || e.W == nil || len(vals) == 0 {
		return
	}
	now := time.Now
	if e.Now != nil {
		now = e.Now
	}
	ms := make([]emf.Metric, len(vals))
	for i, v := range vals {
		ms[i] = emf.Metric{Name: v.Name, Unit: emf.Count, Value: float64(v.V)}
	}
	var dims []emf.Dimension
	if e.Service != "" {
		dims = []emf.Dimension{{Name: schema.MetricDimService, Value: e.Service}}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	_ = emf.WriteDims(e.W, schema.MetricNamespace, dims, now(), ms...) // metrics are best effort
}

// PutGauges writes the connection-state gauges that only /metrics had: connections
// idle now (status idle: no data message for their idle_timeout) and dials waiting
// for the connect quota now. The worker writes them every renew interval, so the
// fleet's idle alarm sees a connection that went quiet.
func (e *EMF) PutGauges(c *Counters) {
	e.PutAll(Value{schema.MetricIdle, c.IdleNow.Load()}, Value{schema.MetricQuotaWaiting, c.QuotaWaiting.Load()})
}
