package stream

import "testing"

func TestResumeApplyKeepsOtherQueryBytes(t *testing.T) {
	r := Resume{Kind: "query", Name: "from", Template: "{seq}"}
	cases := map[string]string{
		"wss://h/p?sig=a%2Fb+c&from=3&z=%7E": "wss://h/p?sig=a%2Fb+c&from=42&z=%7E",
		"wss://h/p?b=2&a=1":                  "wss://h/p?b=2&a=1&from=42",
		"wss://h/p":                          "wss://h/p?from=42",
		"wss://h/p?from=1&x=%41&from=2#frag": "wss://h/p?from=42&x=%41#frag",
	}
	for in, want := range cases {
		got, _, err := r.Apply(in, 42)
		if err != nil || got != want {
			t.Errorf("Apply(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}
