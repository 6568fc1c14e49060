package schema

import (
	"strings"
	"testing"
)

// TestValidateURLRedacts checks that a rejected URL's credentials (query string,
// userinfo) never reach the error, which becomes the item's status and a log line.
func TestValidateURLRedacts(t *testing.T) {
	for name, raw := range map[string]string{
		"bad scheme":     "https://feed.example/p?token=s3cret",
		"no host":        "wss:///p?token=s3cret",
		"bad port":       "wss://feed.example:abc/p?token=s3cret",
		"control char":   "wss://feed.example/p?token=s3cret\x7f",
		"userinfo":       "https://user:s3cret@feed.example/p",
		"userinfo+query": "http://user:s3cret@feed.example/p?a=s3cret#s3cret",
	} {
		t.Run(name, func(t *testing.T) {
			err := ValidateURL(raw)
			if err == nil {
				t.Fatalf("ValidateURL(%q) = nil, want an error", raw)
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("ValidateURL error shows the credential: %v", err)
			}
		})
	}
}

func TestRedactURL(t *testing.T) {
	for raw, want := range map[string]string{
		"wss://feed.example/p?token=s3cret":       "wss://feed.example/p?REDACTED",
		"wss://u:s3cret@feed.example:8443/p":      "wss://REDACTED@feed.example:8443/p",
		"ws://feed.example/p#frag":                "ws://feed.example/p#REDACTED",
		"ws://feed.example/streams/a":             "ws://feed.example/streams/a",
		"u:s3cret@feed.example/p?x":               "REDACTED@feed.example/p?REDACTED",
		"wss://feed.example/a@b?token=s3cret":     "wss://feed.example/a@b?REDACTED",
		"wss://u@feed.example?token=s3cret@x#y@z": "wss://REDACTED@feed.example?REDACTED",
	} {
		if got := RedactURL(raw); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", raw, got, want)
		}
	}
}
