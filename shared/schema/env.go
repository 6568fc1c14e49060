package schema

// Environment variables read by the binaries (in main only) and set by the CDK stack,
// named once here so the two cannot drift.
const (
	EnvTable = "SOCKFLEET_TABLE" // table name; default DefaultTableName

	// Worker.
	EnvWorkerID       = "SOCKFLEET_WORKER_ID"       // default: ECS task id, else hostname-pid
	EnvListenAddr     = "SOCKFLEET_LISTEN_ADDR"     // wakeup/health/metrics listener; default :8080
	EnvAdvertiseAddr  = "SOCKFLEET_ADVERTISE_ADDR"  // host:port the reconciler calls; default: ECS task IP
	EnvMaxConnections = "SOCKFLEET_MAX_CONNECTIONS" // capacity of one worker
	EnvLease          = "SOCKFLEET_LEASE"           // Go duration, e.g. 60s
	EnvRenewInterval  = "SOCKFLEET_RENEW_INTERVAL"  // e.g. 20s
	EnvRenewDeadline  = "SOCKFLEET_RENEW_DEADLINE"  // e.g. 50s; lease > deadline > interval
	EnvSkewMargin     = "SOCKFLEET_SKEW_MARGIN"     // e.g. 5s
	EnvDrainTimeout   = "SOCKFLEET_DRAIN_TIMEOUT"   // e.g. 60s, well under ECS's stopTimeout
	EnvSink           = "SOCKFLEET_SINK"            // stdout | file:PATH | http(s)://URL
	EnvSinkTimeout    = "SOCKFLEET_SINK_TIMEOUT"    // one sink write; default min(10s, the sink window)
	EnvResume         = "SOCKFLEET_RESUME"          // how last_seq is passed upstream
	EnvSeqPath        = "SOCKFLEET_SEQ_PATH"        // JSON field path of a message's sequence; empty: count
	EnvBadMessages    = "SOCKFLEET_BAD_MESSAGES"    // count | skip | pass
	EnvLogLevel       = "SOCKFLEET_LOG_LEVEL"       // debug | info | warn | error; default info

	// Worker: per-connection spec support (docs/CONNECTIONS.md).
	EnvConnectQuota = "SOCKFLEET_CONNECT_QUOTA" // N/DURATION new connections per upstream host, fleet-wide (through the table), e.g. 300/5m; empty: none
	EnvSeqReset     = "SOCKFLEET_SEQ_RESET"     // accept | halt; default accept (a spec's seq_reset overrides)
	EnvMaxSeqJump   = "SOCKFLEET_MAX_SEQ_JUMP"  // a sequence more than this past the last is bad; default 0: no limit
	EnvSecretsFile  = "SOCKFLEET_SECRETS_FILE"  // JSON object name → {"value", "allowed_hosts"} serving {{secret:NAME}} locally; empty: Secrets Manager
	EnvSecretsTTL   = "SOCKFLEET_SECRETS_TTL"   // how long a secret value is cached; default 5m
	EnvIdleTimeout  = "SOCKFLEET_IDLE_TIMEOUT"  // idle_timeout of a connection whose item sets none; default 5m, 0: off
	EnvSinksAllowed = "SOCKFLEET_SINKS_ALLOWED" // destinations a connection's sink attribute may name (stream names, ARNs, file:PATH); empty: none

	// Shared by worker and reconciler: the HMAC key of wakeup calls. The worker gets it
	// injected by ECS from Secrets Manager; the reconciler may instead get the secret's
	// ARN and read it once per cold start.
	EnvWakeupSecret    = "SOCKFLEET_WAKEUP_SECRET"
	EnvWakeupSecretARN = "SOCKFLEET_WAKEUP_SECRET_ARN"

	// Reconciler.
	EnvClusterARN    = "SOCKFLEET_CLUSTER_ARN"     // only this cluster's task events are acted on
	EnvNudgeAfter    = "SOCKFLEET_NUDGE_AFTER"     // sweep nudges items unowned this long; default 2m
	EnvSweepMaxItems = "SOCKFLEET_SWEEP_MAX_ITEMS" // items one sweep run reads at most; default 50000
	EnvSweepSegments = "SOCKFLEET_SWEEP_SEGMENTS"  // scan segments, one per sweep period; default 1
	EnvSweepPeriod   = "SOCKFLEET_SWEEP_PERIOD"    // the sweep schedule's period; default 5m

	// Reconciler: rebalance rounds (functions/reconciler/rounds).
	EnvRebalance            = "SOCKFLEET_REBALANCE"              // on | off; default on
	EnvRebalanceTolerance   = "SOCKFLEET_REBALANCE_TOLERANCE"    // band around the mean utilisation; default 0.10
	EnvRebalanceMaxFraction = "SOCKFLEET_REBALANCE_MAX_FRACTION" // moves per round, of the connections; default 0.10
	EnvRebalanceCooling     = "SOCKFLEET_REBALANCE_COOLING"      // a moved connection stays put this long; default 5m
	EnvRebalanceMinInterval = "SOCKFLEET_REBALANCE_MIN_INTERVAL" // least time between rounds; default 5s
	EnvRebalanceSettle      = "SOCKFLEET_REBALANCE_SETTLE"       // longest wait for a round's moves to show in the loads; default 15s

	// Worker: the value of the MetricDimService dimension on its metrics. The stack
	// sets it to the workers' ECS service name, so autoscaling on connections per task
	// reads exactly this fleet's workers. Empty: no dimension.
	EnvServiceName = "SOCKFLEET_SERVICE_NAME"

	// Worker: the ownership mode. "stream" (default): the reconciler wakes workers.
	// "polling": the seed's design, kept as a fallback for users who cannot deploy the
	// Lambda and as the baseline of the benchmarks: 5 s heartbeat, 20 s lease, and
	// every worker queries the seed's index (PollingIndex) for orphans every
	// EnvPollInterval with jitter, trying to acquire each one it finds.
	EnvMode         = "SOCKFLEET_MODE"
	EnvPollInterval = "SOCKFLEET_POLL_INTERVAL" // polling mode; default 5s

	// Worker, for chaos runs only: shifts the wall clock the worker uses for lease
	// expiry by this duration (e.g. 300ms or -300ms). Keep it within the skew margin.
	EnvClockOffset = "SOCKFLEET_CLOCK_OFFSET"

	// Worker, stream mode (membership): checkpoint at most this often per connection
	// (default 30s; the duplicate window after a crash), and read owned connections
	// back this often to catch lost wakeups (default 1m).
	EnvCheckpointInterval = "SOCKFLEET_CHECKPOINT_INTERVAL"
	EnvBackstopInterval   = "SOCKFLEET_BACKSTOP_INTERVAL"

	// Worker, stream mode: planned handoffs, make-before-break (docs/HANDOFF.md).
	EnvHandoff               = "SOCKFLEET_HANDOFF"                 // on (default) | off: drain releases, handoff wakeups refused
	EnvHandoffPrepareTimeout = "SOCKFLEET_HANDOFF_PREPARE_TIMEOUT" // target's item read + dial + open messages; default 10s
	EnvHandoffStandbyTimeout = "SOCKFLEET_HANDOFF_STANDBY_TIMEOUT" // a ready standby without a commit reads the item after this; default prepare + 10s
	EnvStandbyMaxMessages    = "SOCKFLEET_STANDBY_MAX_MESSAGES"    // messages a standby holds before the commit; default 10000
	EnvStandbyMaxBytes       = "SOCKFLEET_STANDBY_MAX_BYTES"       // bytes a standby holds before the commit; default 4194304
	EnvRESTPerHost           = "SOCKFLEET_REST_PER_HOST"           // spec requests (token, refresh, snapshot) in flight per host; default 4
)

// WorkerEnvVars names every variable the worker reads, so a tool that passes worker
// settings through (the local fleet's -worker-env) can refuse a misspelt name. A test
// of the worker's configuration keeps it complete.
var WorkerEnvVars = []string{
	EnvTable, EnvWorkerID, EnvListenAddr, EnvAdvertiseAddr, EnvMaxConnections,
	EnvLease, EnvRenewInterval, EnvRenewDeadline, EnvSkewMargin, EnvDrainTimeout,
	EnvSink, EnvSinkTimeout, EnvResume, EnvSeqPath, EnvBadMessages, EnvLogLevel,
	EnvWakeupSecret, EnvServiceName, EnvMode, EnvPollInterval, EnvClockOffset,
	EnvCheckpointInterval, EnvBackstopInterval,
	EnvConnectQuota, EnvSeqReset, EnvMaxSeqJump, EnvSecretsFile, EnvSecretsTTL, EnvIdleTimeout, EnvSinksAllowed,
	EnvHandoff, EnvHandoffPrepareTimeout, EnvHandoffStandbyTimeout, EnvStandbyMaxMessages, EnvStandbyMaxBytes,
	EnvRESTPerHost,
}

// WorkerContainer is the name of the worker's container in the ECS task definition.
// The reconciler releases a task's leases when this container has stopped, not when
// the task is asked to stop (a draining worker still runs then).
const WorkerContainer = "worker"

// Worker modes.
const (
	ModeStream  = "stream"
	ModePolling = "polling"
)

// PollingIndex is the seed's index on (desired_state, lease_expires_at_ms), created
// only for polling mode. Every heartbeat rewrites its sort key, which DynamoDB bills
// as two index writes; stream mode has no such index.
var PollingIndex = struct{ Name, PartitionKey, SortKey string }{
	Name: "desired_state-lease_expires_at_ms-index", PartitionKey: AttrDesiredState, SortKey: AttrLeaseExpires,
}

// SweepInputKey and SweepInputValue form the constant input of the scheduled rule
// that runs the backstop sweep, {"sockfleet":"sweep"}, by which the reconciler tells
// a sweep apart from a task-state event.
const (
	SweepInputKey   = "sockfleet"
	SweepInputValue = "sweep"
)

// DefaultWakeupPort is the worker's listener port: wakeups, /healthz, /metrics.
const DefaultWakeupPort = 8080

// CloudWatch metrics, emitted in Embedded Metric Format log lines and used by alarms,
// the dashboard and autoscaling.
const (
	MetricNamespace          = "Sockfleet"
	MetricOwned              = "OwnedConnections"    // per worker, each renew tick
	MetricSelfFences         = "SelfFences"          // per worker, when it happens
	MetricRenewFailures      = "RenewFailures"       // per worker
	MetricOrphaned           = "OrphanedConnections" // per sweep: STARTED with no live owner
	MetricOrphanedOldest     = "OrphanedOldestSeconds"
	MetricWakeupsUndelivered = "WakeupsUndelivered" // per reconciler batch
	MetricRebalanceMoves     = "RebalanceMoves"     // per rebalance round: moves the owners took on
	MetricRebalanceMinimum   = "RebalanceMinimum"   // per rebalance round: the fewest moves to balance
	MetricIdle               = "IdleConnections"    // per worker, each renew interval: connections with status idle now
	MetricQuotaWaiting       = "QuotaWaiting"       // per worker, each renew interval: dials waiting for the connect quota now

	// MetricDimService is the dimension on the workers' metrics (MetricOwned,
	// MetricSelfFences, MetricRenewFailures, MetricIdle, MetricQuotaWaiting), valued from EnvServiceName; autoscaling
	// tracks MetricOwned's average over it. The reconciler's metrics carry no
	// dimension. The orphan alarm treats a missing MetricOrphanedOldest as breaching,
	// so the sweep emits it on every run, zero included.
	MetricDimService = "ServiceName"
)
