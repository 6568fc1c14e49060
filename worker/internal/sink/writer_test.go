package sink

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sockfleet/sockfleet/shared/sinkrecord"
)

// The record format is documented in docs/SINKS.md; this pins, byte for byte, the
// record a message becomes (shared/sinkrecord pins the encoder itself).
func TestRecordFormatGolden(t *testing.T) {
	for _, c := range []struct {
		m    Message
		want string
	}{
		{Message{Conn: "a", Seq: 7, Epoch: 2, Version: 1764794000123, Data: []byte("{\n  \"seq\": 7,\n  \"x\": [1, 2]\n}\n")},
			`{"conn":"a","seq":7,"epoch":2,"lease_version":1764794000123,"data":{"seq":7,"x":[1,2]}}` + "\n"},
		{Message{Conn: "a", Seq: 8, Data: []byte{0, 1, 0xff}, Binary: true},
			`{"conn":"a","seq":8,"epoch":0,"data_b64":"AAH/"}` + "\n"},
		{Message{Conn: "a", Seq: 8, Version: 5, Data: []byte("line one\nline two"), Bad: true},
			`{"conn":"a","seq":8,"epoch":0,"lease_version":5,"bad":true,"data_b64":"bGluZSBvbmUKbGluZSB0d28="}` + "\n"},
		{Message{Conn: "c\x00\u2028", Seq: 1, Data: []byte(`"s"`)},
			`{"conn":"c\u0000\u2028","seq":1,"epoch":0,"data":"s"}` + "\n"},
	} {
		if got := string(sinkrecord.Append(nil, c.m.Record())); got != c.want {
			t.Errorf("message %+v\n got %s\nwant %s", c.m, got, c.want)
		}
	}
}

func TestMultiLineJSONStaysOneLine(t *testing.T) {
	var out bytes.Buffer
	s := NewWriter(&out, nil)
	pretty := []byte("{\n\t\"seq\": 1,\n\t\"nested\": {\n\t\t\"a\": \"b\"\n\t}\n}")
	if err := s.Write(context.Background(), []Message{{Conn: "a", Seq: 1, Data: pretty}, {Conn: "a", Seq: 2, Data: pretty}}); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 2 || lines[0] != `{"conn":"a","seq":1,"epoch":0,"data":{"seq":1,"nested":{"a":"b"}}}` {
		t.Fatalf("lines %q", lines)
	}
}

// A pipe nobody reads: the write times out on its context, later writes do too
// (they do not queue behind it forever), and once the reader drains the pipe the
// sink works again.
func TestBlockedStdoutTimesOutAndRecovers(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	s := NewWriter(w, nil)
	big := make([]Message, 2000) // more than a pipe buffer (64 KiB)
	for i := range big {
		big[i] = Message{Conn: "a", Seq: int64(i + 1), Data: []byte(`{"payload":"` + strings.Repeat("x", 64) + `"}`)}
	}
	for range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		start := time.Now()
		err := s.Write(ctx, big)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("write to a blocked pipe: %v", err)
		}
		if el := time.Since(start); el > 2*time.Second {
			t.Fatalf("write returned after %s, want about its 100ms timeout", el)
		}
	}
	if s.Errors() != 2 {
		t.Fatalf("errors %d, want 2", s.Errors())
	}
	// The fault clears: someone reads the pipe.
	var got bytes.Buffer
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = got.ReadFrom(r) })
	if err := s.Write(context.Background(), []Message{{Conn: "a", Seq: 9999, Data: []byte(`1`)}}); err != nil {
		t.Fatalf("after the reader came back: %v", err)
	}
	w.Close()
	wg.Wait()
	if !strings.HasSuffix(got.String(), `{"conn":"a","seq":9999,"epoch":0,"data":1}`+"\n") {
		t.Fatalf("tail %q", got.String()[max(0, got.Len()-100):])
	}
	for i, l := range strings.Split(strings.TrimSuffix(got.String(), "\n"), "\n") {
		if !strings.HasPrefix(l, `{"conn":"a"`) || !strings.HasSuffix(l, "}") {
			t.Fatalf("line %d is not one whole record: %.80q", i, l)
		}
	}
}

// failing fails its next writes with err after writing the first n bytes.
type failing struct {
	out   bytes.Buffer
	fails int
	n     int
	err   error
}

func (f *failing) Write(p []byte) (int, error) {
	if f.fails > 0 {
		f.fails--
		n := min(f.n, len(p))
		f.out.Write(p[:n])
		return n, f.err
	}
	return f.out.Write(p)
}

// A transient ENOSPC (part of a line written) fails that batch only; the next write
// succeeds and starts on a fresh line.
func TestTransientErrorDoesNotPoison(t *testing.T) {
	f := &failing{fails: 1, n: 10, err: syscall.ENOSPC}
	s := NewWriter(f, nil)
	m := []Message{{Conn: "a", Seq: 1, Data: []byte(`{"k":1}`)}}
	if err := s.Write(context.Background(), m); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("first write: %v, want ENOSPC", err)
	}
	if err := s.Write(context.Background(), m); err != nil {
		t.Fatalf("second write: %v", err)
	}
	want := `{"conn":"a` + "\n" + `{"conn":"a","seq":1,"epoch":0,"data":{"k":1}}` + "\n"
	if f.out.String() != want || s.Errors() != 1 {
		t.Fatalf("out %q errors %d", f.out.String(), s.Errors())
	}
}

// A full disk: a file sink on a tiny tmpfs fails with ENOSPC, and works again once
// space is freed. Needs permission to mount; skipped otherwise.
func TestFullDiskRecovers(t *testing.T) {
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=64k"); err != nil {
		t.Skipf("cannot mount a tmpfs (%v); TestTransientErrorDoesNotPoison covers ENOSPC with an injected writer", err)
	}
	defer syscall.Unmount(dir, 0)
	filler := dir + "/filler"
	if err := os.WriteFile(filler, make([]byte, 60<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := OpenFile(dir + "/out.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	msgs := make([]Message, 200)
	for i := range msgs {
		msgs[i] = Message{Conn: "a", Seq: int64(i + 1), Data: []byte(`{"p":"` + strings.Repeat("y", 100) + `"}`)}
	}
	if err := s.Write(context.Background(), msgs); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("write to a full disk: %v", err)
	}
	os.Remove(filler)
	if err := s.Write(context.Background(), msgs[:1]); err != nil {
		t.Fatalf("after freeing space: %v", err)
	}
}
