package schema

import (
	"errors"
	"strings"
	"testing"
)

// A ws_url may take {{token:PATH}} anywhere, the whole endpoint included; a
// malformed reference is refused.
func TestValidateURLWithTokens(t *testing.T) {
	for _, u := range []string{
		"{{token:data.instanceServers.0.endpoint}}?token={{token:data.token}}&connectId={conn}",
		"wss://stream.example.com/ws/{{token:listenKey}}",
		"wss://{{token:host}}/x",
	} {
		if err := ValidateURL(u); err != nil {
			t.Errorf("%s: %v", u, err)
		}
	}
	for u, want := range map[string]string{
		"wss://h/x?t={{token:}}":     "malformed {{token:PATH}}",
		"wss://h/x?t={{token:a..b}}": "empty field",
		"{{token:e}}x y":             "",
	} {
		err := ValidateURL(u)
		if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", u, err, want)
		}
	}
}

func TestReplaceTokensIsOnePass(t *testing.T) {
	got, err := ReplaceTokens("a={{token:x}} b={{token:y}}", func(p string) (string, error) {
		return "{{token:" + p + "}}", nil // a value that looks like a reference stays as it is
	})
	if err != nil || got != "a={{token:x}} b={{token:y}}" {
		t.Fatalf("%q %v", got, err)
	}
}

func TestCheckRequestURL(t *testing.T) {
	for _, u := range []string{"https://api.example.com/x?k={{secret:k}}", "http://127.0.0.1:8080/listenKey?listenKey={{token:listenKey}}"} {
		if err := CheckRequestURL(u); err != nil {
			t.Errorf("%s: %v", u, err)
		}
	}
	for _, u := range []string{"", "api.example.com/x", "https://{conn}.example.com/", "https://user:pw@h/", "https:///x", "wss://h/x"} {
		if err := CheckRequestURL(u); err == nil {
			t.Errorf("%q accepted", u)
		}
	}
}
