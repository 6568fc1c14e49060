package demoupstream

import "testing"

func TestProducedAt(t *testing.T) {
	if ts, ok := ProducedAt(Message(7, 1_764_680_000_123, 3)); !ok || ts != 1_764_680_000_123 {
		t.Errorf("ProducedAt(Message) = %d, %v", ts, ok)
	}
	for _, f := range []string{`garbage`, `{"seq":1}`, `{"ts":"x"}`, `[1]`, `7`} {
		if ts, ok := ProducedAt([]byte(f)); ok {
			t.Errorf("ProducedAt(%s) = %d, want none", f, ts)
		}
	}
}
