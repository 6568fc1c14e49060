// Command reconciler is the sockfleet reconciler Lambda function: stream-driven
// wakeups, crash release and the backstop sweep (see package handler). It only wires:
// environment → validated configuration → collaborators → lambda.StartHandlerFunc.
//
// Build: GOOS=linux GOARCH=arm64 CGO_ENABLED=0 go build -tags lambda.norpc \
// -o bin/reconciler/bootstrap ./functions/reconciler
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/sockfleet/sockfleet/functions/reconciler/handler"
	"github.com/sockfleet/sockfleet/functions/reconciler/reaper"
	"github.com/sockfleet/sockfleet/functions/reconciler/rounds"
	"github.com/sockfleet/sockfleet/functions/reconciler/sweep"
	"github.com/sockfleet/sockfleet/shared/ddb"
	"github.com/sockfleet/sockfleet/shared/lease"
	"github.com/sockfleet/sockfleet/shared/registry"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/tracing"
	"github.com/sockfleet/sockfleet/shared/wakeup"
)

func main() {
	log := slog.New(tracing.LogHandler(handler.WithRequestID(slog.NewJSONHandler(os.Stderr, nil))))
	// No shutdown: a Lambda process gets no exit hook, so each invocation flushes its
	// spans before it returns (flushed).
	_, err := tracing.Setup(context.Background(), tracing.ServiceReconciler)
	if err != nil {
		log.Error("reconciler: cannot start", "err", err)
		os.Exit(1)
	}
	h, err := setup(context.Background(), log)
	if err != nil {
		log.Error("reconciler: cannot start", "err", err)
		os.Exit(1)
	}
	lambda.StartHandlerFunc(flushed(h.Handle, log))
}

// flushed wraps a Lambda handler so that the spans of each invocation are exported
// before it returns: between invocations the function may be frozen, or never thawed.
func flushed(f func(context.Context, json.RawMessage) (any, error), log *slog.Logger) func(context.Context, json.RawMessage) (any, error) {
	return func(ctx context.Context, raw json.RawMessage) (any, error) {
		out, err := f(ctx, raw)
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		if ferr := tracing.Flush(fctx); ferr != nil {
			log.WarnContext(ctx, "export spans", "err", ferr)
		}
		return out, err
	}
}

func setup(ctx context.Context, log *slog.Logger) (*handler.Handler, error) {
	table := env(schema.EnvTable, schema.DefaultTableName)
	skew, err1 := duration(schema.EnvSkewMargin, schema.DefaultSkewMargin)
	nudge, err2 := duration(schema.EnvNudgeAfter, sweep.DefaultNudgeAfter)
	period, err3 := duration(schema.EnvSweepPeriod, sweep.DefaultPeriod)
	maxItems, err4 := integer(schema.EnvSweepMaxItems, sweep.DefaultMaxItems)
	segments, err5 := integer(schema.EnvSweepSegments, 1)
	if err := errors.Join(err1, err2, err3, err4, err5); err != nil {
		return nil, err
	}
	rcfg, err := roundsConfig()
	if err != nil {
		return nil, err
	}
	cfg, err := ddb.LoadConfig(ctx)
	if err != nil {
		return nil, err
	}
	secret, err := wakeupSecret(ctx, cfg)
	if err != nil {
		return nil, err
	}
	db := dynamodb.NewFromConfig(cfg)
	leases, err := lease.New(db, lease.Config{Table: table, SkewMargin: skew})
	if err != nil {
		return nil, err
	}
	reg := &registry.Registry{DB: db, Table: table}
	sw, err := sweep.New(db, leases, reg, sweep.Config{
		Table: table, SkewMargin: skew, NudgeAfter: nudge, MaxItems: maxItems, Segments: segments, Period: period,
	}, log)
	if err != nil {
		return nil, err
	}
	sender := &wakeup.Client{Secret: secret, HTTP: &http.Client{}}
	rr, err := rounds.New(rcfg, &rounds.Reader{DB: db, Table: table}, sender, log)
	if err != nil {
		return nil, err
	}
	return handler.New(handler.Config{ClusterARN: os.Getenv(schema.EnvClusterARN)}, handler.Deps{
		Registry: reg,
		Leases:   leases,
		Sweeper:  sw,
		Sender:   sender,
		Members:  &reaper.Reaper{Registry: reg, Leases: leases, Skew: skew, Hold: nudge, Log: log},
		Rounds:   rr,
		Log:      log,
		Metrics:  os.Stdout, // EMF lines; CloudWatch turns them into metrics
	})
}

// roundsConfig reads the rebalance knobs; rounds.New validates them.
func roundsConfig() (rounds.Config, error) {
	var c rounds.Config
	var errs [6]error
	switch v := os.Getenv(schema.EnvRebalance); v {
	case "", "on":
	case "off":
		c.Disabled = true
	default:
		errs[0] = fmt.Errorf("%s: %q, want on or off", schema.EnvRebalance, v)
	}
	c.Plan.Tolerance, errs[1] = fraction(schema.EnvRebalanceTolerance)
	c.Plan.MaxFraction, errs[2] = fraction(schema.EnvRebalanceMaxFraction)
	c.Plan.Cooling, errs[3] = duration(schema.EnvRebalanceCooling, 0)
	c.MinInterval, errs[4] = duration(schema.EnvRebalanceMinInterval, 0)
	c.Settle, errs[5] = duration(schema.EnvRebalanceSettle, 0)
	if err := errors.Join(errs[:]...); err != nil {
		return c, err
	}
	return c, c.Validate()
}

// fraction reads a number such as 0.1; unset is 0 (the default). Zero or out of
// range set explicitly is refused by rounds.Config.Validate.
func fraction(name string) (float64, error) {
	v := os.Getenv(name)
	if v == "" {
		return 0, nil
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", name, err)
	}
	if f == 0 {
		return 0, fmt.Errorf("%s: 0, want a fraction in (0, 1)", name)
	}
	return f, nil
}

// wakeupSecret reads the shared secret from the environment, or, given its ARN, from
// Secrets Manager once per cold start.
func wakeupSecret(ctx context.Context, cfg aws.Config) ([]byte, error) {
	if s := os.Getenv(schema.EnvWakeupSecret); s != "" {
		return wakeup.ParseSecret(s)
	}
	arn := os.Getenv(schema.EnvWakeupSecretARN)
	if arn == "" {
		return nil, fmt.Errorf("set %s or %s", schema.EnvWakeupSecret, schema.EnvWakeupSecretARN)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := secretsmanager.NewFromConfig(cfg).GetSecretValue(ctx, &secretsmanager.GetSecretValueInput{SecretId: &arn})
	if err != nil {
		return nil, fmt.Errorf("read wakeup secret %s: %w", arn, err)
	}
	return wakeup.ParseSecret(aws.ToString(out.SecretString))
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func duration(name string, def time.Duration) (time.Duration, error) {
	v := os.Getenv(name)
	if v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", name, err)
	}
	return d, nil
}

func integer(name string, def int) (int, error) {
	v := os.Getenv(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", name, err)
	}
	return n, nil
}
