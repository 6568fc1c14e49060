package main

import (
	"math"
	"slices"
	"time"
)

// Percentile returns the p-th percentile (0 < p <= 100) of xs by the nearest-rank
// method: the smallest sample with at least p % of the samples at or below it. With
// 10 samples p99 is the largest. NaN for no samples.
func Percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	return s[min(max(rank, 1), len(s))-1]
}

// PerHour extrapolates a count taken over window to one hour.
func PerHour(count float64, window time.Duration) float64 {
	if window <= 0 {
		return math.NaN()
	}
	return count * float64(time.Hour) / float64(window)
}

// PerConnHour extrapolates a count taken over window, for conns connections, to one
// connection-hour.
func PerConnHour(count float64, conns int, window time.Duration) float64 {
	if conns <= 0 {
		return math.NaN()
	}
	return PerHour(count, window) / float64(conns)
}

// Ratio is a/b, NaN when b is 0 (and a is not).
func Ratio(a, b float64) float64 {
	if b == 0 {
		if a == 0 {
			return 1
		}
		return math.NaN()
	}
	return a / b
}

// ms converts durations to milliseconds.
func ms(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = float64(d) / float64(time.Millisecond)
	}
	return out
}
