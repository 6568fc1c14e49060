package demoupstream

// Span is the run of numbers one socket was sent, First to Last.
type Span struct{ First, Last int64 }

// SentSpans lists the numbers stream id's closed sockets were sent, in the order they
// closed (a socket still open is not listed: close it first). Spans are exact for a
// LiveHead server, whose sockets are sent runs without holes.
func (s *Server) SentSpans(id string) []Span {
	var out []Span
	for _, e := range s.Events() {
		if e.Stream == id && e.Kind == Disconnect && e.Sent > 0 {
			out = append(out, Span{First: e.FirstSeq, Last: e.LastSeq})
		}
	}
	return out
}

// Tally compares what a LiveHead stream's sockets were sent with what a client
// delivered, by the numbers in the payloads.
type Tally struct {
	Sent       int64   // distinct numbers sent on some socket
	Delivered  int     // numbers delivered, duplicates included
	Missing    []int64 // sent on some socket and never delivered: a loss, in order
	Duplicates int     // deliveries of a number already delivered
	// Unsent: numbers between the first and the last sent that no socket was sent
	// (produced while the client had no socket open: the upstream's gap).
	Unsent int64
}

// Count tallies delivered (numbers, in delivery order) against spans.
func Count(spans []Span, delivered []int64) Tally {
	t := Tally{Delivered: len(delivered)}
	got := make(map[int64]bool, len(delivered))
	for _, n := range delivered {
		if got[n] {
			t.Duplicates++
		}
		got[n] = true
	}
	sent := map[int64]bool{}
	lo, hi := int64(0), int64(-1)
	for _, sp := range spans {
		for n := sp.First; n <= sp.Last; n++ {
			sent[n] = true
		}
		if hi < lo || sp.First < lo {
			lo = sp.First
		}
		hi = max(hi, sp.Last)
	}
	t.Sent = int64(len(sent))
	for n := lo; n <= hi; n++ {
		switch {
		case !sent[n]:
			t.Unsent++
		case !got[n]:
			t.Missing = append(t.Missing, n)
		}
	}
	return t
}
