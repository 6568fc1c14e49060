package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"
	"github.com/sockfleet/sockfleet/shared/local/kinesalite/kinesistest"
	"github.com/sockfleet/sockfleet/shared/sinkrecord"
)

// Records as the sinks write them (docs/SINKS.md), with a gap, a repeat, a bad
// message, a binary one, an oversize stub and a line that is no record.
var tailInput = []string{
	`{"conn":"a","seq":1,"epoch":0,"data":{"seq":1,"p":"x"}}`,
	`{"conn":"a","seq":2,"epoch":0,"data":{"seq":2}}`,
	`{"conn":"b","seq":7,"epoch":1,"data_b64":"AAH/"}`,
	`{"conn":"a","seq":2,"epoch":0,"data":{"seq":2}}`,
	`{"conn":"a","seq":5,"epoch":0,"data":{"seq":5}}`,
	`{"conn":"a","seq":5,"epoch":0,"bad":true,"data_b64":"bm90IGpzb24="}`,
	`{"conn":"b","seq":8,"epoch":1,"bad":true,"oversize":1048700}`,
	`not a record`,
}

var tailWant = []string{
	"a\tseq=1 epoch=0\t{\"seq\":1,\"p\":\"x\"}",
	"b\tseq=7 epoch=1\t(3 bytes) 0001ff",
	"a\tseq=5 epoch=0 bad\t(8 bytes) 6e6f74206a736f6e",
	"b\tseq=8 epoch=1 bad\t(oversize: 1048700 bytes, not delivered)",
	"! not a sink record",
	"2 connections",
	"a\tseq=2 epoch=0 duplicate\t{\"seq\":2}",
	"a\t5 messages, seq 1..5, 1 gaps, 1 repeats, 1 bad; dropped 0 stale, 1 duplicates (lease_version 0)",
	"b\t2 messages, seq 7..7 (epoch 1), 0 gaps, 0 repeats, 1 bad; dropped 0 stale, 0 duplicates (lease_version 0)",
	"1 lines were not sink records",
}

func checkTail(t *testing.T, out string, want []string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("tail output lacks %q:\n%s", w, out)
		}
	}
}

func TestTailFile(t *testing.T) {
	_, cmd := setup(t)
	path := filepath.Join(t.TempDir(), "w1.jsonl")
	if err := os.WriteFile(path, []byte(strings.Join(tailInput, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := cmd("tail", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	checkTail(t, out, tailWant)
	out, err = cmd("tail", path, "--conn", "b")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "a\tseq=") || !strings.Contains(out, "1 connections") {
		t.Fatalf("--conn b printed others:\n%s", out)
	}
}

// A file sink's records of one connection across two owners (lease versions 5 then
// 9), as the consumer rule sees them: the new owner's resume repeats what the old one
// delivered past its checkpoint (duplicates), the old owner's write abandoned at its
// timeout lands late (stale, even above the accepted position), and the upstream's
// numbering restarts (a new epoch: neither a gap nor a repeat).
func TestTailFence(t *testing.T) {
	_, cmd := setup(t)
	in := []string{
		`{"conn":"t","seq":10,"epoch":0,"lease_version":5,"data":10}`,
		`{"conn":"t","seq":11,"epoch":0,"lease_version":5,"data":11}`,
		`{"conn":"t","seq":10,"epoch":0,"lease_version":9,"data":10}`, // resumed after the checkpoint 9
		`{"conn":"t","seq":11,"epoch":0,"lease_version":9,"data":11}`,
		`{"conn":"t","seq":12,"epoch":0,"lease_version":9,"data":12}`,
		`{"conn":"t","seq":12,"epoch":0,"lease_version":5,"data":12}`, // the old owner's late write
		`{"conn":"t","seq":13,"epoch":0,"lease_version":5,"data":13}`,
		`{"conn":"t","seq":13,"epoch":0,"lease_version":9,"data":13}`,
		`{"conn":"t","seq":1,"epoch":1,"lease_version":9,"data":1}`, // the numbering restarted
		`{"conn":"t","seq":1,"epoch":1,"lease_version":9,"data":1}`,
		`{"conn":"t","seq":2,"epoch":1,"lease_version":9,"data":2}`,
	}
	path := filepath.Join(t.TempDir(), "w.jsonl")
	if err := os.WriteFile(path, []byte(strings.Join(in, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := cmd("tail", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	var marks []string
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Split(l, "\t"); len(f) == 3 {
			marks = append(marks, f[1])
		}
	}
	want := []string{
		"seq=10 epoch=0 lease_version=5", "seq=11 epoch=0 lease_version=5",
		"seq=10 epoch=0 lease_version=9 duplicate", "seq=11 epoch=0 lease_version=9 duplicate",
		"seq=12 epoch=0 lease_version=9",
		"seq=12 epoch=0 lease_version=5 stale", "seq=13 epoch=0 lease_version=5 stale",
		"seq=13 epoch=0 lease_version=9",
		"seq=1 epoch=1 lease_version=9", "seq=1 epoch=1 lease_version=9 duplicate", "seq=2 epoch=1 lease_version=9",
	}
	if strings.Join(marks, "|") != strings.Join(want, "|") {
		t.Fatalf("records judged\n%s\nwant\n%s", strings.Join(marks, "\n"), strings.Join(want, "\n"))
	}
	checkTail(t, out, []string{"t\t11 messages, seq 1..2 (epoch 1), 0 gaps, 5 repeats, 0 bad; dropped 2 stale, 3 duplicates (lease_version 9)"})
}

func TestTailKinesis(t *testing.T) {
	_, cmd := setup(t)
	k := kinesistest.New(t, 2)
	for _, kv := range k.Environ() {
		key, v, _ := strings.Cut(kv, "=")
		t.Setenv(key, v)
	}
	var entries []types.PutRecordsRequestEntry
	for _, l := range tailInput {
		pk := "x"
		if r, err := sinkrecord.Parse([]byte(l)); err == nil {
			pk = r.Conn
		}
		entries = append(entries, types.PutRecordsRequestEntry{Data: []byte(l + "\n"), PartitionKey: aws.String(pk)})
	}
	if _, err := k.Kinesis.PutRecords(context.Background(), &kinesis.PutRecordsInput{StreamName: &k.Stream, Records: entries}); err != nil {
		t.Fatal(err)
	}
	out, err := cmd("tail", "kinesis:"+k.Stream)
	if err != nil {
		t.Fatal(err)
	}
	checkTail(t, out, tailWant)
}

func TestTailBadInput(t *testing.T) {
	_, cmd := setup(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"tail"}, "bad usage"},
		{[]string{"tail", "a", "b"}, "one source"},
		{[]string{"tail", "x", "--nope"}, "unknown flag"},
		{[]string{"tail", "file:/no/such/file"}, "no such file"},
	} {
		_, err := cmd(c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v; want an error with %q", c.args, err, c.want)
		}
	}
	k := kinesistest.New(t, 1)
	for _, kv := range k.Environ() {
		key, v, _ := strings.Cut(kv, "=")
		t.Setenv(key, v)
	}
	if _, err := cmd("tail", "kinesis:no-such-stream"); err == nil || !strings.Contains(err.Error(), "ResourceNotFound") {
		t.Errorf("tail of a missing stream: %v", err)
	}
}

// tail prints whatever a sink holds: a line that is no record is said, never a panic
// (shared/sinkrecord fuzzes the decoder itself).
func FuzzTailLine(f *testing.F) {
	for _, l := range tailInput {
		f.Add([]byte(l))
	}
	f.Add([]byte(`{"conn":"a","data":1,"data_b64":"AA=="}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var out strings.Builder
		p := &printer{out: &out, tallies: map[string]*tally{}}
		p.line(b)
		l := bytes.TrimRight(b, "\r\n")
		_, err := sinkrecord.Parse(l)
		if want := err != nil && len(l) > 0; (p.skipped == 1) != want || (want && !strings.HasPrefix(out.String(), "! ")) {
			t.Fatalf("line %q: printed %q, %d skipped; parse error %v", b, out.String(), p.skipped, err)
		}
	})
}

// A snapshot record is shown as one, and the jump to its sequence is no gap.
func TestTailSnapshot(t *testing.T) {
	_, cmd := setup(t)
	path := filepath.Join(t.TempDir(), "w1.jsonl")
	in := []string{
		`{"conn":"book","seq":40,"epoch":0,"snapshot":true,"data":{"seq":40}}`,
		`{"conn":"book","seq":41,"epoch":0,"data":{"seq":41}}`,
		`{"conn":"book","seq":90,"epoch":0,"snapshot":true,"data":{"seq":90}}`,
		`{"conn":"book","seq":91,"epoch":0,"data":{"seq":91}}`,
		`{"conn":"book","seq":93,"epoch":0,"data":{"seq":93}}`,
	}
	if err := os.WriteFile(path, []byte(strings.Join(in, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := cmd("tail", path)
	if err != nil {
		t.Fatal(err)
	}
	checkTail(t, out, []string{"book\tseq=90 epoch=0 snapshot\t", "book\t5 messages, seq 40..93, 2 snapshots, 1 gaps, 0 repeats"})
}
