package emf

import (
	"bytes"
	"testing"
	"time"
)

func TestWriteGolden(t *testing.T) {
	var b bytes.Buffer
	err := Write(&b, "Sockfleet", time.UnixMilli(1_764_680_000_000),
		Metric{Name: "OrphanedConnections", Unit: Count, Value: 3},
		Metric{Name: "OrphanedOldestSeconds", Unit: Seconds, Value: 12.5})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"OrphanedConnections":3,"OrphanedOldestSeconds":12.5,"_aws":{"CloudWatchMetrics":[{"Dimensions":[[]],` +
		`"Metrics":[{"Name":"OrphanedConnections","Unit":"Count"},{"Name":"OrphanedOldestSeconds","Unit":"Seconds"}],` +
		`"Namespace":"Sockfleet"}],"Timestamp":1764680000000}}` + "\n"
	if b.String() != want {
		t.Errorf("got  %s\nwant %s", b.String(), want)
	}
}

func TestWriteDimsGolden(t *testing.T) {
	var b bytes.Buffer
	err := WriteDims(&b, "Sockfleet", []Dimension{{Name: "ServiceName", Value: "svc"}}, time.UnixMilli(1_764_680_000_000),
		Metric{Name: "IdleConnections", Unit: Count, Value: 2})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"IdleConnections":2,"ServiceName":"svc","_aws":{"CloudWatchMetrics":[{"Dimensions":[["ServiceName"]],` +
		`"Metrics":[{"Name":"IdleConnections","Unit":"Count"}],"Namespace":"Sockfleet"}],"Timestamp":1764680000000}}` + "\n"
	if b.String() != want {
		t.Errorf("got  %s\nwant %s", b.String(), want)
	}
}
