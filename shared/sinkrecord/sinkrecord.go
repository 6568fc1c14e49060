// Package sinkrecord is the wire format of a sink record (docs/SINKS.md): one JSON
// object per upstream message, a line on stdout and in files, a Kinesis record's
// data, an element of an HTTP sink's batch. The worker's sinks encode with Append;
// everything that reads a sink back decodes with Parse or ParseBatch.
//
// Guarantees: Append writes one line (no newline inside, one at the end) in a fixed
// field order, "conn", "seq", "epoch", "lease_version" (when not 0), then "bad", then
// "snapshot" (when true), then "decoded" (when the payload was decompressed: the
// decoding's name), then the payload: "data" (a text
// payload that is valid JSON, compacted) or "data_b64" (anything else, base64), or
// "oversize" instead of a payload. Parse accepts exactly one JSON object with a
// non-empty conn and exactly one payload (none for an oversize stub), and a record
// Append wrote parses back to the same fields. A record without "lease_version" (one
// written before the field existed) parses with Version 0, below every real version.
//
// Non-guarantee: the payload's frame type does not survive the trip. A text frame
// that is not valid JSON travels base64, as a binary frame does, and parses back as
// Binary; a JSON payload parses back compacted.
package sinkrecord

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// Record is one sink record.
type Record struct {
	Conn  string // connection id
	Seq   int64  // the message's sequence; for a passed-on bad message, the last good one
	Epoch int64  // sequence epoch: 0 until the upstream's numbering first resets
	// Version is the fencing token: the lease_version under which the message was
	// delivered (docs/SINKS.md, "Fencing"). 0: unknown (a record from before the field).
	Version int64
	Bad     bool // passed on although its sequence could not be parsed, or too large to send
	// Snapshot marks the answer of the connection's snapshot request: the state up to
	// and including Seq. Deltas at or below Seq are not delivered after it. A reader
	// that ignores the field sees an ordinary record (docs/SINKS.md, "Snapshots").
	Snapshot bool
	// Decoded names the decoding (gzip, deflate, zlib) that turned the upstream's
	// frame into Data; "" for a payload as it arrived.
	Decoded string
	// Oversize, with Bad, is the size in bytes of a message too large for a Kinesis
	// record; the record then carries no payload.
	Oversize int64
	Data     []byte // the payload
	// Binary marks a payload carried base64 ("data_b64"). Append sends a binary
	// payload base64, and a text one too when it is not valid JSON; Parse sets Binary
	// for every data_b64 payload.
	Binary bool
}

// Append appends r as one line, newline included.
func Append(b []byte, r Record) []byte {
	b = append(b, `{"conn":`...)
	b = appendString(b, r.Conn)
	b = append(b, `,"seq":`...)
	b = strconv.AppendInt(b, r.Seq, 10)
	b = append(b, `,"epoch":`...)
	b = strconv.AppendInt(b, r.Epoch, 10)
	if r.Version != 0 {
		b = append(b, `,"lease_version":`...)
		b = strconv.AppendInt(b, r.Version, 10)
	}
	if r.Bad {
		b = append(b, `,"bad":true`...)
	}
	if r.Snapshot {
		b = append(b, `,"snapshot":true`...)
	}
	if r.Decoded != "" {
		b = append(b, `,"decoded":`...)
		b = appendString(b, r.Decoded)
	}
	switch {
	case r.Oversize > 0:
		b = append(b, `,"oversize":`...)
		b = strconv.AppendInt(b, r.Oversize, 10)
	case !r.Binary && json.Valid(r.Data):
		b = append(b, `,"data":`...)
		buf := bytes.NewBuffer(b)
		_ = json.Compact(buf, r.Data) // cannot fail: Data is valid JSON
		b = buf.Bytes()
	default:
		b = append(b, `,"data_b64":"`...)
		b = base64.StdEncoding.AppendEncode(b, r.Data)
		b = append(b, '"')
	}
	return append(b, '}', '\n')
}

// appendString appends s as a JSON string (strconv.Quote's \x escapes are not JSON).
func appendString(b []byte, s string) []byte {
	q, _ := json.Marshal(s) // a string always marshals
	return append(b, q...)
}

// wire is a record as JSON holds it; the pointers tell a field's absence.
type wire struct {
	Conn     string          `json:"conn"`
	Seq      int64           `json:"seq"`
	Epoch    int64           `json:"epoch"`
	Version  int64           `json:"lease_version"`
	Bad      bool            `json:"bad"`
	Snapshot bool            `json:"snapshot"`
	Decoded  string          `json:"decoded"`
	Oversize int64           `json:"oversize"`
	Data     json.RawMessage `json:"data"`
	DataB64  *[]byte         `json:"data_b64"`
}

// ErrNotRecord wraps every error of Parse and ParseBatch.
var ErrNotRecord = errors.New("not a sink record")

// Parse decodes one record: one JSON object, white space (a line's newline) around
// it allowed. Unknown fields are ignored, so a newer writer may add some.
func Parse(line []byte) (Record, error) {
	var w wire
	if err := json.Unmarshal(line, &w); err != nil {
		return Record{}, fmt.Errorf("%w: %v", ErrNotRecord, err)
	}
	return w.record()
}

// ParseBatch decodes an HTTP sink's batch: a JSON array of records.
func ParseBatch(body []byte) ([]Record, error) {
	var ws []wire
	if err := json.Unmarshal(body, &ws); err != nil {
		return nil, fmt.Errorf("%w: batch: %v", ErrNotRecord, err)
	}
	out := make([]Record, len(ws))
	for i, w := range ws {
		r, err := w.record()
		if err != nil {
			return nil, fmt.Errorf("batch [%d]: %w", i, err)
		}
		out[i] = r
	}
	return out, nil
}

func (w wire) record() (Record, error) {
	r := Record{Conn: w.Conn, Seq: w.Seq, Epoch: w.Epoch, Version: w.Version, Bad: w.Bad, Snapshot: w.Snapshot, Decoded: w.Decoded, Oversize: w.Oversize}
	hasData := w.Data != nil
	switch {
	case w.Conn == "":
		return Record{}, fmt.Errorf("%w: no conn", ErrNotRecord)
	case w.Version < 0:
		return Record{}, fmt.Errorf("%w: negative lease_version", ErrNotRecord)
	case w.Oversize < 0:
		return Record{}, fmt.Errorf("%w: negative oversize", ErrNotRecord)
	case w.Oversize > 0 && (!w.Bad || hasData || w.DataB64 != nil):
		return Record{}, fmt.Errorf("%w: an oversize stub is bad and carries no payload", ErrNotRecord)
	case w.Oversize > 0:
		return r, nil
	case hasData && w.DataB64 != nil:
		return Record{}, fmt.Errorf("%w: both data and data_b64", ErrNotRecord)
	case hasData:
		r.Data = []byte(w.Data)
	case w.DataB64 != nil:
		r.Data, r.Binary = *w.DataB64, true
	default:
		return Record{}, fmt.Errorf("%w: no data or data_b64", ErrNotRecord)
	}
	return r, nil
}
