// Command sockfleet operates a sockfleet table: add, start, stop and remove
// connections, list them and the workers, and watch both live; and tail a sink
// (Kinesis stream or file) to see what was delivered.
//
// It reaches DynamoDB through the standard AWS settings (profile, region,
// AWS_ENDPOINT_URL_DYNAMODB, …), so the same command works against the local stack
// and against AWS. Every write is exactly what an operator would do in the DynamoDB
// console: see "Console equivalents" in the README.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/sockfleet/sockfleet/shared/ddb"
	"github.com/sockfleet/sockfleet/shared/schema"
)

const usage = `usage: sockfleet [--table NAME] COMMAND

connections:
  conn add ID URL [flags]       create a connection (STARTED unless --stopped; flags below)
  conn start ID                 set desired_state = STARTED
  conn stop ID                  set desired_state = STOPPED
  conn url ID URL               change ws_url (the owner reconnects)
  conn rm ID                    delete the connection item
  conn ls                       list connections
workers:
  workers                       list registered workers
  watch [--interval 1s]         live view of connections and workers
messages:
  tail SOURCE [--conn ID] [-f] [--latest]
                                print what a sink received, one line per message, then
                                a summary per connection (count, seq range, gaps,
                                repeats); SOURCE is kinesis:STREAM (name or ARN) or
                                file:PATH; -f follows; --latest starts at the newest
                                Kinesis record instead of the oldest

` + specUsage + `
The table is --table, else $SOCKFLEET_TABLE, else "sockfleet". AWS access uses the
standard settings: AWS_PROFILE, AWS_REGION, AWS_ENDPOINT_URL_DYNAMODB,
AWS_ENDPOINT_URL_KINESIS, ...
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv(schema.EnvTable), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "sockfleet:", err)
		if errors.Is(err, errUsage) {
			fmt.Fprint(os.Stderr, usage)
			os.Exit(2)
		}
		os.Exit(1)
	}
}

var errUsage = errors.New("bad usage")

func run(ctx context.Context, args []string, table string, out io.Writer) error {
	if len(args) >= 2 && args[0] == "--table" {
		table, args = args[1], args[2:]
	}
	if table == "" {
		table = schema.DefaultTableName
	}
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(out, usage)
		return nil
	}
	cfg, err := ddb.LoadConfig(ctx)
	if err != nil {
		return err
	}
	db := dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) {
		o.RetryMaxAttempts = 2 // an operator wants a quick, clear failure, not a long retry
	})
	c := &cli{db: db, table: table, out: out, now: time.Now}
	if args[0] == "tail" {
		o, err := parseTail(args[1:])
		if err != nil {
			return err
		}
		return c.tail(ctx, cfg, o)
	}
	return c.dispatch(ctx, args)
}

// timeout bounds each call, so an unreachable endpoint fails fast and clearly.
const timeout = 10 * time.Second

func (c *cli) dispatch(ctx context.Context, args []string) error {
	switch {
	case args[0] == "conn" && len(args) >= 2:
		rest := args[2:]
		switch args[1] {
		case "add":
			id, url, stopped, spec, err := addArgs(rest)
			if err != nil {
				return err
			}
			return c.add(ctx, id, url, stopped, spec)
		case "start", "stop":
			if len(rest) != 1 {
				return fmt.Errorf("%w: conn %s ID", errUsage, args[1])
			}
			state := schema.Started
			if args[1] == "stop" {
				state = schema.Stopped
			}
			return c.setState(ctx, rest[0], state)
		case "url":
			if len(rest) != 2 {
				return fmt.Errorf("%w: conn url ID URL", errUsage)
			}
			return c.setURL(ctx, rest[0], rest[1])
		case "rm":
			if len(rest) != 1 {
				return fmt.Errorf("%w: conn rm ID", errUsage)
			}
			return c.remove(ctx, rest[0])
		case "ls":
			return c.listConns(ctx)
		}
	case args[0] == "workers" && len(args) == 1:
		return c.listWorkers(ctx)
	case args[0] == "watch":
		interval := time.Second
		if len(args) == 3 && args[1] == "--interval" {
			d, err := time.ParseDuration(args[2])
			if err != nil || d < 100*time.Millisecond {
				return fmt.Errorf("%w: --interval wants a duration of at least 100ms", errUsage)
			}
			interval = d
		} else if len(args) != 1 {
			return fmt.Errorf("%w: watch [--interval 1s]", errUsage)
		}
		return c.watch(ctx, interval)
	}
	return fmt.Errorf("%w: unknown command %q", errUsage, args)
}
