package sinkrecord

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/records.golden")

// golden are the records of testdata/records.golden, and what each parses back to.
var golden = []struct {
	name string
	in   Record
	back Record // Parse of the line Append wrote
}{
	{"json object",
		Record{Conn: "ticker-1", Seq: 42, Version: 1764794000123, Data: []byte(`{"seq":42,"price":1.5}`)},
		Record{Conn: "ticker-1", Seq: 42, Version: 1764794000123, Data: []byte(`{"seq":42,"price":1.5}`)}},
	{"no lease_version (written before the field existed)",
		Record{Conn: "ticker-1", Seq: 41, Data: []byte(`{"seq":41}`)},
		Record{Conn: "ticker-1", Seq: 41, Data: []byte(`{"seq":41}`)}},
	{"pretty json compacted",
		Record{Conn: "a", Seq: 7, Epoch: 2, Data: []byte("{\n  \"seq\": 7,\n  \"x\": [1, 2]\n}\n")},
		Record{Conn: "a", Seq: 7, Epoch: 2, Data: []byte(`{"seq":7,"x":[1,2]}`)}},
	{"binary",
		Record{Conn: "ticker-1", Seq: 43, Data: []byte{0, 1, 0xff}, Binary: true},
		Record{Conn: "ticker-1", Seq: 43, Data: []byte{0, 1, 0xff}, Binary: true}},
	{"bad text that is not json",
		Record{Conn: "ticker-1", Seq: 43, Version: 5, Bad: true, Data: []byte("not json")},
		Record{Conn: "ticker-1", Seq: 43, Version: 5, Bad: true, Data: []byte("not json"), Binary: true}},
	{"multi-line text",
		Record{Conn: "a", Seq: 8, Bad: true, Data: []byte("line one\nline two")},
		Record{Conn: "a", Seq: 8, Bad: true, Data: []byte("line one\nline two"), Binary: true}},
	{"binary that looks like json",
		Record{Conn: "a", Seq: 9, Data: []byte(`{}`), Binary: true},
		Record{Conn: "a", Seq: 9, Data: []byte(`{}`), Binary: true}},
	{"escaped conn, json string",
		Record{Conn: "c\x00\u2028\"", Seq: 1, Data: []byte(`"s"`)},
		Record{Conn: "c\x00\u2028\"", Seq: 1, Data: []byte(`"s"`)}},
	{"empty payload",
		Record{Conn: "a", Seq: 3},
		Record{Conn: "a", Seq: 3, Data: []byte{}, Binary: true}},
	{"decoded gzip frame",
		Record{Conn: "okx", Seq: 10, Version: 2, Decoded: "gzip", Data: []byte(`{"seq":10}`)},
		Record{Conn: "okx", Seq: 10, Version: 2, Decoded: "gzip", Data: []byte(`{"seq":10}`)}},
	{"oversize stub",
		Record{Conn: `a"b`, Seq: 9, Epoch: 1, Version: 7, Bad: true, Oversize: 1048600},
		Record{Conn: `a"b`, Seq: 9, Epoch: 1, Version: 7, Bad: true, Oversize: 1048600}},
	{"snapshot",
		Record{Conn: "book-1", Seq: 1200, Version: 3, Snapshot: true, Data: []byte(`{"seq":1200,"bids":[[1,2]]}`)},
		Record{Conn: "book-1", Seq: 1200, Version: 3, Snapshot: true, Data: []byte(`{"seq":1200,"bids":[[1,2]]}`)}},
}

// The wire format, byte for byte: a change here breaks every consumer.
func TestGolden(t *testing.T) {
	var got []byte
	for _, g := range golden {
		got = Append(got, g.in)
	}
	path := filepath.Join("testdata", "records.golden")
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("wire format changed:\ngot\n%s\nwant\n%s", got, want)
	}
	lines := bytes.SplitAfter(want, []byte("\n"))
	if len(lines) != len(golden)+1 || len(lines[len(golden)]) != 0 {
		t.Fatalf("%d lines for %d records: every record must be exactly one line", len(lines)-1, len(golden))
	}
	for i, g := range golden {
		r, err := Parse(lines[i])
		if err != nil {
			t.Fatalf("%s: %v", g.name, err)
		}
		if !reflect.DeepEqual(r, g.back) {
			t.Errorf("%s: parsed %+v, want %+v", g.name, r, g.back)
		}
	}
}

func TestParseRefuses(t *testing.T) {
	for name, line := range map[string]string{
		"not json":             `<html>`,
		"empty":                ``,
		"an array":             `[{"conn":"a","seq":1,"data":1}]`,
		"no conn":              `{"seq":1,"data":1}`,
		"empty conn":           `{"conn":"","seq":1,"data":1}`,
		"no payload":           `{"conn":"a","seq":1}`,
		"both payloads":        `{"conn":"a","seq":1,"data":1,"data_b64":"AA=="}`,
		"bad base64":           `{"conn":"a","seq":1,"data_b64":"!"}`,
		"two values":           `{"conn":"a","seq":1,"data":1}{"conn":"a","seq":2,"data":1}`,
		"trailing brace":       `{"conn":"a","seq":1,"data":1}}`,
		"seq not a number":     `{"conn":"a","seq":"1","data":1}`,
		"oversize not bad":     `{"conn":"a","seq":1,"oversize":5}`,
		"oversize and payload": `{"conn":"a","seq":1,"bad":true,"oversize":5,"data":1}`,
		"negative oversize":    `{"conn":"a","seq":1,"bad":true,"oversize":-5}`,
		"negative version":     `{"conn":"a","seq":1,"lease_version":-1,"data":1}`,
		"version not a number": `{"conn":"a","seq":1,"lease_version":"7","data":1}`,
	} {
		if r, err := Parse([]byte(line)); !errors.Is(err, ErrNotRecord) {
			t.Errorf("%s: Parse = %+v, %v; want ErrNotRecord", name, r, err)
		}
	}
}

// Unknown fields are a newer writer's: ignored.
func TestParseIgnoresUnknownFields(t *testing.T) {
	r, err := Parse([]byte(`{"conn":"a","seq":1,"epoch":0,"version":7,"data":{"k":1}}` + "\r\n"))
	if err != nil || r.Conn != "a" || r.Seq != 1 || string(r.Data) != `{"k":1}` {
		t.Fatalf("Parse = %+v, %v", r, err)
	}
}

func TestParseBatch(t *testing.T) {
	rs, err := ParseBatch([]byte(`[{"conn":"a","seq":1,"epoch":0,"lease_version":3,"data":{"ts":5}},{"conn":"b","seq":2,"epoch":1,"bad":true,"data_b64":"AA=="}]`))
	if err != nil {
		t.Fatal(err)
	}
	want := []Record{{Conn: "a", Seq: 1, Version: 3, Data: []byte(`{"ts":5}`)}, {Conn: "b", Seq: 2, Epoch: 1, Bad: true, Data: []byte{0}, Binary: true}}
	if !reflect.DeepEqual(rs, want) {
		t.Errorf("ParseBatch = %+v, want %+v", rs, want)
	}
	for name, body := range map[string]string{
		"not an array":  `{"conn":"a","seq":1,"data":1}`,
		"a bad element": `[{"conn":"a","seq":1,"data":1},{"seq":2,"data":1}]`,
	} {
		if _, err := ParseBatch([]byte(body)); !errors.Is(err, ErrNotRecord) {
			t.Errorf("%s: ParseBatch error %v, want ErrNotRecord", name, err)
		}
	}
}

// Parse takes outside input (files, Kinesis, HTTP bodies): it must never panic, and
// what it accepts must encode to one line that parses back to the same record.
func FuzzParse(f *testing.F) {
	for _, g := range golden {
		f.Add(Append(nil, g.in))
	}
	f.Add([]byte(`{"conn":"a","seq":1,"data":null}`))
	f.Add([]byte(`{"conn":"a","seq":-1,"epoch":9223372036854775807,"data": [1, 2] }`))
	f.Add([]byte(`{"conn":"\ud800","seq":1,"data_b64":""}`))
	f.Add([]byte(`{"conn":"a","seq":1,"lease_version":0,"data":1}`))
	f.Add([]byte(`{"conn":"a","seq":1,"lease_version":9223372036854775807,"bad":true,"oversize":1}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		r, err := Parse(line)
		if err != nil {
			if !errors.Is(err, ErrNotRecord) {
				t.Fatalf("error %v does not wrap ErrNotRecord", err)
			}
			return
		}
		enc := Append(nil, r)
		if bytes.IndexByte(enc, '\n') != len(enc)-1 {
			t.Fatalf("Append(%+v) = %q: not one line", r, enc)
		}
		back, err := Parse(enc)
		if err != nil {
			t.Fatalf("Append(%+v) = %q does not parse: %v", r, enc, err)
		}
		// Only the conn (invalid UTF-8 becomes U+FFFD) and JSON data (compacted) may
		// change, once: encoding what was parsed again is a fixed point.
		if back.Seq != r.Seq || back.Epoch != r.Epoch || back.Version != r.Version || back.Bad != r.Bad || back.Oversize != r.Oversize || back.Binary != r.Binary {
			t.Fatalf("%q parsed to %+v, encoded as %q, parsed back to %+v", line, r, enc, back)
		}
		if r.Binary && !bytes.Equal(back.Data, r.Data) {
			t.Fatalf("binary payload %x came back as %x", r.Data, back.Data)
		}
		if again := Append(nil, back); !bytes.Equal(again, enc) {
			t.Fatalf("not a fixed point: %q then %q", enc, again)
		}
	})
}
