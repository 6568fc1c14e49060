package metrics

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestEMFLine(t *testing.T) {
	var buf bytes.Buffer
	e := &EMF{W: &buf, Service: "svc", Now: func() time.Time { return time.UnixMilli(1234) }}
	e.Put("OwnedConnections", 7)
	var line map[string]any
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatal(err)
	}
	aws := line["_aws"].(map[string]any)
	cw := aws["CloudWatchMetrics"].([]any)[0].(map[string]any)
	if line["OwnedConnections"] != 7.0 || line["ServiceName"] != "svc" || aws["Timestamp"] != 1234.0 ||
		cw["Namespace"] != "Sockfleet" || cw["Dimensions"].([]any)[0].([]any)[0] != "ServiceName" {
		t.Fatalf("line %s", buf.Bytes())
	}
	var nilEMF *EMF
	nilEMF.Put("x", 1) // no writer configured: a no-op
}

func TestWriteText(t *testing.T) {
	var c Counters
	c.Owned.Store(3)
	c.SelfFences.Add(1)
	var buf bytes.Buffer
	if err := c.WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"sockfleet_owned_connections 3\n", "sockfleet_self_fences_total 1\n", "sockfleet_messages_total 0\n"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("missing %q in\n%s", want, buf.String())
		}
	}
}
