// Package app assembles a worker from its parts: lease store, registry, sink,
// streams, ownership loop and HTTP listener. main calls it with the process's
// configuration; tests call it with short timings, their own listener and a DynamoDB
// client they can cut.
package app

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/sockfleet/sockfleet/shared/lease"
	"github.com/sockfleet/sockfleet/shared/registry"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/worker/internal/config"
	"github.com/sockfleet/sockfleet/worker/internal/metrics"
	"github.com/sockfleet/sockfleet/worker/internal/owner"
	"github.com/sockfleet/sockfleet/worker/internal/peer"
	"github.com/sockfleet/sockfleet/worker/internal/secrets"
	"github.com/sockfleet/sockfleet/worker/internal/server"
	"github.com/sockfleet/sockfleet/worker/internal/sink"
	wstream "github.com/sockfleet/sockfleet/worker/internal/stream"
)

// DB is every DynamoDB call the worker makes, all through the shared packages except
// the start-up scan.
type DB interface {
	lease.DynamoDB
	registry.DynamoDB
	owner.Scanner
}

// Deps are the worker's outside dependencies.
type Deps struct {
	DB       DB
	Listener net.Listener // nil: listen on cfg.ListenAddr
	Stdout   io.Writer    // the stdout sink writes here
	Stderr   io.Writer    // EMF metric lines go here
	Log      *slog.Logger
	Sink     sink.Sink // nil: the one cfg names
	// Stream tunes the connection runner (timeouts, backoff, jitter). Its sink,
	// metrics, log and resume/sequence settings are filled from cfg and the above.
	Stream wstream.Config
	// Secrets resolves {{secret:…}} references; nil: a file cache when cfg names a
	// secrets file, else none (a spec using a secret then fails to dial, saying so).
	Secrets wstream.Secrets
	// NoStartupPass skips the start-up acquire pass.
	NoStartupPass bool
}

// App is an assembled worker.
type App struct {
	Manager *owner.Manager
	Metrics *metrics.Counters

	cfg  config.Config
	ln   net.Listener
	hs   *http.Server
	sink sink.Sink
	log  *slog.Logger
	emf  *metrics.EMF
}

// kinesisOptions applies the bad-message policy to messages too large for a Kinesis
// record, and counts the sink's retries in the worker's metrics.
func kinesisOptions(cfg config.Config, m *metrics.Counters, log *slog.Logger) sink.KinesisOptions {
	return sink.KinesisOptions{
		PassOversize: cfg.BadMessages == string(wstream.BadPass),
		OnOversize: func(msg sink.Message, size int) {
			m.BadMessages.Add(1)
			if cfg.BadMessages != string(wstream.BadSkip) {
				log.Warn("message too large for a Kinesis record", "conn", msg.Conn, "seq", msg.Seq,
					"bytes", size, "limit", sink.KinesisMaxRecordBytes, "policy", cfg.BadMessages)
			}
		},
		OnRetry: func(records int, throttled bool) {
			m.SinkRetries.Add(int64(records))
			if throttled {
				m.SinkThrottles.Add(1)
			}
		},
	}
}

// New assembles a worker. cfg must be valid (config.Load validates it).
func New(cfg config.Config, d Deps) (*App, error) {
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	if d.Stdout == nil {
		d.Stdout = io.Discard
	}
	m := new(metrics.Counters)
	snk := d.Sink
	if snk == nil {
		var err error
		if snk, err = cfg.OpenSink(context.Background(), d.Stdout, kinesisOptions(cfg, m, d.Log)); err != nil {
			return nil, err
		}
	}
	router, err := cfg.OpenRouter(context.Background(), snk, kinesisOptions(cfg, m, d.Log))
	if err != nil {
		return nil, err
	}
	snk = router
	sc := d.Stream
	sc.Sink, sc.Metrics, sc.Log = snk, m, d.Log
	sc.SinkAllowed = router.Allows
	if sc.SinkTimeout == 0 {
		sc.SinkTimeout = cfg.EffectiveSinkTimeout()
	}
	if sc.Resume, err = wstream.ParseResume(cfg.Resume); err != nil {
		return nil, err
	}
	if sc.SeqPath, err = wstream.ParseSeqPath(cfg.SeqPath); err != nil {
		return nil, err
	}
	if sc.BadMessages, err = wstream.ParseBadPolicy(cfg.BadMessages); err != nil {
		return nil, err
	}
	if sc.Quota, err = wstream.ParseQuota(cfg.ConnectQuota); err != nil {
		return nil, err
	}
	sc.Gate = connectGate(d.DB, cfg.Table, sc.Quota, m, d.Log)
	sc.SeqReset, sc.MaxSeqJump = cfg.SeqReset, cfg.MaxSeqJump
	if sc.RESTPerHost == 0 {
		sc.RESTPerHost = cfg.RESTPerHost
	}
	sc.Secrets = d.Secrets
	if sc.Secrets == nil && cfg.SecretsFile != "" {
		sc.Secrets = &secrets.Cache{Source: secrets.File{Path: cfg.SecretsFile}, TTL: cfg.SecretsTTL}
	}
	if err := sc.Fill(); err != nil {
		return nil, err
	}
	streams := &wstream.Factory{Config: &sc, IdleTimeout: cfg.IdleTimeout}
	now := func() time.Time { return time.Now().Add(cfg.ClockOffset) }
	stream := cfg.Mode == schema.ModeStream
	lc := lease.Config{Table: cfg.Table, Duration: cfg.Lease, SkewMargin: cfg.SkewMargin, Now: now, Membership: stream}
	if cfg.Mode == schema.ModePolling {
		// Every polling worker finds every orphan: keep an unusable one out of the
		// orphan query for a while rather than taking and giving it back every poll.
		lc.InvalidRetry = lease.DefaultInvalidRetry
	}
	store, err := lease.New(d.DB, lc)
	if err != nil {
		return nil, err
	}
	emf := &metrics.EMF{W: d.Stderr, Service: cfg.ServiceName}
	oc := owner.Config{
		WorkerID: cfg.WorkerID, Addr: cfg.AdvertiseAddr, MaxConnections: cfg.MaxConnections,
		Lease: cfg.Lease, RenewInterval: cfg.RenewInterval, RenewDeadline: cfg.RenewDeadline,
		SkewMargin: cfg.SkewMargin, DrainTimeout: cfg.DrainTimeout,
		Store:    store,
		Registry: &registry.Registry{DB: d.DB, Table: cfg.Table},
		NewStream: func(l lease.Lease, valid func() bool) owner.Stream {
			return streams.New(streamConn(l, valid))
		},
		Metrics: m,
		EMF:     emf,
		Log:     d.Log,
	}
	if !d.NoStartupPass {
		oc.Candidates = func(ctx context.Context) ([]string, error) {
			var unheldBefore time.Time
			if stream {
				unheldBefore = now().Add(-owner.UnheldHold(cfg.CheckpointInterval, cfg.BackstopInterval, cfg.RenewInterval, cfg.SkewMargin))
			}
			return owner.ScanCandidates(ctx, d.DB, cfg.Table, now(), cfg.SkewMargin, 2*cfg.MaxConnections, unheldBefore)
		}
	}
	reg := &registry.Registry{DB: d.DB, Table: cfg.Table}
	if stream {
		oc.Member = &owner.MemberConfig{
			Incarnation: newIncarnation(), Registry: reg, Store: store, Now: now,
			CheckpointInterval: cfg.CheckpointInterval, BackstopInterval: cfg.BackstopInterval,
		}
	}
	if cfg.Mode == schema.ModePolling {
		oc.PollInterval = cfg.PollInterval
		oc.Orphans = func(ctx context.Context) ([]string, error) {
			return owner.QueryOrphans(ctx, d.DB, cfg.Table, now(), cfg.SkewMargin, 2*cfg.MaxConnections)
		}
		oc.DesiredState = func(ctx context.Context, id string) (schema.State, error) {
			return owner.ReadDesiredState(ctx, d.DB, cfg.Table, id)
		}
	}
	if stream && cfg.Handoff {
		oc.Handoff = handoffConfig(cfg, streams, snk, store, reg)
	}
	mgr, err := owner.New(oc)
	if err != nil {
		return nil, err
	}
	ln := d.Listener
	if ln == nil {
		if ln, err = net.Listen("tcp", cfg.ListenAddr); err != nil {
			return nil, fmt.Errorf("listen: %w", err)
		}
	}
	srv := &server.Server{Secret: cfg.WakeupSecret, Worker: cfg.WorkerID, Owner: mgr, Metrics: m, Log: d.Log}
	if oc.Handoff != nil {
		srv.Handoffs = mgr
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 30 * time.Second}
	return &App{Manager: mgr, Metrics: m, cfg: cfg, ln: ln, hs: hs, sink: snk, log: d.Log, emf: emf}, nil
}

// Addr is the listener's address.
func (a *App) Addr() string { return a.ln.Addr().String() }

// Run serves and owns connections until ctx is cancelled, then drains (see
// owner.Manager.Run) and stops the listener. It returns after everything it started
// has stopped.
func (a *App) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	serveErr := make(chan error, 1)
	wg.Go(func() { serveErr <- a.hs.Serve(a.ln) })
	gctx, stopGauges := context.WithCancel(context.Background())
	wg.Go(func() { a.emitGauges(gctx) })
	a.log.Info("worker started", "id", a.cfg.WorkerID, "addr", a.cfg.AdvertiseAddr, "capacity", a.cfg.MaxConnections)
	runErr := a.Manager.Run(ctx)
	// The listener stays up through the drain, answering 503 to wakeups.
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	herr := a.hs.Shutdown(sctx)
	stopGauges()
	wg.Wait()
	if err := <-serveErr; !errors.Is(err, http.ErrServerClosed) {
		herr = errors.Join(herr, err)
	}
	return errors.Join(runErr, herr, a.sink.Close())
}

// emitGauges writes the idle and quota gauges as EMF every renew interval (the
// cadence of OwnedConnections) until ctx ends, so the fleet's alarm sees them.
func (a *App) emitGauges(ctx context.Context) {
	t := time.NewTicker(a.cfg.RenewInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			a.emf.PutGauges(a.Metrics)
		}
	}
}

// streamConn is what a stream needs of lease l; valid guards its sink writes, and
// l.Version is the fencing token of every message it delivers.
func streamConn(l lease.Lease, valid func() bool) wstream.Conn {
	return wstream.Conn{ID: l.ID, URL: l.WSURL, LastSeq: l.LastSeq, Epoch: l.Epoch, Version: l.Version, Spec: l.Spec, Valid: valid}
}

// newIncarnation returns a random id for this process start.
func newIncarnation() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}

// handoffConfig wires planned handoffs: calls to other workers signed with the wakeup
// secret, targets from the registry, and standbys whose streams write to a gate in
// front of the worker's sink.
func handoffConfig(cfg config.Config, streams *wstream.Factory, snk sink.Sink, store *lease.Store, reg *registry.Registry) *owner.HandoffConfig {
	return &owner.HandoffConfig{
		Peer:  &peer.Client{Secret: cfg.WakeupSecret, Timeout: cfg.HandoffPrepareTimeout + 2*time.Second},
		Store: store,
		Workers: func(ctx context.Context) ([]codec.Worker, error) {
			ws, _, err := reg.List(ctx)
			return ws, err
		},
		NewStandby: func(l lease.Lease, valid func() bool, overflow func(error)) (owner.Stream, *peer.Gate) {
			g := &peer.Gate{Sink: snk, MaxMessages: cfg.StandbyMaxMessages, MaxBytes: cfg.StandbyMaxBytes,
				Timeout: streams.Config.SinkTimeout, Valid: valid, OnOverflow: overflow}
			return streams.WithSink(g).New(streamConn(l, valid)), g
		},
		Resumable:      func(l lease.Lease) error { return streams.Config.MakeBeforeBreak(l.Spec) },
		PrepareTimeout: cfg.HandoffPrepareTimeout,
		StandbyTimeout: cfg.HandoffStandbyTimeout,
	}
}
