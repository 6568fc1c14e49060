package fleet

import (
	"net/http"
	"testing"
	"time"

	"github.com/sockfleet/sockfleet/shared/sinkrecord"
)

func arrivals(spec ...any) []Arrival {
	var out []Arrival
	t0 := time.Now()
	for i := 0; i < len(spec); i += 3 {
		w, from, to := spec[i].(string), int64(spec[i+1].(int)), int64(spec[i+2].(int))
		for s := from; s <= to; s++ {
			out = append(out, Arrival{Worker: w, Seq: s, At: t0.Add(time.Duration(len(out)) * time.Millisecond)})
		}
	}
	return out
}

func TestDeliveryChecks(t *testing.T) {
	for _, tc := range []struct {
		name          string
		arr           []Arrival
		serial, multi bool // which checks pass
	}{
		{"handoff", arrivals("a", 1, 10, "b", 11, 20), true, true},
		{"handoff and back", arrivals("a", 1, 10, "b", 11, 20, "a", 21, 30), true, true},
		{"crash takeover repeats", arrivals("a", 1, 10, "b", 8, 20), false, true},
		{"gap", arrivals("a", 1, 10, "b", 12, 20), false, false},
		{"two deliverers", arrivals("a", 1, 10, "b", 8, 8, "a", 11, 11, "b", 9, 9, "a", 12, 12), false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := CheckSerial(tc.arr); (err == nil) != tc.serial {
				t.Errorf("CheckSerial: %v", err)
			}
			if err := CheckOneDeliverer(tc.arr); (err == nil) != tc.multi {
				t.Errorf("CheckOneDeliverer: %v", err)
			}
		})
	}
	if n := len(Stints(arrivals("a", 1, 3, "b", 4, 5, "a", 6, 6))); n != 3 {
		t.Fatalf("%d stints, want 3", n)
	}
}

// A worker that gave up on a sink write resumes from its checkpoint: a replay is
// accepted for it alone, and only as one run going on one by one from the rewind.
func TestCheckSerialReplays(t *testing.T) {
	gaveUp := func(w string) bool { return w == "a" }
	for _, tc := range []struct {
		name    string
		arr     []Arrival
		replays int
		ok      bool
	}{
		{"replay after a sink failure", arrivals("a", 1, 26, "a", 17, 40, "b", 41, 50), 1, true},
		{"one record again", arrivals("a", 1, 160, "a", 160, 170), 1, true},
		{"replay by a worker that gave up nothing", arrivals("b", 1, 26, "b", 17, 40), 0, false},
		{"replay then the old session again", arrivals("a", 1, 26, "a", 17, 18, "a", 27, 27), 1, false},
		{"another worker's repeat", arrivals("a", 1, 26, "b", 17, 40), 0, false},
		{"a gap after a replay", arrivals("a", 1, 26, "a", 17, 20, "a", 22, 30), 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, n, err := CheckSerialReplays(tc.arr, gaveUp)
			if (err == nil) != tc.ok || n != tc.replays {
				t.Errorf("%d replays, %v; want %d, ok %v", n, err, tc.replays, tc.ok)
			}
			if _, err := CheckSerial(tc.arr); err == nil {
				t.Error("CheckSerial accepted a replay")
			}
		})
	}
}

// Only the paused worker's messages produced before the pause and arriving after it
// are split off.
func TestLandedAfterPause(t *testing.T) {
	at := time.UnixMilli(10_000)
	arr := []Arrival{
		{Worker: "a", Seq: 1, TS: 9_000, At: time.UnixMilli(9_001)},   // before the pause
		{Worker: "b", Seq: 1, TS: 9_500, At: time.UnixMilli(12_000)},  // another worker
		{Worker: "a", Seq: 2, TS: 9_900, At: time.UnixMilli(15_000)},  // in flight at the pause
		{Worker: "a", Seq: 3, TS: 15_100, At: time.UnixMilli(15_200)}, // read after it
	}
	kept, late := LandedAfterPause(arr, "a", at)
	if len(late) != 1 || late[0] != 2 || len(kept) != 3 || kept[1].Worker != "b" || kept[2].Seq != 3 {
		t.Fatalf("kept %+v, late %v", kept, late)
	}
	if len(arr) != 4 {
		t.Fatal("the input was changed")
	}
}

// The fencing step drops what arrives under a lower lease version than one before it.
func TestCollectorFenced(t *testing.T) {
	arr := []Arrival{
		{Worker: "a", Seq: 1, Version: 5}, {Worker: "a", Seq: 2, Version: 5},
		{Worker: "b", Seq: 2, Version: 9}, // b resumed after a's checkpoint 1
		{Worker: "a", Seq: 3, Version: 5}, // a's write in flight at its pause, landed late
		{Worker: "b", Seq: 3, Version: 9},
	}
	kept, stale := Fenced(arr)
	if len(stale) != 1 || stale[0].Worker != "a" || stale[0].Seq != 3 || len(kept) != 4 || kept[3].Worker != "b" {
		t.Fatalf("kept %+v, stale %+v", kept, stale)
	}
}

// The collector notes a batch whose headers disagree with its records.
func TestCollectorHeaderMismatch(t *testing.T) {
	recs := []sinkrecord.Record{{Conn: "c", Version: 7}, {Conn: "c", Version: 7}}
	h := http.Header{}
	h.Set("Sockfleet-Conn", "c")
	h.Set("Sockfleet-Lease-Version", "7")
	if why := headerMismatch(h, recs); why != "" {
		t.Fatalf("matching headers: %s", why)
	}
	for name, hv := range map[string][2]string{"version": {"c", "6"}, "conn": {"d", "7"}, "none": {"", ""}} {
		h := http.Header{}
		h.Set("Sockfleet-Conn", hv[0])
		h.Set("Sockfleet-Lease-Version", hv[1])
		if headerMismatch(h, recs) == "" {
			t.Errorf("%s: a mismatch went unnoticed", name)
		}
	}
}

// TwoDeliverers counts only the time two workers' delivery spans cover together.
func TestTwoDeliverers(t *testing.T) {
	ms := func(w string, at ...int) []Arrival {
		var out []Arrival
		for _, a := range at {
			out = append(out, Arrival{Worker: w, At: time.UnixMilli(int64(a))})
		}
		return out
	}
	merge := func(parts ...[]Arrival) []Arrival {
		var out []Arrival
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	idle := 200 * time.Millisecond
	for _, tc := range []struct {
		name string
		arr  []Arrival
		want time.Duration
	}{
		{"one worker", ms("a", 0, 50, 100, 150), 0},
		{"a move", merge(ms("a", 0, 50, 100), ms("b", 150, 200)), 0},
		{"a move back after a pause of the first", merge(ms("a", 0, 50), ms("b", 100, 150), ms("a", 400, 450)), 0},
		{"300ms at once", merge(ms("a", 0, 100, 200, 300, 400, 500), ms("b", 200, 350, 500, 600)), 300 * time.Millisecond},
		{"three at once counts once", merge(ms("a", 0, 100, 200), ms("b", 0, 100, 200), ms("c", 0, 100, 200)), 200 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := TwoDeliverers(tc.arr, idle); got != tc.want {
				t.Errorf("got %s, want %s", got, tc.want)
			}
		})
	}
}
