// Package sink delivers upstream messages somewhere: stdout as JSON lines (the
// default), a file, or HTTP POST of batches.
//
// Guarantee: Write returns nil only once the whole batch is acknowledged — written to
// the file descriptor (stdout, file) or answered 2xx (HTTP). The worker advances
// last_seq only after that, so delivery is at least once and the resume point never
// runs ahead of what was delivered. Non-guarantee: "written" is not "fsynced"; a host
// crash can lose lines the kernel had not flushed.
package sink

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Message is one upstream frame on its way to the sink.
type Message struct {
	Conn   string // connection id
	Seq    int64  // sequence number (parsed or counted); for a passed-on bad message, the last good one
	Data   []byte
	Binary bool // a binary frame
	Bad    bool // passed on although its sequence could not be parsed
}

// Sink is where messages go. Implementations are safe for concurrent use.
type Sink interface {
	// Write delivers batch and returns nil once it is acknowledged.
	Write(ctx context.Context, batch []Message) error
	Close() error
}

// Parse builds a sink from its spec: "" or "stdout", "file:PATH", or an http(s) URL.
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
	case strings.HasPrefix(spec, "http://") || strings.HasPrefix(spec, "https://"):
		return &HTTP{URL: spec}, nil
	}
	return nil, fmt.Errorf("sink %q: want stdout, file:PATH or an http(s) URL", spec)
}

// AppendJSON appends m as one JSON line: {"conn":..,"seq":..,"data":..}. Data that is
// valid JSON is embedded as is; anything else goes base64-encoded in "data_b64".
func AppendJSON(b []byte, m Message) []byte {
	b = append(b, `{"conn":`...)
	b = strconv.AppendQuote(b, m.Conn)
	b = append(b, `,"seq":`...)
	b = strconv.AppendInt(b, m.Seq, 10)
	if m.Bad {
		b = append(b, `,"bad":true`...)
	}
	if !m.Binary && json.Valid(m.Data) {
		b = append(b, `,"data":`...)
		b = append(b, bytes.TrimSpace(m.Data)...)
	} else {
		b = append(b, `,"data_b64":"`...)
		b = base64.StdEncoding.AppendEncode(b, m.Data)
		b = append(b, '"')
	}
	return append(b, '}', '\n')
}

// Writer writes JSON lines to an io.Writer, one buffered write per batch.
type Writer struct {
	mu     sync.Mutex
	w      *bufio.Writer
	buf    []byte
	closer io.Closer
}

// NewWriter returns a sink writing to w; closer (may be nil) is closed by Close.
func NewWriter(w io.Writer, closer io.Closer) *Writer {
	return &Writer{w: bufio.NewWriterSize(w, 64<<10), closer: closer}
}

// OpenFile appends JSON lines to the file at path, creating it if needed.
func OpenFile(path string) (*Writer, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open sink file: %w", err)
	}
	return NewWriter(f, f), nil
}

// Write writes batch and flushes, so a nil return means the OS has the bytes.
func (s *Writer) Write(_ context.Context, batch []Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range batch {
		s.buf = AppendJSON(s.buf[:0], m)
		if _, err := s.w.Write(s.buf); err != nil {
			return fmt.Errorf("sink write: %w", err)
		}
	}
	if err := s.w.Flush(); err != nil {
		return fmt.Errorf("sink flush: %w", err)
	}
	return nil
}

// Close flushes and closes the underlying file, if any.
func (s *Writer) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	err := s.w.Flush()
	if s.closer != nil {
		if cerr := s.closer.Close(); err == nil {
			err = cerr
		}
	}
	return err
}

// HTTP posts each batch as a JSON array (one element per message, in the line
// format) and treats any 2xx answer as the acknowledgement.
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
		body = AppendJSON(body, m)
		body = body[:len(body)-1] // drop the newline
	}
	body = append(body, ']')
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.URL, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("sink post: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
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
