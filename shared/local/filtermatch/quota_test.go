package filtermatch

import (
	"fmt"
	"testing"

	"github.com/sockfleet/sockfleet/shared/filters"
)

// Every write to a connect-quota item (one per dial) is dropped by the production
// patterns, while the same events on a connection or worker key still pass.
func TestQuotaWritesNeverPass(t *testing.T) {
	s := MustCompile(filters.Patterns)
	img := `{"Pk": {"S": "%[1]s"}, "window_ms": {"N": "1764680000000"}, "dials": {"N": "3"}, "blocked_until_ms": {"N": "0"}, "ttl": {"N": "1764687500"}}`
	events := map[string]string{
		"INSERT": `{"eventName": "INSERT", "dynamodb": {"Keys": {"Pk": {"S": "%[1]s"}}, "NewImage": ` + img + `}}`,
		"MODIFY": `{"eventName": "MODIFY", "dynamodb": {"Keys": {"Pk": {"S": "%[1]s"}}, "OldImage": ` + img + `, "NewImage": ` + img + `}}`,
		"REMOVE": `{"eventName": "REMOVE", "dynamodb": {"Keys": {"Pk": {"S": "%[1]s"}}, "OldImage": ` + img + `}}`,
	}
	for name, tmpl := range events {
		for _, tc := range []struct {
			key  string
			want bool
		}{{"QUOTA#stream.binance.com", false}, {"CONN#c1", name != "MODIFY"}, {"WORKER#w1", true}} {
			ok, err := s.MatchJSON([]byte(fmt.Sprintf(tmpl, tc.key)))
			if err != nil {
				t.Fatal(err)
			}
			if ok != tc.want {
				t.Errorf("%s of %s passes: %v, want %v", name, tc.key, ok, tc.want)
			}
		}
	}
}
