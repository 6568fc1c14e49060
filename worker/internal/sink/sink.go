// Package sink delivers upstream messages somewhere: stdout as JSON lines (the
// default), a file, HTTP POST of batches, or Kinesis Data Streams records.
//
// Guarantee: Write returns nil only once the whole batch is acknowledged — written to
// the file descriptor (stdout, file), answered 2xx (HTTP), or every record accepted
// (Kinesis). The worker advances
// last_seq only after that, so delivery is at least once and the resume point never
// runs ahead of what was delivered. Non-guarantee: "written" is not "fsynced"; a host
// crash can lose lines the kernel had not flushed.
package sink

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sockfleet/sockfleet/shared/sinkrecord"
)

// Message is one upstream frame on its way to the sink.
type Message struct {
	Conn  string // connection id
	Seq   int64  // sequence number (parsed or counted); for a passed-on bad message, the last good one
	Epoch int64  // sequence epoch: 0 until the upstream's numbering first resets
	// Version is the fencing token: the lease_version the message is delivered under.
	Version int64
	Data    []byte
	Binary  bool // a binary frame
	Bad     bool // passed on although its sequence could not be parsed
	// Snapshot marks the answer of the spec's snapshot request, covering Seq.
	Snapshot bool
	// Decoded names the decoding that produced Data from the frame (the spec's
	// decode: gzip, deflate, zlib); "" for a frame delivered as it arrived.
	Decoded string
	// Dest is the connection's own sink (its spec's sink attribute); "": the fleet's.
	// A Router sends the message there.
	Dest string
}

// Sink is where messages go. Implementations are safe for concurrent use.
type Sink interface {
	// Write delivers batch and returns nil once it is acknowledged.
	Write(ctx context.Context, batch []Message) error
	Close() error
}

// Parse builds a sink from its spec: "" or "stdout", "file:PATH", or an http(s) URL.
// A Kinesis sink (kinesis:STREAM) needs a client: see NewKinesis.
func Parse(spec string, stdout io.Writer) (Sink, error) {
	switch {
	case spec == "" || spec == "stdout":
		return NewWriter(stdout, nil), nil
	case strings.HasPrefix(spec, "file:"):
		path := strings.TrimPrefix(spec, "file:")
		if path == "" {
			return nil, fmt.Errorf("sink %q: empty file path", spec)
		}
		return OpenFile(path)
	case strings.HasPrefix(spec, KinesisPrefix):
		return nil, fmt.Errorf("sink %q: a Kinesis sink is built with NewKinesis", spec)
	case strings.HasPrefix(spec, "http://") || strings.HasPrefix(spec, "https://"):
		return &HTTP{URL: spec}, nil
	}
	return nil, fmt.Errorf("sink %q: want stdout, file:PATH, an http(s) URL or kinesis:STREAM", spec)
}

// Record is m as a sink record (docs/SINKS.md; package sinkrecord encodes it).
func (m Message) Record() sinkrecord.Record {
	return sinkrecord.Record{Conn: m.Conn, Seq: m.Seq, Epoch: m.Epoch, Version: m.Version, Bad: m.Bad, Snapshot: m.Snapshot, Decoded: m.Decoded, Data: m.Data, Binary: m.Binary}
}

// Writer writes JSON lines to an io.Writer, one write per batch. A write that
// outlives its context is abandoned, not waited for: the batch is reported failed
// (so it is retried, at least once), and later writes wait for it only as long as
// their own context allows, so a blocked stdout cannot stall a caller past its
// timeout. An error leaves nothing behind: the next write starts afresh, after a
// newline if the failed one stopped mid-line, so every record stays on its own line.
type Writer struct {
	w      io.Writer
	closer io.Closer
	busy   chan struct{} // holds a token while a write is in flight
	torn   bool          // the last write failed part way through a line (guarded by busy)
	errors atomic.Int64
}

// NewWriter returns a sink writing to w; closer (may be nil) is closed by Close.
func NewWriter(w io.Writer, closer io.Closer) *Writer {
	return &Writer{w: w, closer: closer, busy: make(chan struct{}, 1)}
}

// OpenFile appends JSON lines to the file at path, creating it if needed.
func OpenFile(path string) (*Writer, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open sink file: %w", err)
	}
	return NewWriter(f, f), nil
}

// Errors is how many writes failed (including those abandoned at their deadline).
func (s *Writer) Errors() int64 { return s.errors.Load() }

// Write writes batch; a nil return means the OS has every byte.
func (s *Writer) Write(ctx context.Context, batch []Message) error {
	select {
	case s.busy <- struct{}{}:
	case <-ctx.Done():
		s.errors.Add(1)
		return fmt.Errorf("sink write: waiting for an earlier write still blocked: %w", ctx.Err())
	}
	var buf []byte
	if s.torn {
		buf = append(buf, '\n')
	}
	for _, m := range batch {
		buf = sinkrecord.Append(buf, m.Record())
	}
	done := make(chan error, 1)
	go func() {
		defer func() { <-s.busy }()
		n, err := s.w.Write(buf)
		if err == nil && n < len(buf) {
			err = io.ErrShortWrite
		}
		switch {
		case err == nil:
			s.torn = false
		case n > 0:
			s.torn = buf[n-1] != '\n'
		} // n == 0: nothing written, the line state is unchanged
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			s.errors.Add(1)
			return fmt.Errorf("sink write: %w", err)
		}
		return nil
	case <-ctx.Done():
		s.errors.Add(1)
		return fmt.Errorf("sink write: %w", ctx.Err())
	}
}

// Close closes the underlying file, if any, without waiting for a blocked write.
func (s *Writer) Close() error {
	if s.closer != nil {
		return s.closer.Close()
	}
	return nil
}

// HTTP posts each batch as a JSON array (one element per message, in the line
// format; sinkrecord.ParseBatch reads it) and treats any 2xx answer as the acknowledgement.
// Every element carries its lease_version; when the whole batch is one connection's
// under one version (always so for a worker's batches: a stream writes its own), the
// request says it too, in the ConnHeader and VersionHeader headers, so a receiver can
// fence a batch before reading its body.
type HTTP struct {
	URL    string
	Client *http.Client // default: 10 s timeout
}

// Write posts batch.
func (h *HTTP) Write(ctx context.Context, batch []Message) error {
	if len(batch) == 0 {
		return nil
	}
	body := []byte{'['}
	for i, m := range batch {
		if i > 0 {
			body = append(body, ',')
		}
		body = sinkrecord.Append(body, m.Record())
		body = body[:len(body)-1] // drop the newline
	}
	body = append(body, ']')
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.URL, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("sink post: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	if conn, v, ok := oneLease(batch); ok {
		req.Header.Set(ConnHeader, conn)
		req.Header.Set(VersionHeader, strconv.FormatInt(v, 10))
	}
	c := h.Client
	if c == nil {
		c = &http.Client{Timeout: 10 * time.Second}
	}
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("sink post: %w", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("sink post: status %d", resp.StatusCode)
	}
	return nil
}

// Close does nothing: every Write is complete when it returns.
func (h *HTTP) Close() error { return nil }

// The HTTP sink's headers for a batch of one connection under one lease version.
const (
	ConnHeader    = "Sockfleet-Conn"
	VersionHeader = "Sockfleet-Lease-Version"
)

// oneLease reports the connection and version every message of batch shares.
func oneLease(batch []Message) (conn string, version int64, ok bool) {
	conn, version = batch[0].Conn, batch[0].Version
	for _, m := range batch[1:] {
		if m.Conn != conn || m.Version != version {
			return "", 0, false
		}
	}
	return conn, version, version != 0
}
