package fleet

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/sockfleet/sockfleet/shared/local/demoupstream"
	"github.com/sockfleet/sockfleet/shared/sinkrecord"
)

// Delivered is what the sinks of a fleet hold for one connection.
type Delivered struct {
	Seqs       map[int64]int // sequence -> times delivered
	Duplicates int
	Min, Max   int64
}

// ReadSinks reads every worker's sink file under dir/sinks and groups the delivered
// sequence numbers by connection.
func ReadSinks(dir string) (map[string]*Delivered, error) {
	files, err := filepath.Glob(filepath.Join(dir, "sinks", "*.jsonl"))
	if err != nil {
		return nil, err
	}
	out := map[string]*Delivered{}
	for _, f := range files {
		if err := readSink(f, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func readSink(path string, out map[string]*Delivered) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	var torn error // a bad line is fine only as the last one: a worker killed mid-write
	for sc.Scan() {
		if torn != nil {
			return torn
		}
		m, err := sinkrecord.Parse(sc.Bytes())
		if err != nil {
			torn = fmt.Errorf("%s: bad line: %v", path, err)
			continue
		}
		if m.Bad {
			continue
		}
		d := out[m.Conn]
		if d == nil {
			d = &Delivered{Seqs: map[int64]int{}, Min: m.Seq, Max: m.Seq}
			out[m.Conn] = d
		}
		d.Seqs[m.Seq]++
		if d.Seqs[m.Seq] > 1 {
			d.Duplicates++
		}
		d.Min, d.Max = min(d.Min, m.Seq), max(d.Max, m.Seq)
	}
	return sc.Err()
}

// Gaps lists the sequence numbers missing between 1 and the highest delivered.
func (d *Delivered) Gaps() []int64 {
	var gaps []int64
	for s := int64(1); s <= d.Max; s++ {
		if d.Seqs[s] == 0 {
			gaps = append(gaps, s)
			if len(gaps) >= 20 {
				break
			}
		}
	}
	return gaps
}

// Overlap is how long, in total and at most at once, a stream had more than one
// client: two workers streaming the same connection.
type Overlap struct {
	Total, Longest time.Duration
	MaxClients     int
}

// Overlaps computes, per stream, the periods with two or more clients from the
// upstream's connection log.
func Overlaps(evs []demoupstream.Event) map[string]Overlap {
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].Time.Before(evs[j].Time) })
	start := map[string]time.Time{}
	out := map[string]Overlap{}
	for _, e := range evs {
		o := out[e.Stream]
		o.MaxClients = max(o.MaxClients, e.Clients)
		switch {
		case e.Clients >= 2 && start[e.Stream].IsZero():
			start[e.Stream] = e.Time
		case e.Clients < 2 && !start[e.Stream].IsZero():
			d := e.Time.Sub(start[e.Stream])
			o.Total += d
			o.Longest = max(o.Longest, d)
			start[e.Stream] = time.Time{}
		}
		out[e.Stream] = o
	}
	return out
}
