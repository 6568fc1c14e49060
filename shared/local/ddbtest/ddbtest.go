// Package ddbtest runs the real local DynamoDB engine (dynoxide) for tests.
//
// One engine process serves a whole test binary; every test gets a table of its own.
// Use it from TestMain so the process stops when the tests end:
//
//	func TestMain(m *testing.M) { ddbtest.Main(m) }
//
// The engine is installed by `make tools` (which `make test` runs first).
package ddbtest

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodbstreams"
	"github.com/sockfleet/sockfleet/shared/local/dynoxide"
	"github.com/sockfleet/sockfleet/shared/local/localddb"
	"github.com/sockfleet/sockfleet/shared/local/localengine/enginetest"
)

// Env is one test's view of the engine.
type Env struct {
	Endpoint string // http://127.0.0.1:PORT
	Table    string
	DB       *dynamodb.Client
	Streams  *dynamodbstreams.Client
}

// Environ returns the standard AWS settings that point a child process at the engine.
func (e *Env) Environ() []string {
	return []string{
		"AWS_ENDPOINT_URL_DYNAMODB=" + e.Endpoint,
		"AWS_ENDPOINT_URL_DYNAMODB_STREAMS=" + e.Endpoint,
		"AWS_REGION=us-east-1",
		"AWS_ACCESS_KEY_ID=local",
		"AWS_SECRET_ACCESS_KEY=local",
	}
}

// Config returns an SDK config for the engine, with transport t (nil: default).
func (e *Env) Config(t http.RoundTripper) aws.Config {
	cfg := aws.Config{
		Region:      "us-east-1",
		Credentials: credentials.NewStaticCredentialsProvider("local", "local", ""),
	}
	if t != nil {
		cfg.HTTPClient = &http.Client{Transport: t}
	}
	return cfg
}

// Client returns a DynamoDB client for the engine, with optional client options.
func (e *Env) Client(t http.RoundTripper, opts ...func(*dynamodb.Options)) *dynamodb.Client {
	opts = append([]func(*dynamodb.Options){func(o *dynamodb.Options) { o.BaseEndpoint = aws.String(e.Endpoint) }}, opts...)
	return dynamodb.NewFromConfig(e.Config(t), opts...)
}

var (
	engine = enginetest.New(func() (*dynoxide.Proc, error) { return dynoxide.Start(dynoxide.Options{}) })
	tables atomic.Int64
)

// Main runs the tests and stops the engine afterwards.
func Main(m *testing.M) { engine.Main(m) }

// Stop ends the engine, if it was started: for a TestMain that runs more than one
// engine.
func Stop() { engine.Stop() }

// New starts the engine on first use and creates a fresh table for t.
func New(t testing.TB) *Env {
	t.Helper()
	ep, err := Endpoint()
	if err != nil {
		t.Fatal(err)
	}
	e := &Env{Endpoint: ep}
	e.DB = e.Client(nil)
	e.Streams = dynamodbstreams.NewFromConfig(e.Config(nil), func(o *dynamodbstreams.Options) {
		o.BaseEndpoint = aws.String(ep)
	})
	e.Table = fmt.Sprintf("t%d_%s", tables.Add(1), enginetest.Sanitize(t.Name(), 200))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := localddb.EnsureTable(ctx, e.DB, e.Table); err != nil {
		t.Fatalf("create test table: %v", err)
	}
	return e
}

// Endpoint starts the engine once per process and returns its URL.
func Endpoint() (string, error) { return engine.Endpoint() }
