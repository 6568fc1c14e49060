package sinkrecord

import "testing"

// The consumer rule, record by record, on crafted streams of one or two connections.
func TestFence(t *testing.T) {
	type step struct {
		r    Record
		want Verdict
	}
	rec := func(conn string, v, epoch, seq int64) Record {
		return Record{Conn: conn, Version: v, Epoch: epoch, Seq: seq, Data: []byte("1")}
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"in order", []step{{rec("a", 5, 0, 1), Accept}, {rec("a", 5, 0, 2), Accept}, {rec("a", 5, 0, 4), Accept}}},
		{"a late write of an old token after a newer one", []step{
			{rec("a", 5, 0, 10), Accept},
			{rec("a", 9, 0, 11), Accept}, // the new owner, resumed after 10
			{rec("a", 5, 0, 11), Stale},  // the old owner's abandoned write, landed late
			{rec("a", 5, 0, 12), Stale},  // even above the accepted position
			{rec("a", 9, 0, 12), Accept},
		}},
		{"a duplicate after a resume", []step{
			{rec("a", 5, 0, 10), Accept}, {rec("a", 5, 0, 11), Accept},
			{rec("a", 9, 0, 10), Duplicate}, // the new owner resumed from a checkpoint behind the sink
			{rec("a", 9, 0, 11), Duplicate},
			{rec("a", 9, 0, 12), Accept},
		}},
		{"an epoch change", []step{
			{rec("a", 5, 0, 900), Accept},
			{rec("a", 5, 1, 1), Accept}, // the upstream's numbering restarted
			{rec("a", 5, 0, 901), Duplicate},
			{rec("a", 9, 1, 1), Duplicate},
			{rec("a", 9, 1, 2), Accept},
		}},
		{"connections are apart", []step{
			{rec("a", 9, 0, 5), Accept}, {rec("b", 5, 0, 5), Accept}, {rec("b", 5, 0, 6), Accept},
		}},
		{"no version: judged by position only", []step{
			{rec("a", 9, 0, 5), Accept}, {rec("a", 0, 0, 6), Accept}, {rec("a", 0, 0, 6), Duplicate},
		}},
		{"a bad record has no position", []step{
			{rec("a", 9, 0, 5), Accept},
			{Record{Conn: "a", Version: 9, Seq: 5, Bad: true}, Accept},
			{Record{Conn: "a", Version: 8, Seq: 5, Bad: true}, Stale},
			{rec("a", 9, 0, 6), Accept},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var f Fence
			for i, s := range tc.steps {
				if got := f.Check(s.r); got != s.want {
					t.Fatalf("step %d (%+v): %v, want %v", i, s.r, got, s.want)
				}
			}
		})
	}
}

func TestFenceState(t *testing.T) {
	var f Fence
	if st := f.State("a"); st != (FenceState{}) {
		t.Fatalf("unknown connection: %+v", st)
	}
	f.Check(Record{Conn: "a", Version: 9, Epoch: 1, Seq: 3})
	f.Check(Record{Conn: "a", Version: 4, Epoch: 1, Seq: 7})
	if st, want := f.State("a"), (FenceState{Version: 9, Epoch: 1, Seq: 3, Accepted: true}); st != want {
		t.Fatalf("state %+v, want %+v", st, want)
	}
}
