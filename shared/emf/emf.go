// Package emf writes CloudWatch Embedded Metric Format log lines: one JSON object per
// line, which CloudWatch Logs turns into metrics without any API call. In Lambda,
// write them to stdout; locally they are ordinary JSON log lines. It is sockfleet's
// one EMF encoder: the reconciler writes through it, and so does the worker
// (worker/internal/metrics, which adds its ServiceName dimension).
//
// A line that would break the specification (CloudWatch Logs would drop its metrics
// without a word) is refused with an error instead: see WriteDims.
package emf

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"time"
	"unicode/utf8"
)

// Units used by sockfleet.
const (
	Count   = "Count"
	Seconds = "Seconds"
)

// Limits of the specification, per metric directive.
const (
	MaxMetrics    = 100
	MaxDimensions = 30
)

// units are CloudWatch's standard units, the only values the specification allows
// in a metric definition's Unit.
var units = map[string]bool{
	"Seconds": true, "Microseconds": true, "Milliseconds": true,
	"Bytes": true, "Kilobytes": true, "Megabytes": true, "Gigabytes": true, "Terabytes": true,
	"Bits": true, "Kilobits": true, "Megabits": true, "Gigabits": true, "Terabits": true,
	"Percent": true, "Count": true,
	"Bytes/Second": true, "Kilobytes/Second": true, "Megabytes/Second": true, "Gigabytes/Second": true, "Terabytes/Second": true,
	"Bits/Second": true, "Kilobits/Second": true, "Megabits/Second": true, "Gigabits/Second": true, "Terabits/Second": true,
	"Count/Second": true, "None": true,
}

// ErrInvalid is wrapped by every error about a line that would not be valid EMF.
var ErrInvalid = errors.New("emf: invalid line")

// Metric is one value.
type Metric struct {
	Name  string
	Unit  string // one of CloudWatch's standard units; empty: none given
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
//
// It refuses, with an error wrapping ErrInvalid and writing nothing: an empty
// namespace; no metric, or more than MaxMetrics; more than MaxDimensions; a metric or
// dimension name that is empty, "_aws", or used twice (each is a member of the line);
// a dimension value that is blank; a namespace, name or value that is not UTF-8 (JSON
// would turn it into another string, and two names into one); a unit that is not a CloudWatch unit; a value that
// is NaN or infinite (JSON has no such number).
func WriteDims(w io.Writer, namespace string, dims []Dimension, ts time.Time, ms ...Metric) error {
	if err := check(namespace, dims, ms); err != nil {
		return err
	}
	type def struct {
		Name string `json:"Name"`
		Unit string `json:"Unit,omitempty"`
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

func check(namespace string, dims []Dimension, ms []Metric) error {
	switch {
	case strings.TrimSpace(namespace) == "":
		return fmt.Errorf("%w: empty namespace", ErrInvalid)
	case !utf8.ValidString(namespace):
		return fmt.Errorf("%w: namespace %q: not UTF-8", ErrInvalid, namespace)
	case len(ms) == 0:
		return fmt.Errorf("%w: no metric", ErrInvalid)
	case len(ms) > MaxMetrics:
		return fmt.Errorf("%w: %d metrics, at most %d", ErrInvalid, len(ms), MaxMetrics)
	case len(dims) > MaxDimensions:
		return fmt.Errorf("%w: %d dimensions, at most %d", ErrInvalid, len(dims), MaxDimensions)
	}
	seen := map[string]bool{}
	member := func(what, name string) error {
		switch {
		case strings.TrimSpace(name) == "":
			return fmt.Errorf("%w: empty %s name", ErrInvalid, what)
		case !utf8.ValidString(name):
			return fmt.Errorf("%w: %s %q: not UTF-8", ErrInvalid, what, name)
		case name == "_aws":
			return fmt.Errorf("%w: %s named _aws", ErrInvalid, what)
		case seen[name]:
			return fmt.Errorf("%w: %s %q: name used twice", ErrInvalid, what, name)
		}
		seen[name] = true
		return nil
	}
	for _, m := range ms {
		if err := member("metric", m.Name); err != nil {
			return err
		}
		if m.Unit != "" && !units[m.Unit] {
			return fmt.Errorf("%w: metric %q: unit %q is not a CloudWatch unit", ErrInvalid, m.Name, m.Unit)
		}
		if math.IsNaN(m.Value) || math.IsInf(m.Value, 0) {
			return fmt.Errorf("%w: metric %q: value %v", ErrInvalid, m.Name, m.Value)
		}
	}
	for _, d := range dims {
		if err := member("dimension", d.Name); err != nil {
			return err
		}
		if strings.TrimSpace(d.Value) == "" || !utf8.ValidString(d.Value) {
			return fmt.Errorf("%w: dimension %q: value %q blank or not UTF-8", ErrInvalid, d.Name, d.Value)
		}
	}
	return nil
}
