package codec

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/schema"
)

func goodItem() Item {
	return EncodeConnection(Connection{ID: "c1", DesiredState: schema.Started, WSURL: "wss://up.example/streams/c1",
		LeaseOwner: "w1", LeaseExpiresAtMs: 1000, LeaseVersion: 3, LastSeq: 42, Status: "streaming"})
}

func TestConnectionRoundTrip(t *testing.T) {
	want := Connection{ID: "c1", DesiredState: schema.Started, WSURL: "wss://up.example/streams/c1",
		LeaseOwner: "w1", LeaseExpiresAtMs: 1000, LeaseVersion: 3, LastSeq: 42, Status: "streaming",
		StatusError: "x", StatusAtMs: 7, NudgedAtMs: 9, MovedAtMs: 11}
	got, err := DecodeConnection(EncodeConnection(want))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, want)
	}
}

func TestDecodeConnectionRejectsBadItems(t *testing.T) {
	with := func(f func(Item)) Item { it := goodItem(); f(it); return it }
	cases := []struct {
		name string
		item Item
		want string // in the error
	}{
		{"nil item", nil, "Pk: missing"},
		{"empty item", Item{}, "Pk: missing"},
		{"pk wrong type", with(func(it Item) { it[schema.AttrPK] = N(1) }), "Pk: type N, want S"},
		{"worker key", with(func(it Item) { it[schema.AttrPK] = S("WORKER#w") }), "not a connection key"},
		{"bare prefix", with(func(it Item) { it[schema.AttrPK] = S("CONN#") }), "not a connection key"},
		{"double prefix", with(func(it Item) { it[schema.AttrPK] = S("CONN#CONN#x") }), "'#'"},
		{"state missing", with(func(it Item) { delete(it, schema.AttrDesiredState) }), "desired_state: missing"},
		{"state lower case", with(func(it Item) { it[schema.AttrDesiredState] = S("started") }), `desired_state "started"`},
		{"state unknown", with(func(it Item) { it[schema.AttrDesiredState] = S("PAUSED") }), "want STARTED or STOPPED"},
		{"state wrong type", with(func(it Item) { it[schema.AttrDesiredState] = &types.AttributeValueMemberBOOL{Value: true} }), "type BOOL"},
		{"url missing", with(func(it Item) { delete(it, schema.AttrWSURL) }), "ws_url: missing"},
		{"url http", with(func(it Item) { it[schema.AttrWSURL] = S("http://x/y") }), "scheme must be ws or wss"},
		{"url no host", with(func(it Item) { it[schema.AttrWSURL] = S("ws:///path") }), "no host"},
		{"url unparsable", with(func(it Item) { it[schema.AttrWSURL] = S("ws://[::1") }), "ws_url"},
		{"url with a secret", with(func(it Item) { it[schema.AttrWSURL] = S("wss://h/x?token={{secret:feeds/token}}") }), "not substituted in the URL"},
		{"secret as host", with(func(it Item) { it[schema.AttrWSURL] = S("wss://{{secret:db}}.example/x") }), "not substituted in the URL"},
		{"url huge", with(func(it Item) { it[schema.AttrWSURL] = S("wss://h/" + strings.Repeat("a", 5000)) }), "limit 2048"},
		{"version not a number", with(func(it Item) { it[schema.AttrLeaseVersion] = &types.AttributeValueMemberN{Value: "1.5"} }), "not an integer"},
		{"version wrong type", with(func(it Item) { it[schema.AttrLeaseVersion] = S("3") }), "lease_version: type S, want N"},
		{"expiry overflow", with(func(it Item) { it[schema.AttrLeaseExpires] = &types.AttributeValueMemberN{Value: "1e400"} }), "not an integer"},
		{"owner wrong type", with(func(it Item) { it[schema.AttrLeaseOwner] = &types.AttributeValueMemberL{} }), "lease_owner: type L"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeConnection(tc.item)
			if err == nil {
				t.Fatal("no error")
			}
			if !errors.Is(err, schema.ErrInvalid) {
				t.Errorf("error %v does not wrap ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
			if len(err.Error()) > 400 {
				t.Errorf("error is %d bytes long; bad values must be clipped", len(err.Error()))
			}
		})
	}
}

func TestDecodeKeepsIDOfBadItem(t *testing.T) {
	it := goodItem()
	it[schema.AttrDesiredState] = S("nope")
	c, err := DecodeConnection(it)
	if err == nil || c.ID != "c1" || c.LeaseVersion != 3 {
		t.Fatalf("got %+v, %v; want id and lease fields kept with an error", c, err)
	}
}

func TestNullAndAbsentOptionalFields(t *testing.T) {
	it := Item{
		schema.AttrPK: S("CONN#a"), schema.AttrDesiredState: S("STOPPED"), schema.AttrWSURL: S("ws://h:1/x"),
		schema.AttrLeaseOwner: &types.AttributeValueMemberNULL{Value: true},
	}
	c, err := DecodeConnection(it)
	if err != nil {
		t.Fatal(err)
	}
	if c.Owned() || c.LeaseVersion != 0 || c.DesiredState != schema.Stopped {
		t.Fatalf("got %+v", c)
	}
}

func TestWorkerRoundTripAndErrors(t *testing.T) {
	w := Worker{ID: "w1", Addr: "10.0.0.1:8080", Capacity: 100, Load: 7, Draining: true, HeartbeatExpiresAtMs: 5, TTL: 9}
	got, err := DecodeWorker(EncodeWorker(w))
	if err != nil || got != w {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	bad := EncodeWorker(w)
	bad[schema.AttrDraining] = S("yes")
	if _, err := DecodeWorker(bad); err == nil || !strings.Contains(err.Error(), "draining: type S, want BOOL") {
		t.Errorf("draining as string: %v", err)
	}
	bad = EncodeWorker(w)
	delete(bad, schema.AttrAddr)
	if _, err := DecodeWorker(bad); err == nil || !strings.Contains(err.Error(), "addr: missing") {
		t.Errorf("no addr: %v", err)
	}
	if _, err := DecodeWorker(EncodeConnection(Connection{ID: "c"})); err == nil {
		t.Error("a connection item decoded as a worker")
	}
}

func TestLeaseTimeArithmetic(t *testing.T) {
	c := Connection{LeaseOwner: "w", LeaseExpiresAtMs: 10_000}
	for _, tc := range []struct {
		now, margin int64
		want        bool
	}{{10_000, 0, false}, {10_001, 0, true}, {14_999, 5_000, false}, {15_001, 5_000, true}} {
		if got := c.Expired(tc.now, tc.margin); got != tc.want {
			t.Errorf("Expired(%d, %d) = %v, want %v", tc.now, tc.margin, got, tc.want)
		}
	}
	if (Connection{LeaseOwner: "w"}).Expired(1e12, 0) {
		t.Error("a released lease (expiry 0) is not 'expired'; it is not owned")
	}
}

// FuzzDecodeConnection feeds arbitrary attribute values; decoding must never panic,
// and whatever it accepts must satisfy the schema's rules and survive a round trip.
func FuzzDecodeConnection(f *testing.F) {
	f.Add("CONN#c1", "STARTED", "wss://h/x", "w1", "1000", "3", "42", byte(0))
	f.Add("CONN#", "STOPPED", "ws://", "", "0", "x", "-1", byte(1))
	f.Add("WORKER#w", "PAUSED", "http://h", "w", "1e9", "9223372036854775808", "", byte(2))
	f.Fuzz(func(t *testing.T, pk, state, url, owner, exp, ver, seq string, kinds byte) {
		val := func(s string, bit byte) types.AttributeValue {
			if kinds&bit != 0 {
				return &types.AttributeValueMemberN{Value: s}
			}
			return &types.AttributeValueMemberS{Value: s}
		}
		it := Item{
			schema.AttrPK: val(pk, 1), schema.AttrDesiredState: val(state, 2), schema.AttrWSURL: val(url, 4),
			schema.AttrLeaseOwner: val(owner, 8), schema.AttrLeaseExpires: &types.AttributeValueMemberN{Value: exp},
			schema.AttrLeaseVersion: &types.AttributeValueMemberN{Value: ver}, schema.AttrLastSeq: val(seq, 16|32),
		}
		c, err := DecodeConnection(it)
		if err != nil {
			if !errors.Is(err, schema.ErrInvalid) {
				t.Fatalf("error does not wrap ErrInvalid: %v", err)
			}
			return
		}
		if c.DesiredState != schema.Started && c.DesiredState != schema.Stopped {
			t.Fatalf("accepted state %q", c.DesiredState)
		}
		if err := schema.ValidateURL(c.WSURL); err != nil {
			t.Fatalf("accepted url: %v", err)
		}
		back, err := DecodeConnection(EncodeConnection(c))
		if err != nil || !reflect.DeepEqual(back, c) {
			t.Fatalf("round trip: %+v / %+v, %v", c, back, err)
		}
	})
}
