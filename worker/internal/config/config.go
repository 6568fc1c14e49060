// Package config is the worker's configuration: a struct with defaults, loading from
// environment variables (through a getenv the caller passes, so only main touches
// the process environment), and a Validate that encodes the timing rules.
package config

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/sockfleet/sockfleet/shared/ddb"
	"github.com/sockfleet/sockfleet/shared/registry"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/wakeup"
	"github.com/sockfleet/sockfleet/worker/internal/owner"
	"github.com/sockfleet/sockfleet/worker/internal/sink"
	"github.com/sockfleet/sockfleet/worker/internal/stream"
)

// EnvECSMetadata is set by ECS in every container: the task metadata endpoint (v4).
const EnvECSMetadata = "ECS_CONTAINER_METADATA_URI_V4"

// Config is the worker's configuration.
type Config struct {
	Table          string
	WorkerID       string
	ListenAddr     string // wakeup, /healthz and /metrics listener
	AdvertiseAddr  string // host:port the reconciler calls
	MaxConnections int

	Lease         time.Duration
	RenewInterval time.Duration
	RenewDeadline time.Duration
	SkewMargin    time.Duration
	DrainTimeout  time.Duration

	Sink string // stdout | file:PATH | http(s)://URL | kinesis:STREAM (name or ARN)
	// SinksAllowed lists the destinations a connection's own sink attribute may name
	// (Kinesis stream names or ARNs, file:PATH), comma or space separated.
	SinksAllowed string
	// SinkTimeout bounds one sink write; 0 means min(10s, owner.SinkWindow). It must
	// fit inside the window, or a write checked just before the fence could land
	// after another worker may acquire.
	SinkTimeout time.Duration
	Resume      string // see stream.ParseResume
	SeqPath     string // JSON field path of a message's sequence; empty: count messages
	BadMessages string // count | skip | pass

	ConnectQuota string        // N/DURATION per upstream host, fleet-wide; see stream.ParseQuota and stream.TableGate
	SeqReset     string        // accept | halt
	MaxSeqJump   int64         // 0: no limit
	SecretsFile  string        // local secrets (make run); empty: Secrets Manager
	SecretsTTL   time.Duration // default 5m
	// IdleTimeout is the idle_timeout of a connection whose item sets none: no data
	// message for this long sets status idle (no reconnect). 0: off.
	IdleTimeout time.Duration

	WakeupSecret []byte
	ServiceName  string // ServiceName dimension of emitted metrics; empty: none

	// Mode is schema.ModeStream (the reconciler wakes this worker) or
	// schema.ModePolling (the seed's design: poll the seed's index for orphans).
	Mode         string
	PollInterval time.Duration // polling mode
	// ClockOffset shifts the wall clock used for lease expiry; chaos runs only.
	ClockOffset time.Duration

	// Stream mode (membership): a connection's last_seq and status are written at
	// most once per CheckpointInterval (the duplicate window after a crash), and its
	// item is read back every BackstopInterval to catch a lost wakeup.
	CheckpointInterval time.Duration
	BackstopInterval   time.Duration

	// Stream mode: planned handoffs (docs/HANDOFF.md). Handoff false: a drain releases
	// everything and handoff wakeups are answered target_unavailable.
	Handoff               bool
	HandoffPrepareTimeout time.Duration
	HandoffStandbyTimeout time.Duration // 0: the prepare timeout + 10s
	StandbyMaxMessages    int
	RESTPerHost           int // spec requests (token_request, refresh, snapshot) in flight per host
	StandbyMaxBytes       int
}

// PollingDefaults are the seed's timings: a 5 s heartbeat and a 20 s lease, with
// every worker polling for orphans every 5 s (with jitter). The margin is 2 s.
func PollingDefaults(c Config) Config {
	c.Mode = schema.ModePolling
	c.Lease, c.RenewInterval, c.RenewDeadline, c.SkewMargin = 20*time.Second, 5*time.Second, 15*time.Second, schema.DefaultSkewMargin
	c.PollInterval = 5 * time.Second
	return c
}

// Defaults (stream mode): the lease, renew interval and deadline time the worker's
// membership lease: one write per worker every 3 s (two billed, with the registry
// index), whatever its connection count. Fencing 7 s after the last good renew start
// tolerates one failed renew; the 11 s lease leaves 2 s (the sink window) after the
// fence against the lease less the 2 s skew margin. A hung worker's connections move
// once its lease lapsed beyond the margin: at most 13 s after its last renew, plus
// the reconciler's reaction (see docs/MEMBERSHIP.md). Checkpoints at most every 30 s
// per connection (at most 120 writes per connection-hour when streaming, none when
// idle); the backstop reads each connection once a minute (eventually consistent,
// 0.5 read unit each). The 60 s drain is half of ECS's 120 s stopTimeout.
func Defaults() Config {
	return Config{
		Table:              schema.DefaultTableName,
		ListenAddr:         ":" + strconv.Itoa(schema.DefaultWakeupPort),
		MaxConnections:     1000,
		Lease:              11 * time.Second,
		RenewInterval:      3 * time.Second,
		RenewDeadline:      7 * time.Second,
		SkewMargin:         schema.DefaultSkewMargin,
		CheckpointInterval: 30 * time.Second,
		BackstopInterval:   time.Minute,
		DrainTimeout:       60 * time.Second,

		Handoff:               true,
		HandoffPrepareTimeout: 10 * time.Second,
		StandbyMaxMessages:    10_000,
		StandbyMaxBytes:       4 << 20,
		RESTPerHost:           stream.DefaultRESTPerHost,
		Sink:                  "stdout",
		Resume:                stream.DefaultResume,
		BadMessages:           string(stream.BadCount),
		Mode:                  schema.ModeStream,
		IdleTimeout:           DefaultIdleTimeout,
	}
}

// DefaultIdleTimeout is the fleet's idle_timeout: a resume point the upstream never
// reaches, or a feed that stopped, says so in status within 5 minutes.
const DefaultIdleTimeout = 5 * time.Minute

// Validate checks c. Errors name the environment variable to fix.
func (c *Config) Validate() error {
	var errs []error
	bad := func(env, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", env, fmt.Sprintf(format, args...)))
	}
	if c.Table == "" {
		bad(schema.EnvTable, "empty")
	}
	if err := schema.ValidateID(c.WorkerID); err != nil {
		bad(schema.EnvWorkerID, "%v", err)
	}
	if _, _, err := net.SplitHostPort(c.ListenAddr); err != nil {
		bad(schema.EnvListenAddr, "want [host]:port: %v", err)
	}
	if h, p, err := net.SplitHostPort(c.AdvertiseAddr); err != nil || h == "" || p == "" || p == "0" {
		bad(schema.EnvAdvertiseAddr, "want host:port, got %q", c.AdvertiseAddr)
	}
	if c.MaxConnections <= 0 {
		bad(schema.EnvMaxConnections, "%d must be positive", c.MaxConnections)
	}
	if err := schema.CheckTimings(c.Lease, c.RenewDeadline, c.RenewInterval, c.SkewMargin); err != nil {
		errs = append(errs, err) // names the variable, as bad does
	}
	if w := owner.SinkWindow(c.Lease, c.RenewDeadline, c.SkewMargin); w <= 0 || c.SinkTimeout < 0 || c.SinkTimeout > w {
		bad(schema.EnvSinkTimeout, "%s must be positive and fit in the %s between the fence deadline and the lease less the skew margin",
			c.SinkTimeout, w)
	}
	if c.DrainTimeout <= 0 {
		bad(schema.EnvDrainTimeout, "%s must be positive", c.DrainTimeout)
	}
	switch c.Mode {
	case schema.ModeStream:
		if c.Lease > registry.MaxMemberLease {
			bad(schema.EnvLease, "%s: the membership lease may be at most %s (the reconciler's tombstone lease)", c.Lease, registry.MaxMemberLease)
		}
		if c.CheckpointInterval <= 0 {
			bad(schema.EnvCheckpointInterval, "%s must be positive", c.CheckpointInterval)
		}
		if c.BackstopInterval <= 0 {
			bad(schema.EnvBackstopInterval, "%s must be positive", c.BackstopInterval)
		}
		if c.Handoff && c.HandoffPrepareTimeout <= 0 {
			// A drain cuts its prepares short itself, to leave time for its releases.
			bad(schema.EnvHandoffPrepareTimeout, "%s must be positive", c.HandoffPrepareTimeout)
		}
		if c.Handoff && c.HandoffStandbyTimeout != 0 && c.HandoffStandbyTimeout <= c.HandoffPrepareTimeout {
			bad(schema.EnvHandoffStandbyTimeout, "%s must be longer than %s (%s)", c.HandoffStandbyTimeout, schema.EnvHandoffPrepareTimeout, c.HandoffPrepareTimeout)
		}
		if c.Handoff && (c.StandbyMaxMessages <= 0 || c.StandbyMaxBytes <= 0) {
			bad(schema.EnvStandbyMaxMessages, "%d messages and %s %d bytes must be positive", c.StandbyMaxMessages, schema.EnvStandbyMaxBytes, c.StandbyMaxBytes)
		}
	case schema.ModePolling:
		if c.PollInterval <= 0 {
			bad(schema.EnvPollInterval, "%s must be positive", c.PollInterval)
		}
	default:
		bad(schema.EnvMode, "%q: want %s or %s", c.Mode, schema.ModeStream, schema.ModePolling)
	}
	if c.ClockOffset < -c.SkewMargin || c.ClockOffset > c.SkewMargin {
		bad(schema.EnvClockOffset, "%s is outside the skew margin %s", c.ClockOffset, c.SkewMargin)
	}
	if err := checkSink(c.Sink); err != nil {
		bad(schema.EnvSink, "%v", err)
	}
	if _, err := schema.ParseSinksAllowed(c.SinksAllowed); err != nil {
		bad(schema.EnvSinksAllowed, "%v", err)
	}
	if _, err := stream.ParseResume(c.Resume); err != nil {
		bad(schema.EnvResume, "%v", err)
	}
	if _, err := stream.ParseSeqPath(c.SeqPath); err != nil {
		bad(schema.EnvSeqPath, "%v", err)
	}
	if _, err := stream.ParseBadPolicy(c.BadMessages); err != nil {
		bad(schema.EnvBadMessages, "%v", err)
	}
	if _, err := stream.ParseQuota(c.ConnectQuota); err != nil {
		bad(schema.EnvConnectQuota, "%v", err)
	}
	if c.SeqReset != "" && c.SeqReset != schema.SeqResetAccept && c.SeqReset != schema.SeqResetHalt {
		bad(schema.EnvSeqReset, "%q: want %s or %s", c.SeqReset, schema.SeqResetAccept, schema.SeqResetHalt)
	}
	if c.MaxSeqJump < 0 {
		bad(schema.EnvMaxSeqJump, "%d must not be negative", c.MaxSeqJump)
	}
	if c.IdleTimeout != 0 && c.IdleTimeout < schema.MinIdleTimeout {
		bad(schema.EnvIdleTimeout, "%s: want 0 (off) or at least %s", c.IdleTimeout, schema.MinIdleTimeout)
	}
	if c.RESTPerHost <= 0 {
		bad(schema.EnvRESTPerHost, "%d: want at least 1", c.RESTPerHost)
	}
	if c.SecretsTTL < 0 {
		bad(schema.EnvSecretsTTL, "%s must not be negative", c.SecretsTTL)
	}
	if _, err := wakeup.ParseSecret(string(c.WakeupSecret)); err != nil {
		bad(schema.EnvWakeupSecret, "%v", err)
	}
	return errors.Join(errs...)
}

// EffectiveSinkTimeout is SinkTimeout, or its default: 10 s, cut to the sink window.
func (c *Config) EffectiveSinkTimeout() time.Duration {
	if c.SinkTimeout > 0 {
		return c.SinkTimeout
	}
	return min(10*time.Second, owner.SinkWindow(c.Lease, c.RenewDeadline, c.SkewMargin))
}

// OpenSink builds the configured sink; the stdout sink writes to stdout. The Kinesis
// sink takes the standard AWS settings (AWS_REGION, AWS_ENDPOINT_URL_KINESIS, …)
// and the options kin.
func (c *Config) OpenSink(ctx context.Context, stdout io.Writer, kin sink.KinesisOptions) (sink.Sink, error) {
	if stream, ok := strings.CutPrefix(c.Sink, sink.KinesisPrefix); ok {
		aws, err := ddb.LoadConfig(ctx)
		if err != nil {
			return nil, fmt.Errorf("kinesis sink: %w", err)
		}
		return sink.NewKinesis(kinesis.NewFromConfig(aws), stream, kin)
	}
	return sink.Parse(c.Sink, stdout)
}

// checkSink checks a sink spec without opening anything.
func checkSink(spec string) error {
	if stream, ok := strings.CutPrefix(spec, sink.KinesisPrefix); ok {
		return sink.CheckKinesisStream(stream)
	}
	if path, ok := strings.CutPrefix(spec, "file:"); ok {
		if path == "" {
			return fmt.Errorf("sink %q: empty file path", spec)
		}
		return nil
	}
	_, err := sink.Parse(spec, io.Discard) // stdout and HTTP sinks open nothing
	return err
}

// Load reads the configuration from getenv over the defaults, fills the worker id and
// advertise address from ECS task metadata (or local fallbacks), and validates it.
func Load(ctx context.Context, getenv func(string) string) (Config, error) {
	c := Defaults()
	switch m := getenv(schema.EnvMode); m {
	case "", schema.ModeStream:
	case schema.ModePolling:
		c = PollingDefaults(c)
	default:
		c.Mode = m // Validate names the variable
	}
	var errs []error
	str := func(env string, dst *string) {
		if v := getenv(env); v != "" {
			*dst = v
		}
	}
	dur := func(env string, dst *time.Duration) {
		if v := getenv(env); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %q is not a duration like 20s", env, v))
				return
			}
			*dst = d
		}
	}
	str(schema.EnvTable, &c.Table)
	str(schema.EnvWorkerID, &c.WorkerID)
	str(schema.EnvListenAddr, &c.ListenAddr)
	str(schema.EnvAdvertiseAddr, &c.AdvertiseAddr)
	if v := getenv(schema.EnvMaxConnections); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %q is not an integer", schema.EnvMaxConnections, v))
		}
		c.MaxConnections = n
	}
	dur(schema.EnvLease, &c.Lease)
	dur(schema.EnvRenewInterval, &c.RenewInterval)
	dur(schema.EnvRenewDeadline, &c.RenewDeadline)
	dur(schema.EnvSkewMargin, &c.SkewMargin)
	dur(schema.EnvDrainTimeout, &c.DrainTimeout)
	dur(schema.EnvSinkTimeout, &c.SinkTimeout)
	dur(schema.EnvPollInterval, &c.PollInterval)
	dur(schema.EnvClockOffset, &c.ClockOffset)
	dur(schema.EnvCheckpointInterval, &c.CheckpointInterval)
	dur(schema.EnvBackstopInterval, &c.BackstopInterval)
	dur(schema.EnvHandoffPrepareTimeout, &c.HandoffPrepareTimeout)
	dur(schema.EnvHandoffStandbyTimeout, &c.HandoffStandbyTimeout)
	switch v := getenv(schema.EnvHandoff); v {
	case "":
	case "on", "off":
		c.Handoff = v == "on"
	default:
		errs = append(errs, fmt.Errorf("%s: %q: want on or off", schema.EnvHandoff, v))
	}
	for env, dst := range map[string]*int{schema.EnvStandbyMaxMessages: &c.StandbyMaxMessages, schema.EnvStandbyMaxBytes: &c.StandbyMaxBytes,
		schema.EnvRESTPerHost: &c.RESTPerHost} {
		if v := getenv(env); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %q is not an integer", env, v))
			}
			*dst = n
		}
	}
	str(schema.EnvSink, &c.Sink)
	str(schema.EnvResume, &c.Resume)
	c.SeqPath = getenv(schema.EnvSeqPath)
	str(schema.EnvBadMessages, &c.BadMessages)
	str(schema.EnvConnectQuota, &c.ConnectQuota)
	str(schema.EnvSeqReset, &c.SeqReset)
	str(schema.EnvSecretsFile, &c.SecretsFile)
	str(schema.EnvSinksAllowed, &c.SinksAllowed)
	dur(schema.EnvSecretsTTL, &c.SecretsTTL)
	dur(schema.EnvIdleTimeout, &c.IdleTimeout)
	if v := getenv(schema.EnvMaxSeqJump); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %q is not an integer", schema.EnvMaxSeqJump, v))
		}
		c.MaxSeqJump = n
	}
	c.WakeupSecret = []byte(getenv(schema.EnvWakeupSecret))
	c.ServiceName = getenv(schema.EnvServiceName)
	if len(errs) > 0 {
		return c, errors.Join(errs...)
	}
	if c.Mode != schema.ModeStream && c.Mode != schema.ModePolling {
		return c, fmt.Errorf("%s: %q: want %s or %s", schema.EnvMode, c.Mode, schema.ModeStream, schema.ModePolling)
	}

	port := listenPort(c.ListenAddr)
	if c.WorkerID == "" || c.AdvertiseAddr == "" {
		taskID, ip := "", ""
		if uri := getenv(EnvECSMetadata); uri != "" {
			var err error
			if taskID, ip, err = ECSMetadata(ctx, http.DefaultClient, uri); err != nil {
				return c, fmt.Errorf("%s: %w", EnvECSMetadata, err)
			}
		}
		if c.WorkerID == "" {
			c.WorkerID = taskID
			if c.WorkerID == "" {
				host, _ := os.Hostname()
				c.WorkerID = fmt.Sprintf("%s-%d", sanitize(host), os.Getpid())
			}
		}
		if c.AdvertiseAddr == "" {
			if ip == "" {
				ip = "127.0.0.1"
			}
			c.AdvertiseAddr = net.JoinHostPort(ip, port)
		}
	}
	if _, _, err := net.SplitHostPort(c.AdvertiseAddr); err != nil && !strings.Contains(c.AdvertiseAddr, ":") {
		c.AdvertiseAddr = net.JoinHostPort(c.AdvertiseAddr, port) // a bare host: the listener's port
	}
	return c, c.Validate()
}

func listenPort(addr string) string {
	if _, p, err := net.SplitHostPort(addr); err == nil && p != "" && p != "0" {
		return p
	}
	return strconv.Itoa(schema.DefaultWakeupPort)
}

// sanitize keeps a hostname usable inside an id.
func sanitize(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c <= ' ' || c > '~' || c == '#' {
			b[i] = '_'
		}
	}
	if len(b) == 0 {
		return "worker"
	}
	return string(b)
}

// ECSMetadata reads the task id (the last part of the task ARN) and the task's
// private IPv4 address from the ECS task metadata endpoint v4 at uri.
func ECSMetadata(ctx context.Context, hc *http.Client, uri string) (taskID, ip string, err error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(uri, "/")+"/task", nil)
	if err != nil {
		return "", "", fmt.Errorf("task metadata: %w", err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return "", "", fmt.Errorf("task metadata: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", "", fmt.Errorf("task metadata: status %d", resp.StatusCode)
	}
	var meta struct {
		TaskARN    string
		Containers []struct {
			Networks []struct {
				IPv4Addresses []string
			}
		}
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&meta); err != nil {
		return "", "", fmt.Errorf("task metadata: %w", err)
	}
	if i := strings.LastIndexByte(meta.TaskARN, '/'); i >= 0 {
		taskID = meta.TaskARN[i+1:]
	}
	for _, c := range meta.Containers {
		for _, n := range c.Networks {
			for _, a := range n.IPv4Addresses {
				if ip == "" && a != "" {
					ip = a
				}
			}
		}
	}
	if taskID == "" || ip == "" {
		return "", "", fmt.Errorf("task metadata: no task ARN or IPv4 address (ARN %q)", meta.TaskARN)
	}
	return taskID, ip, nil
}
