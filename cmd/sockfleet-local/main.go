// Command sockfleet-local runs sockfleet on one machine: the local DynamoDB engine,
// file-backed under .local/ so state survives restarts, and the table from the
// shared schema. `make run` starts it.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/sockfleet/sockfleet/shared/ddb"
	"github.com/sockfleet/sockfleet/shared/dynoxide"
	"github.com/sockfleet/sockfleet/shared/schema"
)

func main() {
	dir := flag.String("dir", ".local", "folder for local state (git-ignored)")
	port := flag.Int("db-port", 8000, "port of the local DynamoDB engine on 127.0.0.1")
	table := flag.String("table", schema.DefaultTableName, "table name")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(*dir, *port, *table, log); err != nil {
		fmt.Fprintln(os.Stderr, "sockfleet-local:", err)
		os.Exit(1)
	}
}

func run(dir string, port int, table string, log *slog.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	logFile, err := os.Create(filepath.Join(dir, "dynoxide.log"))
	if err != nil {
		return err
	}
	defer logFile.Close()
	dbPath := filepath.Join(dir, "dynoxide.db")
	engine, err := dynoxide.Start(dynoxide.Options{Port: port, DBPath: dbPath, Log: logFile})
	if err != nil {
		return fmt.Errorf("%w (is something else listening on port %d? pass -db-port)", err, port)
	}
	defer engine.Stop()
	db := dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("local", "local", ""),
		BaseEndpoint: aws.String(engine.Endpoint),
	})
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	created, err := ddb.EnsureTable(cctx, db, table)
	cancel()
	if err != nil {
		return err
	}
	if created {
		log.Info("created table", "table", table)
	} else {
		log.Info("table already exists", "table", table)
	}
	fmt.Printf(`sockfleet local stack is running (Ctrl-C stops it)
  DynamoDB engine  %s  (data in %s)
  table            %s

Point any AWS tool or sockfleet binary at it with:
  export AWS_ENDPOINT_URL_DYNAMODB=%[1]s AWS_ENDPOINT_URL_DYNAMODB_STREAMS=%[1]s
  export AWS_REGION=us-east-1 AWS_ACCESS_KEY_ID=local AWS_SECRET_ACCESS_KEY=local SOCKFLEET_TABLE=%[3]s
`, engine.Endpoint, dbPath, table)
	<-ctx.Done()
	log.Info("stopping")
	return nil
}
