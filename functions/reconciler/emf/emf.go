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

// Write writes one line carrying ms in namespace, with no dimensions (alarms and
// dashboards refer to the metric by namespace and name only).
func Write(w io.Writer, namespace string, ts time.Time, ms ...Metric) error {
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
	line["_aws"] = map[string]any{
		"Timestamp": ts.UnixMilli(),
		"CloudWatchMetrics": []any{map[string]any{
			"Namespace":  namespace,
			"Dimensions": [][]string{{}},
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
