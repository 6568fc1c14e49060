package codec

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Every item written in DynamoDB JSON in docs/CONNECTIONS.md (a json block with a
// "Pk") decodes with the worker's decoder and is runnable: the docs show nothing
// the console would accept and the worker refuse.
func TestDocExamplesDecode(t *testing.T) {
	b, err := os.ReadFile("../../../docs/CONNECTIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, block := range strings.Split(string(b), "```json\n")[1:] {
		block, _, _ = strings.Cut(block, "```")
		if !strings.Contains(block, `"Pk"`) {
			continue
		}
		n++
		var doc map[string]any
		if err := json.Unmarshal([]byte(block), &doc); err != nil {
			t.Fatalf("example %d is not JSON: %v", n, err)
		}
		it := Item{}
		for k, v := range doc {
			av, err := ddbJSON(v)
			if err != nil {
				t.Fatalf("example %d: %s: %v", n, k, err)
			}
			it[k] = av
		}
		c, err := DecodeConnection(it)
		if err != nil || c.Unrunnable() != nil {
			t.Fatalf("example %d (%s): %v %v", n, c.ID, err, c.Unrunnable())
		}
	}
	if n < 4 {
		t.Fatalf("%d examples found, want the full item and the three REST patterns", n)
	}
}

// ddbJSON converts one value of DynamoDB JSON ({"S": "x"}, {"M": {…}}, …).
func ddbJSON(v any) (types.AttributeValue, error) {
	m, ok := v.(map[string]any)
	if !ok || len(m) != 1 {
		return nil, fmt.Errorf("want one type key, got %v", v)
	}
	for k, x := range m {
		switch k {
		case "S":
			return &types.AttributeValueMemberS{Value: x.(string)}, nil
		case "N":
			return &types.AttributeValueMemberN{Value: x.(string)}, nil
		case "BOOL":
			return &types.AttributeValueMemberBOOL{Value: x.(bool)}, nil
		case "B":
			b, err := base64.StdEncoding.DecodeString(x.(string))
			return &types.AttributeValueMemberB{Value: b}, err
		case "M":
			out := Item{}
			for mk, mv := range x.(map[string]any) {
				av, err := ddbJSON(mv)
				if err != nil {
					return nil, err
				}
				out[mk] = av
			}
			return &types.AttributeValueMemberM{Value: out}, nil
		case "L":
			var out []types.AttributeValue
			for _, e := range x.([]any) {
				av, err := ddbJSON(e)
				if err != nil {
					return nil, err
				}
				out = append(out, av)
			}
			return &types.AttributeValueMemberL{Value: out}, nil
		}
		return nil, fmt.Errorf("type %s not handled", k)
	}
	panic("unreachable")
}
