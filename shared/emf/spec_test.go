package emf

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

// specErrors checks one line against the Embedded Metric Format specification
// (CloudWatch, "Specification: Embedded metric format"), independently of the
// encoder: a JSON object on one line; a root member _aws holding a Timestamp in
// milliseconds and a non-empty CloudWatchMetrics array of metric directives, with
// no other members; each directive with a Namespace, Dimensions (arrays of at most 30
// names, each a string member of the root) and Metrics (at most 100 definitions,
// each a Name that is a numeric member of the root and an optional standard Unit).
func specErrors(line []byte) []string {
	var errs []string
	bad := func(format string, a ...any) { errs = append(errs, fmt.Sprintf(format, a...)) }
	if !bytes.HasSuffix(line, []byte("\n")) || bytes.Count(line, []byte("\n")) != 1 {
		bad("not exactly one line")
	}
	var root map[string]any
	if err := json.Unmarshal(line, &root); err != nil {
		return append(errs, "not a JSON object: "+err.Error())
	}
	meta, ok := root["_aws"].(map[string]any)
	if !ok {
		return append(errs, "no _aws object")
	}
	for k := range meta {
		if k != "Timestamp" && k != "CloudWatchMetrics" && k != "LogGroupName" {
			bad("_aws member %q not in the specification", k)
		}
	}
	ts, ok := meta["Timestamp"].(float64)
	if !ok || ts != math.Trunc(ts) || ts < 946_684_800_000 { // milliseconds, after 2000
		bad("Timestamp %v: want epoch milliseconds", meta["Timestamp"])
	}
	dirs, ok := meta["CloudWatchMetrics"].([]any)
	if !ok || len(dirs) == 0 {
		return append(errs, "CloudWatchMetrics: want a non-empty array")
	}
	for _, d := range dirs {
		dir, ok := d.(map[string]any)
		if !ok {
			bad("directive %v: not an object", d)
			continue
		}
		for k := range dir {
			if k != "Namespace" && k != "Dimensions" && k != "Metrics" {
				bad("directive member %q not in the specification", k)
			}
		}
		if ns, ok := dir["Namespace"].(string); !ok || strings.TrimSpace(ns) == "" {
			bad("Namespace %v: want a non-empty string", dir["Namespace"])
		}
		sets, ok := dir["Dimensions"].([]any)
		if !ok {
			bad("Dimensions %v: want an array", dir["Dimensions"])
		}
		for _, s := range sets {
			set, ok := s.([]any)
			if !ok || len(set) > MaxDimensions {
				bad("dimension set %v: want an array of at most %d names", s, MaxDimensions)
			}
			for _, n := range set {
				name, _ := n.(string)
				if v, ok := root[name].(string); !ok || strings.TrimSpace(v) == "" {
					bad("dimension %v: no string member in the root", n)
				}
			}
		}
		defs, ok := dir["Metrics"].([]any)
		if !ok || len(defs) == 0 || len(defs) > MaxMetrics {
			bad("Metrics: want 1 to %d definitions, got %v", MaxMetrics, dir["Metrics"])
		}
		for _, m := range defs {
			def, ok := m.(map[string]any)
			if !ok {
				bad("metric definition %v: not an object", m)
				continue
			}
			name, ok := def["Name"].(string)
			if !ok || name == "" {
				bad("metric definition %v: no Name", def)
			}
			if _, ok := root[name].(float64); !ok {
				bad("metric %q: no numeric member in the root", name)
			}
			if u, ok := def["Unit"]; ok && !units[fmt.Sprint(u)] {
				bad("metric %q: unit %v is not a CloudWatch unit", name, u)
			}
		}
	}
	return errs
}

var at = time.UnixMilli(1_764_680_000_000)

func TestWriteIsValidEMF(t *testing.T) {
	many := make([]Metric, MaxMetrics)
	for i := range many {
		many[i] = Metric{Name: fmt.Sprintf("M%d", i), Unit: Count, Value: float64(i)}
	}
	wide := make([]Dimension, MaxDimensions)
	for i := range wide {
		wide[i] = Dimension{Name: fmt.Sprintf("D%d", i), Value: "v"}
	}
	for _, c := range []struct {
		name string
		dims []Dimension
		ms   []Metric
	}{
		{"no dimension", nil, []Metric{{Name: "Orphaned", Unit: Count, Value: 3}, {Name: "OldestSeconds", Unit: Seconds, Value: 12.5}}},
		{"service dimension", []Dimension{{"ServiceName", "svc"}}, []Metric{{Name: "IdleConnections", Unit: Count, Value: 2}}},
		{"no unit", nil, []Metric{{Name: "Ratio", Value: 0.25}}},
		{"the limits", wide, many},
	} {
		t.Run(c.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := WriteDims(&b, "Sockfleet", c.dims, at, c.ms...); err != nil {
				t.Fatal(err)
			}
			if errs := specErrors(b.Bytes()); len(errs) > 0 {
				t.Errorf("%s\n%s", strings.Join(errs, "\n"), b.Bytes())
			}
		})
	}
}

// The checker itself refuses lines that break the specification.
func TestSpecCheckerRefuses(t *testing.T) {
	for _, line := range []string{
		`{"A":1}`,
		`{"A":1,"_aws":{"Timestamp":1764680000,"CloudWatchMetrics":[{"Namespace":"N","Dimensions":[[]],"Metrics":[{"Name":"A"}]}]}}`,
		`{"A":1,"_aws":{"Timestamp":1764680000000,"CloudWatchMetrics":[]}}`,
		`{"A":1,"_aws":{"Timestamp":1764680000000,"CloudWatchMetrics":[{"Dimensions":[[]],"Metrics":[{"Name":"A"}]}]}}`,
		`{"A":"x","_aws":{"Timestamp":1764680000000,"CloudWatchMetrics":[{"Namespace":"N","Dimensions":[[]],"Metrics":[{"Name":"A"}]}]}}`,
		`{"A":1,"_aws":{"Timestamp":1764680000000,"CloudWatchMetrics":[{"Namespace":"N","Dimensions":[["S"]],"Metrics":[{"Name":"A"}]}]}}`,
		`{"A":1,"_aws":{"Timestamp":1764680000000,"CloudWatchMetrics":[{"Namespace":"N","Dimensions":[[]],"Metrics":[{"Name":"A","Unit":"Things"}]}]}}`,
	} {
		if errs := specErrors([]byte(line + "\n")); len(errs) == 0 {
			t.Errorf("accepted %s", line)
		}
	}
}

func TestWriteRefusesInvalid(t *testing.T) {
	ok := Metric{Name: "A", Unit: Count, Value: 1}
	for _, c := range []struct {
		name, namespace string
		dims            []Dimension
		ms              []Metric
		want            string
	}{
		{"empty namespace", " ", nil, []Metric{ok}, "empty namespace"},
		{"no metric", "N", nil, nil, "no metric"},
		{"too many metrics", "N", nil, make([]Metric, MaxMetrics+1), "101 metrics"},
		{"too many dimensions", "N", make([]Dimension, MaxDimensions+1), []Metric{ok}, "31 dimensions"},
		{"empty metric name", "N", nil, []Metric{{Unit: Count}}, "empty metric name"},
		{"metric named _aws", "N", nil, []Metric{{Name: "_aws"}}, "metric named _aws"},
		{"metric twice", "N", nil, []Metric{ok, ok}, `metric "A": name used twice`},
		{"dimension named like a metric", "N", []Dimension{{"A", "v"}}, []Metric{ok}, `dimension "A": name used twice`},
		{"blank dimension value", "N", []Dimension{{"S", ""}}, []Metric{ok}, `dimension "S": value "" blank`},
		{"name not UTF-8", "N", nil, []Metric{{Name: "\xdf"}}, `metric "\xdf": not UTF-8`},
		{"unknown unit", "N", nil, []Metric{{Name: "A", Unit: "count"}}, `unit "count" is not a CloudWatch unit`},
		{"NaN", "N", nil, []Metric{{Name: "A", Value: math.NaN()}}, `metric "A": value NaN`},
		{"infinite", "N", nil, []Metric{{Name: "A", Value: math.Inf(1)}}, `metric "A": value +Inf`},
	} {
		t.Run(c.name, func(t *testing.T) {
			var b bytes.Buffer
			err := WriteDims(&b, c.namespace, c.dims, at, c.ms...)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("err %v, want %q", err, c.want)
			}
			if b.Len() != 0 {
				t.Errorf("wrote %s", b.Bytes())
			}
		})
	}
}

// Whatever the names and values, a line is either refused as invalid or valid EMF.
func FuzzWriteDims(f *testing.F) {
	f.Add("Sockfleet", "IdleConnections", "Count", 2.0, "ServiceName", "svc")
	f.Add("N", "A", "", math.NaN(), "", "")
	f.Add("N", "_aws", "Seconds", 1.0, "A", " ")
	f.Fuzz(func(t *testing.T, namespace, metric, unit string, v float64, dim, value string) {
		var dims []Dimension
		if dim != "" {
			dims = []Dimension{{dim, value}}
		}
		var b bytes.Buffer
		err := WriteDims(&b, namespace, dims, at, Metric{Name: metric, Unit: unit, Value: v})
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		if errs := specErrors(b.Bytes()); len(errs) > 0 {
			t.Fatalf("%s\n%s", strings.Join(errs, "\n"), b.Bytes())
		}
	})
}
