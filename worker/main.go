// Command worker owns upstream WebSocket connections through DynamoDB leases. It is
// configured by environment variables (see shared/schema/env.go); `worker healthcheck`
// probes a running worker's /healthz and exits 0 or 1, for the container health
// check of a distroless image; `worker checkconfig` validates the environment as a
// start would, says what is wrong, and exits 0 or 2 without starting anything.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/sockfleet/sockfleet/shared/ddb"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/tracing"
	"github.com/sockfleet/sockfleet/worker/internal/app"
	"github.com/sockfleet/sockfleet/worker/internal/config"
	"github.com/sockfleet/sockfleet/worker/internal/secrets"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "healthcheck" {
		os.Exit(healthcheck(os.Getenv(schema.EnvListenAddr)))
	}
	if len(os.Args) > 1 && os.Args[1] == "checkconfig" {
		os.Exit(checkConfig(os.Getenv, os.Stderr))
	}
	log := slog.New(tracing.LogHandler(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: logLevel(os.Getenv(schema.EnvLogLevel))})))
	if err := run(log); err != nil {
		log.Error("worker failed", "err", err)
		os.Exit(1)
	}
}

func run(log *slog.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	shutdown, err := tracing.Setup(ctx, tracing.ServiceWorker)
	if err != nil {
		return err
	}
	defer func() {
		// After the drain: its handoffs' and releases' spans are exported too.
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := shutdown(sctx); err != nil {
			log.Warn("export spans at exit", "err", err)
		}
	}()
	cfg, err := config.Load(ctx, os.Getenv)
	if err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	awsCfg, err := ddb.LoadConfig(ctx)
	if err != nil {
		return err
	}
	deps := app.Deps{
		DB:     dynamodb.NewFromConfig(awsCfg),
		Stdout: os.Stdout,
		Stderr: os.Stderr,
		Log:    log,
	}
	if cfg.SecretsFile == "" {
		deps.Secrets = &secrets.Cache{Source: secrets.Manager{Client: secretsmanager.NewFromConfig(awsCfg)}, TTL: cfg.SecretsTTL}
	}
	a, err := app.New(cfg, deps)
	if err != nil {
		return err
	}
	return a.Run(ctx)
}

// checkConfig loads the configuration from getenv as run does, and reports.
func checkConfig(getenv func(string) string, out io.Writer) int {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := config.Load(ctx, getenv); err != nil {
		fmt.Fprintln(out, "configuration:", err)
		return 2
	}
	return 0
}

// healthcheck GETs /healthz on the local listener and returns the exit code.
func healthcheck(listen string) int {
	port := strconv.Itoa(schema.DefaultWakeupPort)
	if _, p, err := net.SplitHostPort(listen); err == nil && p != "" {
		port = p
	}
	c := &http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get("http://127.0.0.1:" + port + "/healthz")
	if err != nil {
		fmt.Fprintln(os.Stderr, "healthcheck:", err)
		return 1
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintln(os.Stderr, "healthcheck: status", resp.StatusCode)
		return 1
	}
	return 0
}

func logLevel(s string) slog.Level {
	var l slog.Level
	if l.UnmarshalText([]byte(s)) != nil {
		return slog.LevelInfo
	}
	return l
}
