package codec

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/schema"
)

// SpecFromJSON reads a spec written as JSON with the item's attribute names (the
// CLI's --spec file, or the console's JSON view without type descriptors): objects
// are maps, arrays lists, strings strings, numbers numbers, booleans booleans; an
// open message's "binary" is base64. It validates exactly as DecodeSpec does.
func SpecFromJSON(b []byte) (schema.Spec, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var doc map[string]any
	if err := dec.Decode(&doc); err != nil {
		return schema.Spec{}, fmt.Errorf("%w spec: not a JSON object: %v", schema.ErrInvalid, err)
	}
	if dec.More() {
		return schema.Spec{}, fmt.Errorf("%w spec: data after the JSON object", schema.ErrInvalid)
	}
	known := map[string]bool{}
	for _, a := range specAttrs {
		known[a] = true
	}
	it := Item{}
	for k, v := range doc {
		if !known[k] {
			return schema.Spec{}, fmt.Errorf("%w spec: unknown field %q", schema.ErrInvalid, clipS(k))
		}
		av, err := fromJSON(v, k == schema.AttrOpenMessages)
		if err != nil {
			return schema.Spec{}, fmt.Errorf("%w %s: %v", schema.ErrInvalid, k, err)
		}
		it[k] = av
	}
	return DecodeSpec(it)
}

// SpecAttrs returns the spec's attribute names (what DecodeSpec reads).
func SpecAttrs() []string { return slices.Clone(specAttrs) }

// specAttrs are the spec's attribute names.
var specAttrs = []string{schema.AttrHeaders, schema.AttrSubprotocols, schema.AttrOpenMessages, schema.AttrKeepalive,
	schema.AttrMaxLifetime, schema.AttrShutdownMatch, schema.AttrResume, schema.AttrSeqPath, schema.AttrBadMessages,
	schema.AttrStart, schema.AttrIdleTimeout, schema.AttrIdleReconnect, schema.AttrSeqReset, schema.AttrMaxSeqJump,
	schema.AttrTokenRequest, schema.AttrSnapshot, schema.AttrDecode, schema.AttrSink}

func fromJSON(v any, openMessages bool) (types.AttributeValue, error) {
	switch x := v.(type) {
	case map[string]any:
		m := Item{}
		for k, e := range x {
			if s, ok := e.(string); ok && openMessages && k == schema.FieldBinary {
				b, err := base64.StdEncoding.DecodeString(s)
				if err != nil {
					return nil, fmt.Errorf("%s: not base64", schema.FieldBinary)
				}
				m[k] = &types.AttributeValueMemberB{Value: b}
				continue
			}
			av, err := fromJSON(e, false)
			if err != nil {
				return nil, err
			}
			m[k] = av
		}
		return &types.AttributeValueMemberM{Value: m}, nil
	case []any:
		l := make([]types.AttributeValue, len(x))
		for i, e := range x {
			av, err := fromJSON(e, openMessages)
			if err != nil {
				return nil, err
			}
			l[i] = av
		}
		return &types.AttributeValueMemberL{Value: l}, nil
	case string:
		return S(x), nil
	case json.Number:
		return &types.AttributeValueMemberN{Value: x.String()}, nil
	case bool:
		return &types.AttributeValueMemberBOOL{Value: x}, nil
	case nil:
		return &types.AttributeValueMemberNULL{Value: true}, nil
	}
	return nil, fmt.Errorf("unsupported JSON value %T", v)
}
