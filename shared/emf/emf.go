// Package emf writes CloudWatch Embedded Metric Format log lines: one JSON object per
// line, which CloudWatch Logs turns into metrics without any API call. In Lambda,
// write them to stdout; locally they are ordinary JSON log lines. Only the reconciler
// uses it: the worker writes its own lines with its counters (worker/internal/metrics).
package emf

import (
	"encoding/json"
	"fmt"
	"io"
	"time"
)

// Units used by sockfleet.
const (
	Count   = "Count"
	Seconds = "Seconds"
)

// Metric is one value.
type Metric struct {
	Name  string
	Unit  string
	Value float64
}

// Dimension is one dimension of a line: its name, and its value for every metric
// of the line.
type Dimension struct{ Name, Value string }

// Write writes one line carrying ms in namespace, with no dimensions (alarms and
// dashboards refer to the metric by namespace and name only).
func Write(w io.Writer, namespace string, ts time.Time, ms ...Metric) error {
	return WriteDims(w, namespace, nil, ts, ms...)
}

// WriteDims writes one line carrying ms in namespace under one dimension set, dims
// (none: the metrics have no dimension). The line goes out in one Write call, so
// a caller that serializes its calls never interleaves lines.
func WriteDims(w io.Writer, namespace string, dims []Dimension, ts time.Time, ms ...Metric) error {
	type def struct {
		Name string `json:"Name"`
		Unit string `json:"Unit"`
	}
	defs := make([]def, len(ms))
	line := map[string]any{}
	for i, m := range ms {
		defs[i] = def{m.Name, m.Unit}
		line[m.Name] = m.Value
	}
	names := make([]string, len(dims))
	for i, d := range dims {
		names[i] = d.Name
		line[d.Name] = d.Value
	}
	line["_aws"] = map[string]any{
		"Timestamp": ts.UnixMilli(),
		"CloudWatchMetrics": []any{map[string]any{
			"Namespace":  namespace,
			"Dimensions": [][]string{names},
			"Metrics":    defs,
		}},
	}
	b, err := json.Marshal(line)
	if err != nil {
		return fmt.Errorf("emf: %w", err)
	}
	if _, err := w.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("emf: %w", err)
	}
	return nil
}
