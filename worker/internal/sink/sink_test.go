package sink

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/sockfleet/sockfleet/shared/sinkrecord"
)

var batch = []Message{
	{Conn: "a", Seq: 1, Version: 1764794000123, Data: []byte(`{"seq":1,"x":"y"}`)},
	{Conn: "a", Seq: 2, Version: 1764794000123, Data: []byte("\x00\x01"), Binary: true},
	{Conn: "a", Seq: 2, Version: 1764794000123, Data: []byte("not json"), Bad: true},
}

func check(t *testing.T, got []sinkrecord.Record) {
	t.Helper()
	if len(got) != 3 || string(got[0].Data) != `{"seq":1,"x":"y"}` || got[0].Binary ||
		!bytes.Equal(got[1].Data, []byte("\x00\x01")) || !got[1].Binary ||
		!got[2].Bad || string(got[2].Data) != "not json" {
		t.Fatalf("lines %+v", got)
	}
	for _, r := range got {
		if r.Version != 1764794000123 {
			t.Fatalf("record %+v: lease_version %d, want the batch's fencing token", r, r.Version)
		}
	}
}

func TestFileSink(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.jsonl")
	s, err := Parse("file:"+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Write(context.Background(), batch); err != nil {
		t.Fatal(err)
	}
	// Acknowledged means written: readable before Close.
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var got []sinkrecord.Record
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l, err := sinkrecord.Parse(sc.Bytes())
		if err != nil {
			t.Fatalf("line %q: %v", sc.Bytes(), err)
		}
		got = append(got, l)
	}
	check(t, got)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestHTTPSink(t *testing.T) {
	var got []sinkrecord.Record
	var hdr http.Header
	status := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hdr = r.Header.Clone()
		b, _ := io.ReadAll(r.Body)
		var err error
		if got, err = sinkrecord.ParseBatch(b); err != nil {
			t.Errorf("body %q: %v", b, err)
		}
		w.WriteHeader(status)
	}))
	defer srv.Close()
	s, err := Parse(srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Write(context.Background(), batch); err != nil {
		t.Fatal(err)
	}
	check(t, got)
	if c, v := hdr.Get(ConnHeader), hdr.Get(VersionHeader); c != "a" || v != "1764794000123" {
		t.Fatalf("headers %s=%q %s=%q, want the batch's connection and lease version", ConnHeader, c, VersionHeader, v)
	}
	// A batch of two connections (or versions) says it in each record only.
	mixed := []Message{batch[0], {Conn: "b", Seq: 1, Version: 3, Data: []byte("1")}}
	if err := s.Write(context.Background(), mixed); err != nil {
		t.Fatal(err)
	}
	if _, ok := hdr[VersionHeader]; ok || len(got) != 2 || got[1].Version != 3 {
		t.Fatalf("mixed batch: header %v, records %+v", hdr[VersionHeader], got)
	}
	status = http.StatusInternalServerError
	if err := s.Write(context.Background(), batch); err == nil {
		t.Fatal("a 500 was taken as an acknowledgement")
	}
}

func TestParse(t *testing.T) {
	for spec, ok := range map[string]bool{"": true, "stdout": true, "file:": false, "ftp://x": false, "https://h/p": true} {
		if _, err := Parse(spec, io.Discard); (err == nil) != ok {
			t.Errorf("Parse(%q): %v", spec, err)
		}
	}
}

func BenchmarkFileSink(b *testing.B) {
	s, err := OpenFile(filepath.Join(b.TempDir(), "out.jsonl"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	msgs := make([]Message, 256)
	for i := range msgs {
		msgs[i] = Message{Conn: "bench", Seq: int64(i), Data: []byte(`{"seq":1,"ts":1733000000000,"payload":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}`)}
	}
	b.ResetTimer()
	for b.Loop() {
		if err := s.Write(context.Background(), msgs); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*len(msgs))/b.Elapsed().Seconds(), "msgs/s")
}
