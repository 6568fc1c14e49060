package app

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/sockfleet/sockfleet/shared/local/kinesalite/kinesistest"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/shared/sinkrecord"
	"github.com/sockfleet/sockfleet/shared/wakeup"
)

// putConnSpec writes a STARTED connection with spec sp.
func (e *env) putConnSpec(id string, sp schema.Spec) {
	e.t.Helper()
	e.up.Touch(id)
	_, err := e.db.DB.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: &e.db.Table,
		Item: codec.EncodeConnection(codec.Connection{ID: id, DesiredState: schema.Started, WSURL: e.up.URL(id), Spec: sp})})
	if err != nil {
		e.t.Fatal(err)
	}
}

// Each connection's sink attribute routes it to its own destination among those the
// fleet allows: two Kinesis streams (on kinesalite, named as the worker's AWS
// settings reach them) and a file each get exactly their connection's records, in
// order; a connection without one goes to the fleet's sink; a sink the fleet does not
// allow is refused undialed with status invalid.
func TestSinkPerConnection(t *testing.T) {
	e := newEnv(t, rate)
	ka, kb := kinesistest.New(t, 2), kinesistest.New(t, 1)
	for _, kv := range ka.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	file := filepath.Join(t.TempDir(), "c3.jsonl")
	e.putConnSpec("c1", schema.Spec{Sink: ka.Stream})
	e.putConnSpec("c2", schema.Spec{Sink: kb.Stream})
	e.putConnSpec("c3", schema.Spec{Sink: "file:" + file})
	e.putConnSpec("c4", schema.Spec{Sink: "not-allowed"})
	e.putConnSpec("c5", schema.Spec{})
	wk := e.worker("w1", opts{sinks: ka.Stream + ", " + kb.Stream + " file:" + file})
	for _, r := range e.wake(wk, wakeup.NeedsOwner, 0, "c1", "c2", "c3", "c4", "c5") {
		if r.Result != wakeup.Acquired {
			t.Fatalf("wake: %+v", r)
		}
	}
	waitFor(t, 10*time.Second, "checkpoints past 40 on c1, c2, c3 and c5", func() bool {
		for _, id := range []string{"c1", "c2", "c3", "c5"} {
			if e.get(id).LastSeq < 40 {
				return false
			}
		}
		return true
	})
	waitFor(t, 5*time.Second, "c4 invalid", func() bool { return e.get("c4").Status == schema.StatusInvalid })
	c4 := e.get("c4")
	if want := `invalid sink: "not-allowed" is not among the destinations this fleet allows (SOCKFLEET_SINKS_ALLOWED)`; !strings.Contains(c4.StatusError, want) {
		t.Fatalf("c4 status_error %q, want %q", c4.StatusError, want)
	}
	if st := e.up.Stats("c4"); st.Connects != 0 {
		t.Fatalf("c4 dialed %d times", st.Connects)
	}
	if err := wk.stop(); err != nil {
		t.Fatal(err)
	}

	// In order, at least once: a record is never ahead of the next one due (no gap, no
	// reordering); a repeat is allowed only as a replay after a failed sink write
	// (the stream resumes after the last acknowledged checkpoint).
	replays := false
	read := func(what string, recs []sinkrecord.Record, id string) {
		t.Helper()
		next := int64(1)
		for i, r := range recs {
			if r.Conn != id || r.Seq > next {
				t.Fatalf("%s: record %d is %s seq %d, want %s seq at most %d (only its connection's, in order)", what, i, r.Conn, r.Seq, id, next)
			}
			if r.Seq == next {
				next++
			} else {
				replays = true
			}
		}
		if next <= 40 {
			t.Fatalf("%s: up to seq %d", what, next-1)
		}
	}
	for _, k := range []struct {
		env *kinesistest.Env
		id  string
	}{{ka, "c1"}, {kb, "c2"}} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		all, err := kinesistest.ReadAll(ctx, k.env.Kinesis, k.env.Stream)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		var recs []sinkrecord.Record
		for _, r := range all {
			v, err := sinkrecord.Parse(r.Data)
			if err != nil {
				t.Fatal(err)
			}
			recs = append(recs, v)
		}
		read(k.env.Stream, recs, k.id)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var recs []sinkrecord.Record
	for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		v, err := sinkrecord.Parse([]byte(line))
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, v)
	}
	read(file, recs, "c3")
	t.Logf("replays %v, failed sink writes %d", replays, wk.Metrics.SinkErrors.Load())
	if replays && wk.Metrics.SinkErrors.Load() == 0 {
		t.Fatal("records repeated without a failed sink write")
	}
	if got := wk.sink.count("c5"); got < 40 {
		t.Fatalf("fleet sink: %d records of c5", got)
	}
	for _, id := range []string{"c1", "c2", "c3", "c4"} {
		if n := wk.sink.count(id); n != 0 {
			t.Fatalf("%d records of %s in the fleet's sink", n, id)
		}
	}
}
