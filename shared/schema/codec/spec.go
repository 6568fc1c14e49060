package codec

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/schema"
)

// DecodeSpec reads the per-connection spec attributes of it and validates them. The
// error wraps schema.ErrInvalid and names the attribute.
func DecodeSpec(it Item) (schema.Spec, error) {
	var s schema.Spec
	d := decoder{it: it}
	if v, ok := present(it, schema.AttrHeaders); ok {
		m, isMap := v.(*types.AttributeValueMemberM)
		if !isMap {
			return s, secretTypeErr(schema.AttrHeaders, "M", v)
		}
		if len(m.Value) > schema.MaxHeaders {
			return s, fmt.Errorf("%w %s: %d headers, limit %d", schema.ErrInvalid, schema.AttrHeaders, len(m.Value), schema.MaxHeaders)
		}
		for _, k := range slices.Sorted(maps.Keys(m.Value)) {
			sv, isS := m.Value[k].(*types.AttributeValueMemberS)
			if !isS {
				return s, secretTypeErr(schema.AttrHeaders+"."+k, "S", m.Value[k])
			}
			if s.Headers == nil {
				s.Headers = make(map[string]string, len(m.Value))
			}
			s.Headers[k] = sv.Value
		}
	}
	if v, ok := present(it, schema.AttrSubprotocols); ok {
		switch l := v.(type) {
		case *types.AttributeValueMemberSS:
			s.Subprotocols = append(s.Subprotocols, l.Value...)
		case *types.AttributeValueMemberL:
			for i, e := range l.Value {
				sv, isS := e.(*types.AttributeValueMemberS)
				if !isS {
					return s, typeErr(fmt.Sprintf("%s[%d]", schema.AttrSubprotocols, i), "S", e)
				}
				s.Subprotocols = append(s.Subprotocols, sv.Value)
			}
		default:
			return s, typeErr(schema.AttrSubprotocols, "L or SS", v)
		}
	}
	if v, ok := present(it, schema.AttrOpenMessages); ok {
		l, isL := v.(*types.AttributeValueMemberL)
		if !isL {
			return s, typeErr(schema.AttrOpenMessages, "L", v)
		}
		if len(l.Value) > schema.MaxOpenMessages {
			return s, fmt.Errorf("%w %s: %d frames, limit %d", schema.ErrInvalid, schema.AttrOpenMessages, len(l.Value), schema.MaxOpenMessages)
		}
		for i, e := range l.Value {
			name := fmt.Sprintf("%s[%d]", schema.AttrOpenMessages, i)
			m, err := fields(name, e)
			if err != nil {
				return s, err
			}
			var om schema.OpenMessage
			om.Text = m.str(schema.FieldText)
			if b, ok := present(m.it, schema.FieldBinary); ok {
				bv, isB := b.(*types.AttributeValueMemberB)
				if !isB {
					return s, typeErr(name+"."+schema.FieldBinary, "B", b)
				}
				om.Binary, om.IsBinary = bv.Value, true
			}
			om.Expect = m.str(schema.FieldExpect)
			om.ExpectField = m.str(schema.FieldExpectField)
			om.Timeout = m.dur(schema.FieldTimeout)
			if m.err != nil {
				return s, m.err
			}
			s.OpenMessages = append(s.OpenMessages, om)
		}
	}
	if v, ok := present(it, schema.AttrKeepalive); ok {
		m, err := fields(schema.AttrKeepalive, v)
		if err != nil {
			return s, err
		}
		k := &schema.Keepalive{
			Message: m.str(schema.FieldMessage), Interval: m.dur(schema.FieldInterval),
			Pong: m.str(schema.FieldPong), PongTimeout: m.dur(schema.FieldPongTimeout),
		}
		if m.err != nil {
			return s, m.err
		}
		s.Keepalive = k
	}
	s.MaxLifetime = d.dur(schema.AttrMaxLifetime)
	s.ShutdownMatch = d.str(schema.AttrShutdownMatch)
	s.Resume = d.str(schema.AttrResume)
	s.SeqPath = d.str(schema.AttrSeqPath)
	s.BadMessages = d.str(schema.AttrBadMessages)
	s.Start = d.str(schema.AttrStart)
	s.IdleTimeout = d.dur(schema.AttrIdleTimeout)
	if v, ok := present(it, schema.AttrIdleReconnect); ok {
		b, isBool := v.(*types.AttributeValueMemberBOOL)
		if !isBool {
			d.keep(typeErr(schema.AttrIdleReconnect, "BOOL", v))
		} else {
			s.IdleReconnect = b.Value
		}
	}
	s.SeqReset = d.str(schema.AttrSeqReset)
	s.MaxSeqJump = d.num(schema.AttrMaxSeqJump)
	if err := decodeRequests(it, &s); err != nil {
		return s, err
	}
	s.Decode = d.str(schema.AttrDecode)
	s.Sink = d.str(schema.AttrSink)
	if d.err != nil {
		return s, d.err
	}
	return s, s.Validate()
}

// EncodeSpec adds s's attributes to it (nothing for a zero field).
func EncodeSpec(it Item, s schema.Spec) {
	if len(s.Headers) > 0 {
		m := make(Item, len(s.Headers))
		for k, v := range s.Headers {
			m[k] = S(v)
		}
		it[schema.AttrHeaders] = &types.AttributeValueMemberM{Value: m}
	}
	if len(s.Subprotocols) > 0 {
		l := make([]types.AttributeValue, len(s.Subprotocols))
		for i, p := range s.Subprotocols {
			l[i] = S(p)
		}
		it[schema.AttrSubprotocols] = &types.AttributeValueMemberL{Value: l}
	}
	if len(s.OpenMessages) > 0 {
		l := make([]types.AttributeValue, len(s.OpenMessages))
		for i, om := range s.OpenMessages {
			m := Item{}
			if om.IsBinary {
				m[schema.FieldBinary] = &types.AttributeValueMemberB{Value: om.Binary}
			}
			putS(m, schema.FieldText, om.Text)
			putS(m, schema.FieldExpect, om.Expect)
			putS(m, schema.FieldExpectField, om.ExpectField)
			putD(m, schema.FieldTimeout, om.Timeout)
			l[i] = &types.AttributeValueMemberM{Value: m}
		}
		it[schema.AttrOpenMessages] = &types.AttributeValueMemberL{Value: l}
	}
	if k := s.Keepalive; k != nil {
		m := Item{}
		putS(m, schema.FieldMessage, k.Message)
		putD(m, schema.FieldInterval, k.Interval)
		putS(m, schema.FieldPong, k.Pong)
		putD(m, schema.FieldPongTimeout, k.PongTimeout)
		it[schema.AttrKeepalive] = &types.AttributeValueMemberM{Value: m}
	}
	putD(it, schema.AttrMaxLifetime, s.MaxLifetime)
	putS(it, schema.AttrShutdownMatch, s.ShutdownMatch)
	putS(it, schema.AttrResume, s.Resume)
	putS(it, schema.AttrSeqPath, s.SeqPath)
	putS(it, schema.AttrBadMessages, s.BadMessages)
	putS(it, schema.AttrStart, s.Start)
	putD(it, schema.AttrIdleTimeout, s.IdleTimeout)
	if s.IdleReconnect {
		it[schema.AttrIdleReconnect] = &types.AttributeValueMemberBOOL{Value: true}
	}
	putS(it, schema.AttrSeqReset, s.SeqReset)
	putN(it, schema.AttrMaxSeqJump, s.MaxSeqJump)
	encodeRequests(it, s)
	putS(it, schema.AttrDecode, s.Decode)
	putS(it, schema.AttrSink, s.Sink)
}

// secretTypeErr is typeErr without the value: a header may hold a credential.
func secretTypeErr(name, want string, v types.AttributeValue) error {
	return fmt.Errorf("%w %s: type %s, want %s", schema.ErrInvalid, name, typeName(v), want)
}

func putD(it Item, name string, d time.Duration) {
	if d != 0 {
		it[name] = S(d.String())
	}
}

// present returns it[name] unless it is absent or NULL.
func present(it Item, name string) (types.AttributeValue, bool) {
	v, ok := it[name]
	if !ok || isNull(v) {
		return nil, false
	}
	return v, true
}

// fields returns a decoder over the map v, whose errors carry name as a prefix.
func fields(name string, v types.AttributeValue) (*subDecoder, error) {
	m, ok := v.(*types.AttributeValueMemberM)
	if !ok {
		return nil, typeErr(name, "M", v)
	}
	return &subDecoder{decoder: decoder{it: m.Value}, name: name}, nil
}

// subDecoder reads the fields of one map attribute.
type subDecoder struct {
	decoder
	name string
}

func (d *subDecoder) str(field string) string {
	s, err := str(d.it, field, false)
	d.keep(prefix(d.name, err))
	return s
}

func (d *subDecoder) dur(field string) time.Duration {
	v, err := dur(d.it, field)
	d.keep(prefix(d.name, err))
	return v
}

func prefix(name string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", name, err)
}

func (d *decoder) dur(name string) time.Duration {
	v, err := dur(d.it, name)
	d.keep(err)
	return v
}

// dur reads an optional Go duration string ("30s", "10m"); absent means 0.
func dur(it Item, name string) (time.Duration, error) {
	s, err := str(it, name, false)
	if err != nil || s == "" {
		return 0, err
	}
	v, err := time.ParseDuration(s)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("%w %s %q: want a non-negative duration such as 30s or 10m", schema.ErrInvalid, name, clipS(s))
	}
	return v, nil
}

func clipS(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
