// Command demo-upstream serves numbered WebSocket streams at
// ws://ADDR/streams/{id}?from=N for local runs, tests and benchmarks, with test
// controls under http://ADDR/control/ (drop, close, refuse, accept, stall, garbage,
// stats, events), and an exchange's REST side: POST /bullet (a KuCoin-style token
// and endpoint), POST and PUT /listenKey (a Binance-style key and its keepalive),
// GET /snapshot/{id} (an order-book snapshot with its sequence). With
// -require-token a handshake must carry a live token. See package
// shared/local/demoupstream.
package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/sockfleet/sockfleet/shared/local/demoupstream"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9000", "listen address")
	rate := flag.Float64("rate", 10, "messages per second per stream; 0: idle; negative: as fast as clients read")
	size := flag.Int("size", 64, "payload bytes per message")
	buffer := flag.Int64("buffer", 1_000_000, "how many past messages a resume may reach back")
	liveHead := flag.Bool("live-head", false, `ignore the resume point: every socket starts at the live head, frames numbered in "n"`)
	delay := flag.Duration("handshake-delay", 0, "answer each handshake only after this long (a far upstream's dial time)")
	requireToken := flag.Bool("require-token", false, "refuse handshakes without a live ?token= or ?listenKey= (minted by POST /bullet or /listenKey)")
	tokenTTL := flag.Duration("token-ttl", time.Hour, "how long a minted token lives; PUT /listenKey extends it by as much")
	flag.StringVar(&tlsOpts.addr, "tls-addr", "", "also serve the streams as wss:// on this address (needs -tls-cert and -tls-key); the controls stay on -addr")
	flag.StringVar(&tlsOpts.cert, "tls-cert", "", "PEM certificate (chain) for -tls-addr")
	flag.StringVar(&tlsOpts.key, "tls-key", "", "PEM private key for -tls-addr")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(*addr, demoupstream.Config{Rate: *rate, Size: *size, Buffer: *buffer, LiveHead: *liveHead, HandshakeDelay: *delay,
		RequireToken: *requireToken, TokenTTL: *tokenTTL}, log); err != nil {
		fmt.Fprintln(os.Stderr, "demo-upstream:", err)
		os.Exit(1)
	}
}

func run(addr string, cfg demoupstream.Config, log *slog.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	s, err := demoupstream.Listen(addr, cfg)
	if err != nil {
		return err
	}
	log.Info("demo upstream listening", "addr", s.Addr(), "rate", cfg.Rate, "size", cfg.Size)
	// The readiness line on stdout lets a parent process learn the port when addr ends in :0.
	fmt.Printf("listening %s\n", s.Addr())
	if tlsOpts.addr != "" {
		cert, err := tls.LoadX509KeyPair(tlsOpts.cert, tlsOpts.key)
		if err != nil {
			s.Close()
			return fmt.Errorf("-tls-cert and -tls-key: %w", err)
		}
		ln, err := net.Listen("tcp", tlsOpts.addr)
		if err != nil {
			s.Close()
			return err
		}
		hs := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}
		go func() { _ = hs.ServeTLS(ln, "", "") }()
		defer hs.Close()
		log.Info("demo upstream serving wss", "addr", ln.Addr())
		fmt.Printf("listening-tls %s\n", ln.Addr())
	}
	<-ctx.Done()
	return s.Close()
}

// tlsOpts: the wss:// listener, beside the plain one.
var tlsOpts struct{ addr, cert, key string }
