// Command sockfleet-local runs the whole sockfleet system on one machine: the local
// DynamoDB engine (file-backed under .local/, so state survives restarts), the table
// from the shared schema, the demo upstream, the real reconciler binary under the
// Lambda runtime emulator fed by the local stream poller, a supervisor playing ECS
// with N worker processes, the scheduled sweep, and a few demo connections.
// `make run` builds the binaries and starts it; Ctrl-C drains and stops everything.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"github.com/sockfleet/sockfleet/shared/local/cdkout"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	ktypes "github.com/aws/aws-sdk-go-v2/service/kinesis/types"
	"github.com/sockfleet/sockfleet/shared/local/demoupstream"
	"github.com/sockfleet/sockfleet/shared/local/dynoxide"
	"github.com/sockfleet/sockfleet/shared/local/fleet"
	"github.com/sockfleet/sockfleet/shared/local/jaeger"
	"github.com/sockfleet/sockfleet/shared/local/kinesalite"
	"github.com/sockfleet/sockfleet/shared/local/localddb"
	"github.com/sockfleet/sockfleet/shared/local/netrules"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

type options struct {
	dir, table, bin, rie    string
	dbPort, basePort, demos int
	workers                 int
	lambdaAddr, upstream    string
	sweep                   time.Duration
	rate                    float64
	workerEnv               envList // explicit worker settings, NAME=VALUE
	sink                    string  // file or kinesis
	kinesisPort             int
	iam                     bool   // enforce the synthesized stack's IAM policies
	network                 bool   // enforce the template's security group rules
	template                string // the template; "": cdk.out's, found upward
	tracing                 bool   // run Jaeger and have every process export spans to it
	jaegerPort, otlpPort    int    // Jaeger's UI and query API, and its OTLP/HTTP receiver
	viewerPort              int    // the connection trace pages (jaeger.Viewer)
	jaegerBin               string
}

// envList is a repeatable NAME=VALUE flag.
type envList []string

func (l *envList) String() string { return strings.Join(*l, " ") }
func (l *envList) Set(kv string) error {
	if err := fleet.CheckWorkerEnv([]string{kv}); err != nil {
		return err
	}
	*l = append(*l, kv)
	return nil
}

func main() {
	var o options
	flag.StringVar(&o.dir, "dir", ".local", "folder for local state (git-ignored)")
	flag.StringVar(&o.table, "table", schema.DefaultTableName, "table name")
	flag.StringVar(&o.bin, "bin", ".local/bin", "folder with the worker and bootstrap binaries (make local-bin)")
	flag.StringVar(&o.rie, "rie", ".tools/bin/aws-lambda-rie", "the Lambda runtime interface emulator (make tools)")
	flag.IntVar(&o.dbPort, "db-port", 8000, "port of the local DynamoDB engine (0: a free one)")
	flag.IntVar(&o.workers, "workers", 3, "number of worker processes")
	flag.IntVar(&o.basePort, "base-port", 8081, "worker i listens on base-port+i (0: free ports)")
	flag.StringVar(&o.lambdaAddr, "lambda-addr", "127.0.0.1:9000", "where the emulator serves invocations (port 0: a free one); its runtime API always gets a free port")
	flag.StringVar(&o.upstream, "upstream-addr", "127.0.0.1:9100", "the demo upstream's address (port 0: a free one)")
	flag.IntVar(&o.demos, "demo", 3, "demo connections to seed (if missing)")
	flag.Float64Var(&o.rate, "rate", 2, "demo upstream messages per second per stream")
	flag.DurationVar(&o.sweep, "sweep", time.Minute, "backstop sweep period")
	flag.Var(&o.workerEnv, "worker-env", "a worker setting NAME=VALUE, e.g. SOCKFLEET_RESUME=none (repeatable); beats the fleet's defaults")
	flag.StringVar(&o.sink, "sink", "file", "where workers deliver: file (one JSON-lines file per worker) or kinesis (a stream on the local Kinesis engine, kinesalite)")
	flag.IntVar(&o.kinesisPort, "kinesis-port", 4567, "port of the local Kinesis engine (-sink kinesis)")
	flag.BoolVar(&o.iam, "iam", true, "run the workers and the reconciler as their roles in the synthesized stack (cdk.out, `make template`), "+
		"refusing what those roles may not do; -iam=false turns it off for debugging")
	flag.BoolVar(&o.network, "network-rules", true, "enforce the synthesized template's security group rules on the calls between "+
		"the workers and the reconciler, refusing (and logging) what AWS would drop")
	flag.StringVar(&o.template, "template", "", "the template whose network rules to enforce; default: cdk.out/"+
		netrules.DefaultStack+".template.json in this folder or a parent (make run synthesizes it)")
	flag.BoolVar(&o.tracing, "tracing", true, "run Jaeger (in memory) and have the workers and the reconciler export their spans to it; -tracing=false: no spans")
	flag.IntVar(&o.jaegerPort, "jaeger-port", jaeger.DefaultQueryPort, "port of the Jaeger UI and query API (0: a free one)")
	flag.IntVar(&o.otlpPort, "otlp-port", jaeger.DefaultOTLPPort, "port of Jaeger's OTLP/HTTP receiver (0: a free one)")
	flag.IntVar(&o.viewerPort, "traces-port", 16687, "port of the trace pages: /conn/ID is a connection's most recent ownership trace (0: a free one)")
	flag.StringVar(&o.jaegerBin, "jaeger", "", "the Jaeger binary; default: .tools/bin/jaeger in this folder or a parent (make local-tools builds it)")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "sockfleet-local: unexpected arguments %q (worker settings go in -worker-env NAME=VALUE)\n", flag.Args())
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// Workers no longer inherit this process's SOCKFLEET_* variables: say so, rather
	// than let a setting someone meant for the workers be dropped in silence.
	if names := fleet.SockfleetVars(os.Environ()); len(names) > 0 {
		log.Warn("these variables of this environment are not passed to the workers; use -worker-env NAME=VALUE for worker settings",
			"ignored", strings.Join(names, ","))
	}
	if err := run(ctx, o, os.Stdout, log); err != nil {
		fmt.Fprintln(os.Stderr, "sockfleet-local:", err)
		os.Exit(1)
	}
}

// run starts everything, prints what runs where to out, and stops it all, draining
// the workers, when ctx ends.
func run(ctx context.Context, o options, out io.Writer, log *slog.Logger) error {
	if err := fleet.CheckWorkerEnv(o.workerEnv); err != nil {
		return err
	}
	for _, p := range []string{filepath.Join(o.bin, "worker"), filepath.Join(o.bin, "bootstrap"), o.rie} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("%s is missing: run `make run` (it builds it)", p)
		}
	}
	network, err := networkRules(o)
	if err != nil {
		return err
	}
	secret := make([]byte, 32)
	rand.Read(secret)
	workerBin := abs(filepath.Join(o.bin, "worker"))
	sinkEnv, sinks, tailHint, err := sinkSettings(o)
	if err != nil {
		return err
	}
	// -worker-env comes last, so it beats the sink's settings too.
	workerEnv := func(int, string) []string { return append(slices.Clone(sinkEnv), o.workerEnv...) }
	// Before anything starts: a bad worker setting is reported once, in the worker's words.
	if err := fleet.CheckWorkerConfig(ctx, fleet.Config{
		Dir: o.dir, WorkerBin: workerBin, WorkerEnv: workerEnv, Secret: hex.EncodeToString(secret),
	}); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(o.dir, "logs"), 0o755); err != nil {
		return err
	}
	// The trace backend first, so the first spans of every process have somewhere to go.
	traces, tracingNote, err := startTracing(o)
	if err != nil {
		return err
	}
	defer traces.Stop()
	otlp, viewer := "", ""
	if traces != nil {
		otlp = traces.OTLPEndpoint
		if viewer, err = serveViewer(ctx, traces, o.viewerPort); err != nil {
			return err
		}
	}
	logFile, err := os.Create(filepath.Join(o.dir, "logs", "dynoxide.log"))
	if err != nil {
		return err
	}
	defer logFile.Close()
	dbPath := filepath.Join(o.dir, "dynoxide.db")
	engine, err := dynoxide.Start(dynoxide.Options{Port: o.dbPort, DBPath: dbPath, Log: logFile})
	if err != nil {
		return fmt.Errorf("%w (is another `make run` using port %d? pass -db-port)", err, o.dbPort)
	}
	defer engine.Stop()
	db := dynamodb.New(dynamodb.Options{
		Region: fleet.LocalRegion, BaseEndpoint: aws.String(engine.Endpoint),
		Credentials: credentials.NewStaticCredentialsProvider("local", "local", ""),
	})
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	created, err := localddb.EnsureTable(cctx, db, o.table)
	cancel()
	if err != nil {
		return err
	}
	log.Info("table ready", "table", o.table, "created", created)

	up, err := demoupstream.Listen(o.upstream, demoupstream.Config{Rate: o.rate, Size: 64})
	if err != nil {
		return fmt.Errorf("demo upstream on %s: %w", o.upstream, err)
	}
	defer up.Close()

	var kinesisEndpoint string
	if o.sink == "kinesis" {
		ks, err := startKinesis(ctx, o, log)
		if err != nil {
			return err
		}
		defer ks.Stop()
		kinesisEndpoint = ks.Endpoint
	}

	// The workers and the reconciler reach the engines through the IAM proxy, each
	// as its role in the stack; the operator (the banner's commands) goes straight to
	// the engine as the administrator.
	endpoint, keys, iamNote := engine.Endpoint, fleet.Keys{}, "off (-iam=false): every process is unrestricted"
	if o.iam {
		enf, err := fleet.EnforceIAM(ctx, fleet.IAMConfig{
			Endpoint: engine.Endpoint, Table: o.table, KinesisEndpoint: kinesisEndpoint, KinesisStream: localStream, Log: log,
		})
		if err != nil {
			return err
		}
		defer enf.Close()
		defer reportDenials(enf, log)
		endpoint, keys = enf.DynamoDB.Endpoint(), enf.Keys
		iamNote = fmt.Sprintf("the stack's policies, enforced at %s: workers as %s, the reconciler as %s (denials are logged here)",
			endpoint, keys.Worker, keys.Reconciler)
		if enf.Kinesis != nil {
			workerEnv = withKinesisEndpoint(workerEnv, enf.Kinesis.Endpoint())
		}
	}

	st, err := fleet.Start(ctx, fleet.Config{
		Keys: keys,
		Dir:  o.dir, Endpoint: endpoint, Table: o.table, Cluster: "sockfleet-local",
		Secret:  hex.EncodeToString(secret),
		Workers: o.workers, WorkerBin: workerBin, BasePort: o.basePort, Restart: true,
		Bootstrap: abs(filepath.Join(o.bin, "bootstrap")), RIE: abs(o.rie), LambdaAddr: o.lambdaAddr,
		ReconcilerEnv: []string{schema.EnvSweepPeriod + "=" + o.sweep.String()},
		SweepEvery:    o.sweep, Log: log,
		WorkerEnv:    workerEnv,
		Network:      network,
		OTLPEndpoint: otlp,
	})
	if err != nil {
		return err
	}
	seeded := seed(ctx, db, o.table, up, o.demos, log)

	fmt.Fprintf(out, `
sockfleet is running locally (Ctrl-C drains the workers and stops everything)
  DynamoDB engine   %s   data in %s
  table             %s   (%d demo connections added now)
  demo upstream     ws://%s/streams/{id}
  reconciler        the Lambda binary under the runtime emulator at %s (runtime API %s), fed by the stream poller
  workers           %s (restarted like an ECS service, each start a new id); logs in %s/logs
  worker settings   %s
  sweep             every %s
  sinks             %s
  IAM               %s
  network rules     %s
  traces            %[17]s

In another terminal:
  export AWS_ENDPOINT_URL_DYNAMODB=%[1]s AWS_ENDPOINT_URL_DYNAMODB_STREAMS=%[1]s
  export AWS_REGION=us-east-1 AWS_ACCESS_KEY_ID=local AWS_SECRET_ACCESS_KEY=local
  .local/bin/sockfleet watch                                   # live view
  .local/bin/sockfleet conn add feed-1 ws://%[5]s/streams/feed-1
  .local/bin/sockfleet conn stop demo-1                        # closes within a second
  .local/bin/sockfleet conn start demo-1
  kill -9 $(pgrep -f '^%[15]s' | head -1)   # failover: watch the owners change
  .local/bin/sockfleet %[16]s   # what was delivered
%[18]s`, engine.Endpoint, dbPath, o.table, seeded, up.Addr(), st.Lambda.Addr(), st.Lambda.RuntimeAPIAddr(),
		workerPorts(st, o.workers), o.dir, workerSettings(o.workerEnv), o.sweep, sinks, iamNote, networkState(network, st), workerBin, tailHint,
		tracingNote, traceHint(traces, viewer))
	<-ctx.Done()
	log.Info("stopping: draining workers")
	st.Stop()
	log.Info("stopped")
	return nil
}

// startTracing starts Jaeger unless -tracing=false, and says in the banner's words
// where the traces are.
func startTracing(o options) (*jaeger.Proc, string, error) {
	if !o.tracing {
		return nil, "off (-tracing=false): no process exports spans", nil
	}
	log, err := os.Create(filepath.Join(o.dir, "logs", "jaeger.log"))
	if err != nil {
		return nil, "", err
	}
	// Jaeger writes to its log file as long as it runs; the descriptor is its own.
	defer log.Close()
	j, err := jaeger.Start(jaeger.Options{Bin: o.jaegerBin, OTLPPort: o.otlpPort, QueryPort: o.jaegerPort, Log: log})
	if err != nil {
		return nil, "", fmt.Errorf("%w (is another `make run` using ports %d and %d? pass -jaeger-port and -otlp-port, or -tracing=false)",
			err, o.jaegerPort, o.otlpPort)
	}
	return j, fmt.Sprintf("Jaeger UI %s (in memory), spans received at %s/v1/traces; -tracing=false turns it off", j.UI, j.OTLPEndpoint), nil
}

// traceHint is the banner's last lines with tracing on: the page of a connection's
// most recent ownership trace, and the query that lists them all.
func traceHint(j *jaeger.Proc, viewer string) string {
	if j == nil {
		return ""
	}
	tags := map[string]string{"sockfleet.conn": "demo-1"}
	return fmt.Sprintf(`
demo-1's most recent ownership trace (put any connection id in place of demo-1):
  %s
all of them, most recent first, from Jaeger's query API (the search page of a Jaeger UI build):
  %s
  %s
`, jaeger.ConnURL(viewer, "demo-1"), jaeger.QueryURL(j.UI, fleet.WorkerService, tags), jaeger.SearchURL(j.UI, fleet.WorkerService, tags))
}

// serveViewer serves the trace pages on 127.0.0.1:port until ctx ends, and returns
// their base URL.
func serveViewer(ctx context.Context, j *jaeger.Proc, port int) (string, error) {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return "", fmt.Errorf("trace pages: %w (pass -traces-port, or -tracing=false)", err)
	}
	v := &jaeger.Viewer{Client: j.Client(), Services: []string{fleet.WorkerService, fleet.ReconcilerService}}
	srv := &http.Server{Handler: v.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	context.AfterFunc(ctx, func() { srv.Close() })
	return "http://" + l.Addr().String(), nil
}

// workerPorts says where the workers listen.
func workerPorts(st *fleet.Stack, n int) string {
	var ports []string
	for i := range n {
		if p := st.Sup.Get(i); p != nil {
			ports = append(ports, strconv.Itoa(p.Port))
		}
	}
	return fmt.Sprintf("%d processes on 127.0.0.1 ports %s", n, strings.Join(ports, ", "))
}

// networkRules loads the template whose rules the fleet enforces; nil with
// -network-rules=false.
func networkRules(o options) (*netrules.Template, error) {
	if !o.network {
		return nil, nil
	}
	path := o.template
	if path == "" {
		var err error
		if path, err = cdkout.Find("."); err != nil {
			return nil, fmt.Errorf("network rules: %w (or pass -network-rules=false)", err)
		}
	}
	t, err := netrules.Load(path)
	if err != nil {
		return nil, fmt.Errorf("network rules: %w (or pass -network-rules=false)", err)
	}
	return t, nil
}

// networkState says in the banner whether and whose network rules are enforced.
func networkState(t *netrules.Template, st *fleet.Stack) string {
	switch {
	case t == nil:
		return "not enforced (-network-rules=false)"
	case !st.Enforcing():
		return "not enforced: this system cannot tell which process calls (see the log)"
	}
	return "the security groups of " + t.Path + ", enforced on calls to the workers; refused calls are logged"
}

func workerSettings(env []string) string {
	if len(env) == 0 {
		return "the fleet's defaults (-worker-env NAME=VALUE to change one)"
	}
	return strings.Join(env, " ") + " (over the fleet's defaults)"
}

func abs(p string) string { a, _ := filepath.Abs(p); return a }

// seed adds demo connections that do not exist yet.
func seed(ctx context.Context, db *dynamodb.Client, table string, up *demoupstream.Server, n int, log *slog.Logger) int {
	added := 0
	for i := 1; i <= n; i++ {
		id := fmt.Sprintf("demo-%d", i)
		_, err := db.PutItem(ctx, &dynamodb.PutItemInput{
			TableName:                &table,
			Item:                     codec.EncodeConnection(codec.Connection{ID: id, DesiredState: schema.Started, WSURL: up.URL(id)}),
			ConditionExpression:      aws.String("attribute_not_exists(#pk)"),
			ExpressionAttributeNames: map[string]string{"#pk": schema.AttrPK},
		})
		var ccf *types.ConditionalCheckFailedException
		switch {
		case err == nil:
			added++
		case !errors.As(err, &ccf):
			log.Error("seed demo connection", "id", id, "err", err)
		}
	}
	return added
}

// sinkSettings returns the workers' sink settings for -sink, and how the banner
// describes the sinks and how to read them.
func sinkSettings(o options) (env []string, sinks, tail string, err error) {
	switch o.sink {
	case "", "file":
		return nil, o.dir + "/sinks/<worker>.jsonl", "tail file:" + o.dir + "/sinks/<worker>.jsonl", nil
	case "kinesis":
		endpoint := fmt.Sprintf("http://127.0.0.1:%d", o.kinesisPort)
		return []string{"AWS_ENDPOINT_URL_KINESIS=" + endpoint, schema.EnvSink + "=kinesis:" + localStream},
			fmt.Sprintf("Kinesis stream %s on kinesalite at %s, data in %s", localStream, endpoint, kinesisPath(o)),
			"AWS_ENDPOINT_URL_KINESIS=" + endpoint + " .local/bin/sockfleet tail kinesis:" + localStream, nil
	}
	return nil, "", "", fmt.Errorf("-sink %q: want file or kinesis", o.sink)
}

// reportDenials sums up, at the end of a run, what the stack's roles were refused:
// each refusal was logged as it happened, and may have scrolled away.
func reportDenials(enf *fleet.IAM, log *slog.Logger) {
	count := map[string]int{}
	var order []string
	for _, d := range enf.Denials() {
		k := d.Role + " " + d.Action + " " + d.Resource
		if count[k] == 0 {
			order = append(order, k)
		}
		count[k]++
	}
	for _, k := range order {
		log.Warn("IAM denied during this run: the stack does not grant it", "role action resource", k, "times", count[k])
	}
}

// withKinesisEndpoint points the workers' Kinesis client at endpoint, after the
// other settings.
func withKinesisEndpoint(env func(int, string) []string, endpoint string) func(int, string) []string {
	return func(slot int, id string) []string {
		return append(env(slot, id), "AWS_ENDPOINT_URL_KINESIS="+endpoint)
	}
}

// localStream is the Kinesis stream `make run SINK=kinesis` delivers to.
const localStream = "sockfleet-local"

func kinesisPath(o options) string { return filepath.Join(o.dir, "kinesalite") }

// startKinesis runs kinesalite, file-backed under the state folder, and creates the
// stream if it is missing.
func startKinesis(ctx context.Context, o options, log *slog.Logger) (*kinesalite.Proc, error) {
	logFile, err := os.Create(filepath.Join(o.dir, "logs", "kinesalite.log"))
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(kinesisPath(o), 0o755); err != nil {
		return nil, err
	}
	ks, err := kinesalite.Start(kinesalite.Options{Port: o.kinesisPort, Path: kinesisPath(o), Log: logFile})
	if err != nil {
		return nil, fmt.Errorf("%w (is another `make run` using port %d? pass -kinesis-port)", err, o.kinesisPort)
	}
	k := kinesis.New(kinesis.Options{
		Region: fleet.LocalRegion, BaseEndpoint: aws.String(ks.Endpoint),
		Credentials: credentials.NewStaticCredentialsProvider("local", "local", ""),
	})
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err = k.CreateStream(cctx, &kinesis.CreateStreamInput{StreamName: aws.String(localStream), ShardCount: aws.Int32(2)})
	var inUse *ktypes.ResourceInUseException
	created := err == nil
	if err != nil && !errors.As(err, &inUse) {
		ks.Stop()
		return nil, fmt.Errorf("create stream %s: %w", localStream, err)
	}
	for {
		out, err := k.DescribeStreamSummary(cctx, &kinesis.DescribeStreamSummaryInput{StreamName: aws.String(localStream)})
		if err == nil && out.StreamDescriptionSummary.StreamStatus == ktypes.StreamStatusActive {
			log.Info("kinesis stream ready", "stream", localStream, "created", created)
			return ks, nil
		}
		if cctx.Err() != nil {
			ks.Stop()
			return nil, fmt.Errorf("stream %s not active: %v", localStream, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
