package codec

import (
	"fmt"
	"maps"
	"slices"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/schema"
)

// decodeRequests reads token_request and snapshot into s.
func decodeRequests(it Item, s *schema.Spec) error {
	if v, ok := present(it, schema.AttrTokenRequest); ok {
		m, err := fields(schema.AttrTokenRequest, v)
		if err != nil {
			return err
		}
		t := &schema.TokenRequest{}
		if t.Request, err = decodeRequest(m); err != nil {
			return err
		}
		t.Expires = m.str(schema.FieldExpires)
		if rv, ok := present(m.it, schema.FieldRefresh); ok {
			name := schema.AttrTokenRequest + "." + schema.FieldRefresh
			rm, err := fields(name, rv)
			if err != nil {
				return err
			}
			r := &schema.Refresh{}
			if r.Request, err = decodeRequest(rm); err != nil {
				return err
			}
			r.Interval = rm.dur(schema.FieldInterval)
			if rm.err != nil {
				return rm.err
			}
			t.Refresh = r
		}
		if m.err != nil {
			return m.err
		}
		s.TokenRequest = t
	}
	if v, ok := present(it, schema.AttrSnapshot); ok {
		m, err := fields(schema.AttrSnapshot, v)
		if err != nil {
			return err
		}
		sn := &schema.Snapshot{}
		if sn.Request, err = decodeRequest(m); err != nil {
			return err
		}
		sn.SeqPath = m.str(schema.FieldSeqPath)
		sn.OnGap = m.str(schema.FieldOnGap)
		if m.err != nil {
			return m.err
		}
		s.Snapshot = sn
	}
	return nil
}

// decodeRequest reads a request's method, url, headers, body and timeout from m.
// A header's value is never quoted in an error: it may hold a credential.
func decodeRequest(m *subDecoder) (schema.Request, error) {
	r := schema.Request{
		Method: m.str(schema.FieldMethod), URL: m.str(schema.FieldURL), Body: m.str(schema.FieldBody),
		Timeout: m.dur(schema.FieldTimeout),
	}
	if v, ok := present(m.it, schema.FieldHeaders); ok {
		name := m.name + "." + schema.FieldHeaders
		hm, isMap := v.(*types.AttributeValueMemberM)
		if !isMap {
			return r, secretTypeErr(name, "M", v)
		}
		if len(hm.Value) > schema.MaxHeaders {
			return r, fmt.Errorf("%w %s: %d headers, limit %d", schema.ErrInvalid, name, len(hm.Value), schema.MaxHeaders)
		}
		for _, k := range slices.Sorted(maps.Keys(hm.Value)) {
			if r.Headers == nil {
				r.Headers = make(map[string]string, len(hm.Value))
			}
			sv, isS := hm.Value[k].(*types.AttributeValueMemberS)
			if !isS {
				return r, secretTypeErr(name+"."+k, "S", hm.Value[k])
			}
			r.Headers[k] = sv.Value
		}
	}
	return r, m.err
}

// encodeRequests adds token_request and snapshot to it.
func encodeRequests(it Item, s schema.Spec) {
	if t := s.TokenRequest; t != nil {
		m := encodeRequest(t.Request)
		putS(m, schema.FieldExpires, t.Expires)
		if r := t.Refresh; r != nil {
			rm := encodeRequest(r.Request)
			putD(rm, schema.FieldInterval, r.Interval)
			m[schema.FieldRefresh] = &types.AttributeValueMemberM{Value: rm}
		}
		it[schema.AttrTokenRequest] = &types.AttributeValueMemberM{Value: m}
	}
	if sn := s.Snapshot; sn != nil {
		m := encodeRequest(sn.Request)
		putS(m, schema.FieldSeqPath, sn.SeqPath)
		putS(m, schema.FieldOnGap, sn.OnGap)
		it[schema.AttrSnapshot] = &types.AttributeValueMemberM{Value: m}
	}
}

func encodeRequest(r schema.Request) Item {
	m := Item{}
	putS(m, schema.FieldMethod, r.Method)
	putS(m, schema.FieldURL, r.URL)
	putS(m, schema.FieldBody, r.Body)
	putD(m, schema.FieldTimeout, r.Timeout)
	if len(r.Headers) > 0 {
		h := make(Item, len(r.Headers))
		for k, v := range r.Headers {
			h[k] = S(v)
		}
		m[schema.FieldHeaders] = &types.AttributeValueMemberM{Value: h}
	}
	return m
}
