package sinkrecord

// Verdict is what the consumer rule (docs/SINKS.md, "Fencing: effectively once")
// says of one record.
type Verdict int

const (
	// Accept: a record to act on.
	Accept Verdict = iota
	// Stale: its lease_version is below one already seen for its connection: a
	// displaced owner's write that landed late. The newer owner delivers (or
	// delivered) the same positions itself.
	Stale
	// Duplicate: its (epoch, seq) is at or below the last accepted one of its
	// connection: delivered again after a resume (at least once).
	Duplicate
)

func (v Verdict) String() string {
	switch v {
	case Accept:
		return "accept"
	case Stale:
		return "stale"
	case Duplicate:
		return "duplicate"
	}
	return "unknown"
}

// Fence applies the consumer rule per connection: keep the highest lease_version
// seen and the highest (epoch, seq) accepted; a record with a lower version is
// Stale, one at or below the last accepted position a Duplicate, anything else is
// accepted (and moves the position).
//
// Guarantees: fed a connection's records in the order they reached the consumer,
// the accepted ones have strictly increasing (epoch, seq), and none was written
// under a version lower than one the consumer saw before it.
//
// Non-guarantees: a record without a lease_version (Version 0, written before the
// field existed) is judged by its position only. A bad record (Bad: its seq is the
// last good one, not its own) has no position: it is Stale or accepted, never a
// Duplicate, so a bad record delivered twice is accepted twice. Whether a Duplicate
// is the same message as the one accepted at its position is the upstream's
// promise (its sequence numbers), or, in counter mode, the worker's count of frames
// since the resume point: see docs/SINKS.md.
//
// The zero Fence is ready to use; it is not safe for concurrent use.
type Fence struct {
	conns map[string]*FenceState
}

// FenceState is what a Fence keeps of one connection.
type FenceState struct {
	Version  int64 // the highest lease_version seen
	Epoch    int64 // the last accepted position's epoch,
	Seq      int64 // and sequence
	Accepted bool  // some positioned record was accepted (Epoch and Seq are set)
}

// Check judges r and updates its connection's state.
func (f *Fence) Check(r Record) Verdict {
	if f.conns == nil {
		f.conns = map[string]*FenceState{}
	}
	st := f.conns[r.Conn]
	if st == nil {
		st = &FenceState{}
		f.conns[r.Conn] = st
	}
	if r.Version != 0 {
		if r.Version < st.Version {
			return Stale
		}
		st.Version = r.Version
	}
	if r.Bad {
		return Accept
	}
	if st.Accepted && (r.Epoch < st.Epoch || r.Epoch == st.Epoch && r.Seq <= st.Seq) {
		return Duplicate
	}
	st.Epoch, st.Seq, st.Accepted = r.Epoch, r.Seq, true
	return Accept
}

// State returns what f keeps of connection conn (the zero FenceState if none).
func (f *Fence) State(conn string) FenceState {
	if st := f.conns[conn]; st != nil {
		return *st
	}
	return FenceState{}
}
