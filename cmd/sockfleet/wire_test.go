package main

import (
	"strings"
	"testing"

	"github.com/sockfleet/sockfleet/shared/schema"
)

func TestAddArgsDecodeAndSink(t *testing.T) {
	_, _, _, sp, err := addArgs([]string{"okx", "wss://h/ws", "--decode", "gzip", "--sink", "okx-trades"})
	if err != nil || sp.Decode != schema.DecodeGzip || sp.Sink != "okx-trades" {
		t.Fatalf("%+v, %v", sp, err)
	}
	if d := describeSpec(sp); !strings.Contains(d, "decode gzip") || !strings.Contains(d, "sink okx-trades") {
		t.Fatalf("describe: %q", d)
	}
	if _, _, _, _, err := addArgs([]string{"okx", "wss://h/ws", "--decode"}); err == nil || !strings.Contains(err.Error(), "--decode needs a value") {
		t.Fatalf("missing value: %v", err)
	}
}
