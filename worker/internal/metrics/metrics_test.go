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

// The idle and quota gauges go out on one EMF line, both declared as metrics.
func TestEMFGauges(t *testing.T) {
	var buf bytes.Buffer
	var c Counters
	c.IdleNow.Store(2)
	c.QuotaWaiting.Store(5)
	e := &EMF{W: &buf, Service: "svc"}
	e.PutGauges(&c)
	if n := bytes.Count(buf.Bytes(), []byte("\n")); n != 1 {
		t.Fatalf("%d lines, want 1: %s", n, buf.Bytes())
	}
	var line map[string]any
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatal(err)
	}
	cw := line["_aws"].(map[string]any)["CloudWatchMetrics"].([]any)[0].(map[string]any)
	var declared []string
	for _, m := range cw["Metrics"].([]any) {
		declared = append(declared, m.(map[string]any)["Name"].(string))
	}
	if line["IdleConnections"] != 2.0 || line["QuotaWaiting"] != 5.0 || line["ServiceName"] != "svc" ||
		strings.Join(declared, ",") != "IdleConnections,QuotaWaiting" {
		t.Fatalf("line %s", buf.Bytes())
	}
}

// The worker's EMF line, byte for byte: a dimension set of ServiceName when the
// service is named, none otherwise, every value a Count.
func TestEMFGolden(t *testing.T) {
	at := func() time.Time { return time.UnixMilli(1_764_680_000_000) }
	for _, c := range []struct {
		service, want string
	}{
		{"svc", `{"IdleConnections":2,"QuotaWaiting":5,"ServiceName":"svc","_aws":{"CloudWatchMetrics":[{"Dimensions":[["ServiceName"]],` +
			`"Metrics":[{"Name":"IdleConnections","Unit":"Count"},{"Name":"QuotaWaiting","Unit":"Count"}],"Namespace":"Sockfleet"}],` +
			`"Timestamp":1764680000000}}` + "\n"},
		{"", `{"IdleConnections":2,"QuotaWaiting":5,"_aws":{"CloudWatchMetrics":[{"Dimensions":[[]],` +
			`"Metrics":[{"Name":"IdleConnections","Unit":"Count"},{"Name":"QuotaWaiting","Unit":"Count"}],"Namespace":"Sockfleet"}],` +
			`"Timestamp":1764680000000}}` + "\n"},
	} {
		var buf bytes.Buffer
		e := &EMF{W: &buf, Service: c.service, Now: at}
		e.PutAll(Value{"IdleConnections", 2}, Value{"QuotaWaiting", 5})
		if buf.String() != c.want {
			t.Errorf("service %q:\ngot  %s\nwant %s", c.service, buf.String(), c.want)
		}
	}
}
