package fleet

import (
	"testing"
	"time"
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
