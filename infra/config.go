package main

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sockfleet/sockfleet/shared/schema"
)

// Context keys: the knobs an operator sets in cdk.json or with `cdk deploy -c key=value`.
const (
	ctxMaxConnections = "maxConnectionsPerTask"
	ctxDesiredCount   = "desiredCount"
	ctxMaxCount       = "maxCount"
	ctxLeaseSeconds   = "leaseSeconds"
	ctxRenewSeconds   = "renewSeconds"
	ctxVpcID          = "vpcId"
	ctxRetention      = "retention"
	ctxKinesisStream  = "kinesisStream"
	ctxSecretsPrefix  = "connectionSecretsPrefix"
	// KMS keys (customer-managed) of what the workers read or write: the imported
	// Kinesis stream's server-side encryption key, and the connection secrets' key.
	ctxKinesisKMSKey = "kinesisKmsKeyArn"
	ctxSecretsKMSKey = "connectionSecretsKmsKeyArn"
	ctxNatGateways   = "natGateways"
	// ctxLegacyIndex keeps the ALL-projected registry index of earlier versions next
	// to the KEYS_ONLY one, for the first of the two deploys that move a deployed
	// table (docs/MEMBERSHIP.md, "Moving a deployed table").
	ctxLegacyIndex = "keepLegacyRegistryIndex"
	// ctxTracing (tracing.go) turns the export of spans to X-Ray on (the default) or off.
)

// Values of the kinesisStream knob besides a stream ARN: KinesisCreate (the default)
// creates a stream in the stack; KinesisStdout (or "") has the workers write to
// their stdout, which the awslogs driver ships to CloudWatch Logs.
const (
	KinesisCreate = "create"
	KinesisStdout = "stdout"
)

// skewMargin is the clock-skew allowance shared by the worker (it self-fences this
// much before its lease ends in anyone's view, twice over) and the sweep (it only
// releases leases expired by more than this): the fleet's, schema.DefaultSkewMargin.
const skewMargin = schema.DefaultSkewMargin

// Config is what the context knobs decide. The zero value is not valid; start from
// DefaultConfig.
type Config struct {
	MaxConnectionsPerTask int // a worker's capacity, SOCKFLEET_MAX_CONNECTIONS
	DesiredCount          int // the autoscaling floor (MinCapacity); the service itself sets no count
	MaxCount              int // autoscaling ceiling
	LeaseSeconds          int // lease duration
	RenewSeconds          int // renew interval
	VpcID                 string
	RetentionDays         int // CloudWatch Logs retention of the worker and reconciler logs
	// KinesisStream is where workers deliver: KinesisCreate (the default) a new
	// on-demand stream in the stack, an existing stream's ARN, or KinesisStdout ("" too)
	// their stdout (CloudWatch Logs).
	KinesisStream string
	// SecretsPrefix: the workers may read the Secrets Manager secrets whose names
	// start with it, for connection specs' {{secret:NAME}} headers. Empty: none.
	SecretsPrefix string
	// KinesisKMSKeyARN is the customer-managed KMS key an imported stream
	// (KinesisStream an ARN) is encrypted with; the task role gets
	// kms:GenerateDataKey on it, which a producer needs. Empty: the stream uses no
	// key or the AWS-managed one (alias/aws/kinesis), which needs no grant.
	KinesisKMSKeyARN string
	// SecretsKMSKeyARN is the customer-managed KMS key of the connection secrets
	// under SecretsPrefix; the task role gets kms:Decrypt on it, which
	// GetSecretValue needs. Empty: the secrets use the AWS-managed key.
	SecretsKMSKeyARN string
	// NatGateways is the NAT gateway count of a VPC the stack creates (VpcID
	// empty): MaxAZs (the default) puts one in each AZ, so an AZ outage takes only
	// its own workers' egress with it; 1 shares one across the AZs for less money.
	NatGateways int
	// KeepLegacyRegistryIndex keeps schema.LegacyRegistryIndex on the table. A GSI's
	// projection cannot change in place, and CloudFormation creates or deletes at most
	// one GSI per update, so a stack deployed before the registry index became
	// KEYS_ONLY adds the new index with this set, then drops the old one without it.
	KeepLegacyRegistryIndex bool
	// Tracing exports the workers' and the reconciler's spans to X-Ray (tracing.go);
	// false: no collector, no grant, no OTEL_* settings.
	Tracing bool
	// SinkStreams are the Kinesis streams (names or ARNs, comma-separated) a
	// connection's own sink attribute may name; the task role may PutRecords to each
	// (sinks.go). A string, so a Config stays comparable.
	SinkStreams string
}

// DefaultConfig returns the defaults, the same values cdk.json carries.
//
// Lease 11 s and renew 3 s: these time the worker's membership lease (one write per
// worker, not per connection; see docs/MEMBERSHIP.md). A hung worker's connections
// move once its lease lapsed beyond the skew margin, so the lease sets that failover
// time; the renew deadline (lease − 2 × margin = 7 s) tolerates one failed renew.
func DefaultConfig() Config {
	return Config{
		MaxConnectionsPerTask: 500,
		DesiredCount:          2,
		MaxCount:              10,
		LeaseSeconds:          11,
		RenewSeconds:          3,
		RetentionDays:         30,
		KinesisStream:         KinesisCreate,
		SecretsPrefix:         "sockfleet/connections/",
		NatGateways:           MaxAZs,
		Tracing:               true,
	}
}

// RenewDeadline is how long a worker keeps streaming without a successful renew:
// the lease minus twice the skew margin, so it stops well before the lease can
// expire in anyone else's view.
func (c Config) RenewDeadline() time.Duration {
	return time.Duration(c.LeaseSeconds)*time.Second - 2*skewMargin
}

// SinkIsStdout reports whether the workers deliver to their stdout rather than to
// a Kinesis stream.
func (c Config) SinkIsStdout() bool {
	return c.KinesisStream == "" || c.KinesisStream == KinesisStdout
}

// ConnectionsTarget is the autoscaling target for connections per task: 60 % of
// capacity, so that when one task of a small fleet dies, the survivors have room
// for its connections while a replacement starts.
func (c Config) ConnectionsTarget() float64 {
	return math.Max(1, math.Floor(float64(c.MaxConnectionsPerTask)*0.6))
}

// MaxAZs is how many availability zones a VPC the stack creates spans.
const MaxAZs = 2

var (
	// A key ARN, not an alias: IAM matches a KMS request against the key's ARN.
	kmsKeyARNPattern  = regexp.MustCompile(`^arn:aws[a-z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/[a-zA-Z0-9-]{1,128}$`)
	vpcIDPattern      = regexp.MustCompile(`^vpc-[0-9a-f]{8}([0-9a-f]{9})?$`)
	kinesisARNPattern = regexp.MustCompile(`^arn:aws[a-z-]*:kinesis:[a-z0-9-]+:[0-9]{12}:stream/[a-zA-Z0-9_.-]{1,128}$`)
)
var secretsPrefixPattern = regexp.MustCompile(`^[A-Za-z0-9/_+=.@-]{0,256}$`)

// Validate checks every knob and the timing rules: the deployment's, lease > renew
// deadline ≥ 2 × renew interval, and the workers' own (schema.CheckTimings), and
// reports all problems at once.
func (c Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("context %s: "+format, append([]any{key}, args...)...))
	}
	if c.MaxConnectionsPerTask < 1 || c.MaxConnectionsPerTask > 10000 {
		bad(ctxMaxConnections, "%d, want 1 to 10000", c.MaxConnectionsPerTask)
	}
	if c.DesiredCount < 1 {
		bad(ctxDesiredCount, "%d, want at least 1", c.DesiredCount)
	}
	if c.MaxCount < c.DesiredCount || c.MaxCount > 1000 {
		bad(ctxMaxCount, "%d, want %s (%d) to 1000", c.MaxCount, ctxDesiredCount, c.DesiredCount)
	}
	if c.RenewSeconds < 1 {
		bad(ctxRenewSeconds, "%d, want at least 1", c.RenewSeconds)
	}
	if c.LeaseSeconds < 1 || c.LeaseSeconds > schema.MaxMemberLeaseSeconds {
		bad(ctxLeaseSeconds, "%d, want 1 to %d (the membership lease)", c.LeaseSeconds, schema.MaxMemberLeaseSeconds)
	} else if c.RenewSeconds >= 1 && c.RenewDeadline() < 2*time.Duration(c.RenewSeconds)*time.Second {
		bad(ctxLeaseSeconds, "%d with %s %d: the renew deadline (lease − %v) must leave room for two renew intervals, so %s must be at least %d",
			c.LeaseSeconds, ctxRenewSeconds, c.RenewSeconds, 2*skewMargin, ctxLeaseSeconds, 2*c.RenewSeconds+int(2*skewMargin/time.Second))
	} else if c.RenewSeconds >= 1 {
		// The rule above is the deployment's, stricter than the workers' own; the
		// workers' must hold too, or they would refuse to start.
		lease, renew := time.Duration(c.LeaseSeconds)*time.Second, time.Duration(c.RenewSeconds)*time.Second
		if err := schema.CheckTimings(lease, c.RenewDeadline(), renew, skewMargin); err != nil {
			bad(ctxLeaseSeconds, "%d with %s %d: %v", c.LeaseSeconds, ctxRenewSeconds, c.RenewSeconds, err)
		}
	}
	if c.VpcID != "" && !vpcIDPattern.MatchString(c.VpcID) {
		bad(ctxVpcID, "%q is not a VPC id (vpc-…)", c.VpcID)
	}
	if !c.SinkIsStdout() && c.KinesisStream != KinesisCreate && !kinesisARNPattern.MatchString(c.KinesisStream) {
		bad(ctxKinesisStream, "%q: want %q (a new stream), a stream ARN (arn:aws:kinesis:REGION:ACCOUNT:stream/NAME) or %q (or empty)",
			c.KinesisStream, KinesisCreate, KinesisStdout)
	}
	if c.KinesisKMSKeyARN != "" {
		switch {
		case !kmsKeyARNPattern.MatchString(c.KinesisKMSKeyARN):
			bad(ctxKinesisKMSKey, "%q is not a KMS key ARN (arn:aws:kms:REGION:ACCOUNT:key/ID)", c.KinesisKMSKeyARN)
		case !kinesisARNPattern.MatchString(c.KinesisStream):
			bad(ctxKinesisKMSKey, "set with %s %q: a key belongs to an existing stream, given by ARN (a stream the stack creates uses the AWS-managed key)",
				ctxKinesisStream, c.KinesisStream)
		}
	}
	if c.SecretsKMSKeyARN != "" {
		switch {
		case !kmsKeyARNPattern.MatchString(c.SecretsKMSKeyARN):
			bad(ctxSecretsKMSKey, "%q is not a KMS key ARN (arn:aws:kms:REGION:ACCOUNT:key/ID)", c.SecretsKMSKeyARN)
		case c.SecretsPrefix == "":
			bad(ctxSecretsKMSKey, "set with an empty %s: the workers read no secrets", ctxSecretsPrefix)
		}
	}
	if c.NatGateways < 1 || c.NatGateways > MaxAZs {
		bad(ctxNatGateways, "%d, want 1 (one shared) to %d (one per AZ)", c.NatGateways, MaxAZs)
	}
	if !secretsPrefixPattern.MatchString(c.SecretsPrefix) {
		bad(ctxSecretsPrefix, "%q: want up to 256 of the characters a secret name may hold (A-Z a-z 0-9 / _ + = . @ -)", c.SecretsPrefix)
	}
	if !validRetention(c.RetentionDays) {
		bad(ctxRetention, "%d days; CloudWatch Logs accepts one of %v", c.RetentionDays, retentionChoices())
	}
	return errors.Join(errs...)
}

func validRetention(days int) bool {
	_, ok := retentionEnum[days]
	return ok
}

// retentionChoices lists the day counts CloudWatch Logs accepts, for error messages.
func retentionChoices() []int {
	days := make([]int, 0, len(retentionEnum))
	for d := range retentionEnum {
		days = append(days, d)
	}
	slices.Sort(days)
	return days
}

// ConfigFromContext reads the knobs through get (the App's TryGetContext, or a map
// in tests), keeps defaults for unset ones and validates the result. Values may be
// JSON numbers (cdk.json) or strings (`-c key=value`).
func ConfigFromContext(get func(key string) any) (Config, error) {
	c := DefaultConfig()
	var errs []error
	ints := []struct {
		key string
		dst *int
	}{
		{ctxMaxConnections, &c.MaxConnectionsPerTask},
		{ctxDesiredCount, &c.DesiredCount},
		{ctxMaxCount, &c.MaxCount},
		{ctxLeaseSeconds, &c.LeaseSeconds},
		{ctxRenewSeconds, &c.RenewSeconds},
		{ctxRetention, &c.RetentionDays},
		{ctxNatGateways, &c.NatGateways},
	}
	for _, f := range ints {
		v := get(f.key)
		if v == nil {
			continue
		}
		n, err := toInt(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("context %s: %w", f.key, err))
			continue
		}
		*f.dst = n
	}
	strs := []struct {
		key string
		dst *string
	}{
		{ctxVpcID, &c.VpcID},
		{ctxKinesisStream, &c.KinesisStream},
		{ctxKinesisKMSKey, &c.KinesisKMSKeyARN},
		{ctxSecretsKMSKey, &c.SecretsKMSKeyARN},
	}
	for _, f := range strs {
		v := get(f.key)
		if v == nil {
			continue
		}
		s, ok := v.(string)
		if !ok {
			errs = append(errs, fmt.Errorf("context %s: %v is not a string", f.key, v))
		}
		*f.dst = strings.TrimSpace(s)
	}
	if v := get(ctxSecretsPrefix); v != nil {
		s, ok := v.(string)
		if !ok {
			errs = append(errs, fmt.Errorf("context %s: %v is not a string", ctxSecretsPrefix, v))
		}
		c.SecretsPrefix = strings.TrimSpace(s)
	}
	if v := get(ctxTracing); v != nil {
		b, err := toBool(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("context %s: %w", ctxTracing, err))
		}
		c.Tracing = b
	}
	if v := get(ctxLegacyIndex); v != nil {
		b, err := toBool(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("context %s: %w", ctxLegacyIndex, err))
		}
		c.KeepLegacyRegistryIndex = b
	}
	if v := get(ctxSinkStreams); v != nil {
		var err error
		if c.SinkStreams, err = sinkStreamsFrom(v); err != nil {
			errs = append(errs, fmt.Errorf("context %s: %w", ctxSinkStreams, err))
		}
	}
	if len(errs) > 0 {
		return c, errors.Join(errs...)
	}
	return c, c.Validate()
}

func toInt(v any) (int, error) {
	switch x := v.(type) {
	case float64:
		if x != math.Trunc(x) || math.Abs(x) > math.MaxInt32 {
			return 0, fmt.Errorf("%v is not a whole number", x)
		}
		return int(x), nil
	case int:
		return x, nil
	case string:
		n, err := strconv.Atoi(strings.TrimSpace(x))
		if err != nil {
			return 0, fmt.Errorf("%q is not a whole number", x)
		}
		return n, nil
	}
	return 0, fmt.Errorf("%v (%T) is not a whole number", v, v)
}

func toBool(v any) (bool, error) {
	switch x := v.(type) {
	case bool:
		return x, nil
	case string:
		switch strings.TrimSpace(x) {
		case "true":
			return true, nil
		case "false", "":
			return false, nil
		}
		return false, fmt.Errorf("%q: want true or false", x)
	}
	return false, fmt.Errorf("%v (%T): want true or false", v, v)
}
