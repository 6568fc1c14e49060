// Package metrics holds the worker's counters, renders them as plain text for
// GET /metrics, and writes CloudWatch Embedded Metric Format (EMF) lines (encoded by
// shared/emf).
//
// Counters are monotonic since process start; the fields marked gauge are not. Nothing
// here is exact across a crash: the numbers are for dashboards and alarms.
package metrics

import (
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

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
	SecretErrors  atomic.Int64 // secret references that could not be resolved
	DecodeErrors  atomic.Int64 // frames the spec's decode could not decompress within the read limit (also counted as bad)

	// Planned handoffs (docs/HANDOFF.md).
	Handoffs         atomic.Int64 // leases this worker transferred to another
	HandoffFallbacks atomic.Int64 // handoffs that ended in a release instead
	HandoffsTaken    atomic.Int64 // leases taken over from a committed standby
	HandoffsAdopted  atomic.Int64 // leases taken up from the table (no usable standby, or no commit)
	StandbyOverflows atomic.Int64 // standbys given up because their buffer filled
}

// WriteText writes the counters as "name value" lines (Prometheus text format).
func (c *Counters) WriteText(w io.Writer) error {
	rows := []struct {
		name string
		v    *atomic.Int64
	}{
		{"sockfleet_owned_connections", &c.Owned},
		{"sockfleet_acquisitions_total", &c.Acquisitions},
		{"sockfleet_renew_failures_total", &c.RenewFailures},
		{"sockfleet_leases_lost_total", &c.LeasesLost},
		{"sockfleet_self_fences_total", &c.SelfFences},
		{"sockfleet_releases_total", &c.Releases},
		{"sockfleet_messages_total", &c.Messages},
		{"sockfleet_bytes_total", &c.Bytes},
		{"sockfleet_reconnects_total", &c.Reconnects},
		{"sockfleet_dial_failures_total", &c.DialFailures},
		{"sockfleet_sink_errors_total", &c.SinkErrors},
		{"sockfleet_sink_retried_records_total", &c.SinkRetries},
		{"sockfleet_sink_throttles_total", &c.SinkThrottles},
		{"sockfleet_sink_writes_total", &c.SinkWrites},
		{"sockfleet_sink_slow_writes_total", &c.SinkSlowWrites},
		{"sockfleet_sink_slow_connections", &c.SinkSlow},
		{"sockfleet_sink_queue_depth", &c.SinkQueued},
		{"sockfleet_bad_messages_total", &c.BadMessages},
		{"sockfleet_duplicates_dropped_total", &c.Duplicates},
		{"sockfleet_wakeups_total", &c.Wakeups},
		{"sockfleet_member_renew_failures_total", &c.MemberRenewFailures},
		{"sockfleet_checkpoints_total", &c.Checkpoints},
		{"sockfleet_backstop_reads_total", &c.BackstopReads},
		{"sockfleet_backstop_read_milliunits_total", &c.BackstopReadUnits},
		{"sockfleet_release_retries_total", &c.ReleaseRetries},
		{"sockfleet_wakeups_refused_total", &c.WakeupsRefused},
		{"sockfleet_registry_errors_total", &c.RegistryErrors},
		{"sockfleet_lost_races_total", &c.LostRaces},
		{"sockfleet_orphan_polls_total", &c.OrphanPolls},
		{"sockfleet_seq_resets_total", &c.SeqResets},
		{"sockfleet_seq_gaps_total", &c.SeqGaps},
		{"sockfleet_seq_gap_missing_total", &c.SeqGapMissing},
		{"sockfleet_over_limit_frames_total", &c.OverLimit},
		{"sockfleet_bogus_seq_jumps_total", &c.BogusJumps},
		{"sockfleet_open_failures_total", &c.OpenFailures},
		{"sockfleet_idle_total", &c.Idle},
		{"sockfleet_idle_connections", &c.IdleNow},
		{"sockfleet_rotations_total", &c.Rotations},
		{"sockfleet_rotation_overlap_sockets", &c.Overlap},
		{"sockfleet_rotation_overlap_peak_sockets", &c.OverlapPeak},
		{"sockfleet_quota_waits_total", &c.QuotaWaits},
		{"sockfleet_quota_waiting", &c.QuotaWaiting},
		{"sockfleet_secret_errors_total", &c.SecretErrors},
		{"sockfleet_decode_errors_total", &c.DecodeErrors},
		{"sockfleet_handoffs_total", &c.Handoffs},
		{"sockfleet_handoff_fallbacks_total", &c.HandoffFallbacks},
		{"sockfleet_handoffs_taken_total", &c.HandoffsTaken},
		{"sockfleet_handoffs_adopted_total", &c.HandoffsAdopted},
		{"sockfleet_standby_overflows_total", &c.StandbyOverflows},
	}
	for _, r := range rows {
		if _, err := fmt.Fprintf(w, "%s %d\n", r.name, r.v.Load()); err != nil {
			return err
		}
	}
	// With sockfleet_sink_writes_total, the mean sink latency.
	_, err := fmt.Fprintf(w, "sockfleet_sink_write_seconds_total %.6f\n", float64(c.SinkWriteNanos.Load())/1e9)
	return err
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
