package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
)

// localConfig is the SDK config for the local engines.
func localConfig() aws.Config {
	return aws.Config{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("local", "local", "")}
}

// rig is one measurement's processes: a demo upstream, and a worker that owns the
// connections of a fresh table to it.
type rig struct {
	up, w *proc
	table string
}

// stop stops the worker, then the upstream.
func (r *rig) stop() { r.w.stop(); r.up.stop() }

// startRig starts an upstream sending size-byte messages, rate per second on each
// connection (-1: as fast as the worker reads), a fresh table of n connections to
// it, and a worker delivering them to sink with extra environment env; it returns
// once the worker owns all n.
func (b *bench) startRig(n int, rate float64, size int, sink string, env []string) (*rig, error) {
	up, err := b.upstream(rate, size)
	if err != nil {
		return nil, err
	}
	table, err := b.newTable(n, up.addr)
	if err != nil {
		up.stop()
		return nil, err
	}
	w, err := b.startWorkerEnv(table, n, sink, env)
	if err != nil {
		up.stop()
		return nil, err
	}
	r := &rig{up: up, w: w, table: table}
	if err := waitMetric(w.addr, "sockfleet_owned_connections", int64(n), time.Minute); err != nil {
		r.stop()
		return nil, err
	}
	return r, nil
}

// deliveryRate measures one worker delivering n connections to sink, the upstream
// sending size-byte messages as fast as the worker reads: messages per second over
// dur after a 2 s warm-up and, for a file sink, the file's growth in MB/s.
func (b *bench) deliveryRate(n, size int, dur time.Duration, sink string, env []string) (msgs, fileMB float64, err error) {
	r, err := b.startRig(n, -1, size, sink, env)
	if err != nil {
		return 0, 0, err
	}
	defer r.stop()
	file, isFile := strings.CutPrefix(sink, "file:")
	time.Sleep(2 * time.Second) // warm up
	m0, err := metric(r.w.addr, "sockfleet_messages_total")
	if err != nil {
		return 0, 0, err
	}
	f0 := fileSize(file)
	t0 := time.Now()
	time.Sleep(dur)
	m1, err := metric(r.w.addr, "sockfleet_messages_total")
	if err != nil {
		return 0, 0, err
	}
	el := time.Since(t0).Seconds()
	if isFile {
		fileMB = float64(fileSize(file)-f0) / el / 1e6
	}
	return float64(m1-m0) / el, fileMB, nil
}

// header prints the first two lines of a Markdown table: cols, right-aligned
// except a first column of labels.
func header(labels bool, cols ...string) {
	align := make([]string, len(cols))
	for i := range align {
		align[i] = "---:"
	}
	if labels {
		align[0] = "---"
	}
	fmt.Printf("| %s |\n|%s|\n", strings.Join(cols, " | "), strings.Join(align, "|"))
}
