package secrets

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	smtypes "github.com/aws/aws-sdk-go-v2/service/secretsmanager/types"
	"github.com/sockfleet/sockfleet/shared/schema"
)

// countingSource is a strict fake Source (pure logic: the cache's TTL, keys and
// allowances). Every secret in vals allows hosts, unless hosts names it.
type countingSource struct {
	vals  map[string]string
	hosts map[string][]string
	calls int
}

func (c *countingSource) Fetch(_ context.Context, name string) (Secret, error) {
	c.calls++
	v, ok := c.vals[name]
	if !ok {
		return Secret{}, ErrNotFound
	}
	hosts, ok := c.hosts[name]
	if !ok {
		hosts = []string{"feed.example.com"}
	}
	return Secret{Value: v, AllowedHosts: hosts}, nil
}

const dest = "feed.example.com:443"

func TestCacheTTLForgetAndKeys(t *testing.T) {
	now := time.Unix(1000, 0)
	src := &countingSource{vals: map[string]string{"tok": "v1", "json": `{"api_key":"k-1","n":7}`, "plain": "not json"}}
	c := &Cache{Source: src, TTL: time.Minute, Now: func() time.Time { return now }}
	ctx := context.Background()
	get := func(ref schema.SecretRef) string {
		t.Helper()
		v, err := c.Resolve(ctx, ref, dest)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if get(schema.SecretRef{Name: "tok"}) != "v1" || get(schema.SecretRef{Name: "tok"}) != "v1" || src.calls != 1 {
		t.Fatalf("cached value fetched %d times", src.calls)
	}
	src.vals["tok"] = "v2"
	now = now.Add(61 * time.Second)
	if get(schema.SecretRef{Name: "tok"}) != "v2" {
		t.Fatal("value kept past its TTL")
	}
	src.vals["tok"] = "v3"
	c.Forget("tok")
	if get(schema.SecretRef{Name: "tok"}) != "v3" {
		t.Fatal("Forget did not drop the value")
	}
	if get(schema.SecretRef{Name: "json", Key: "api_key"}) != "k-1" || get(schema.SecretRef{Name: "json", Key: "n"}) != "7" {
		t.Fatal("JSON keys")
	}
	for _, ref := range []schema.SecretRef{{Name: "json", Key: "missing"}, {Name: "plain", Key: "k"}, {Name: "absent"}} {
		_, err := c.Resolve(ctx, ref, dest)
		if err == nil {
			t.Fatalf("%+v resolved", ref)
		}
		if strings.Contains(err.Error(), "k-1") || strings.Contains(err.Error(), "not json") {
			t.Fatalf("error quotes a secret value: %v", err)
		}
	}
}

func TestHostsAllows(t *testing.T) {
	for _, c := range []struct {
		pats  []string
		dest  string
		allow bool
	}{
		{[]string{"stream.example.com"}, "stream.example.com:443", true},
		{[]string{"stream.example.com"}, "STREAM.Example.COM.:8443", true}, // any port, any case, root dot
		{[]string{"Stream.Example.com"}, "stream.example.com:80", true},
		{[]string{"stream.example.com"}, "evil.example.com:443", false},
		{[]string{"stream.example.com"}, "stream.example.com.evil.net:443", false},
		{[]string{"stream.example.com"}, "xstream.example.com:443", false},
		{[]string{"*.example.com"}, "a.example.com:443", true},
		{[]string{"*.example.com"}, "a.b.EXAMPLE.com:443", true},
		{[]string{"*.example.com"}, "example.com:443", false}, // the wildcard is below the domain only
		{[]string{"*.example.com"}, "evilexample.com:443", false},
		{[]string{"*.example.com"}, "example.com.evil.net:443", false},
		{[]string{"stream.example.com:8443"}, "stream.example.com:8443", true},
		{[]string{"stream.example.com:8443"}, "stream.example.com:443", false},
		{[]string{"*.example.com:443"}, "a.example.com:443", true},
		{[]string{"*.example.com:443"}, "a.example.com:444", false},
		{[]string{".example.com"}, "a.example.com:443", true}, // the tag-safe form of *.example.com
		{[]string{".example.com"}, "example.com:443", false},
		{[]string{".example.com:443"}, "a.example.com:444", false},
		{[]string{"127.0.0.1"}, "127.0.0.1:9000", true},
		{[]string{"127.0.0.1"}, "127.0.0.2:9000", false},
		{[]string{"[::1]:9000"}, "[::1]:9000", true},
		{[]string{"::1"}, "[::1]:1", true},
		{[]string{"[::1]:9000"}, "[::1]:9001", false},
		{[]string{"a.example", "b.example"}, "b.example:1", true},
		{nil, "stream.example.com:443", false},
		{[]string{"stream.example.com"}, "stream.example.com", false}, // not a dial target
		{[]string{"stream.example.com"}, ":443", false},
	} {
		h, err := ParseHosts(c.pats)
		if err != nil {
			t.Fatalf("%v: %v", c.pats, err)
		}
		if got := h.Allows(c.dest); got != c.allow {
			t.Errorf("%v allows %s = %v, want %v", c.pats, c.dest, got, c.allow)
		}
	}
	for _, bad := range []string{"*", "*.com", "a.*.example.com", "example.com:0", "example.com:99999", "example.com:",
		"example.com:x", "[::1", "[::1]x", "user@example.com", "example.com/path", "*.", ":443", ".", ".com"} {
		if _, err := ParseHosts([]string{bad}); err == nil {
			t.Errorf("pattern %q accepted", bad)
		}
	}
	if got := splitTag("a.example.com, *.b.example.com  c.example.com:8443,,"); !slices.Equal(got,
		[]string{"a.example.com", "*.b.example.com", "c.example.com:8443"}) {
		t.Errorf("tag split %q", got)
	}
}

// A secret goes only to a host its owner allowed; the refusal names the secret and
// the destination, wraps schema.ErrInvalid, and never holds the value.
func TestResolveAllowance(t *testing.T) {
	const value = "v-4471-top"
	src := &countingSource{
		vals:  map[string]string{"open": value, "wild": value, "none": value, "bad": value, "json": `{"k":"` + value + `"}`},
		hosts: map[string][]string{"wild": {"*.example.com"}, "none": nil, "bad": {"*"}, "json": {"feed.example.com"}},
	}
	c := &Cache{Source: src, TTL: time.Hour}
	ctx := context.Background()
	ok := func(name, key, dest string) {
		t.Helper()
		v, err := c.Resolve(ctx, schema.SecretRef{Name: name, Key: key}, dest)
		if err != nil || (key == "" && v != value) {
			t.Fatalf("%s to %s: %q, %v", name, dest, v, err)
		}
	}
	refused := func(name, key, dest, why string) {
		t.Helper()
		v, err := c.Resolve(ctx, schema.SecretRef{Name: name, Key: key}, dest)
		var na *NotAllowedError
		if err == nil || v != "" || !errors.As(err, &na) || !errors.Is(err, schema.ErrInvalid) {
			t.Fatalf("%s to %s: %q, %v: want a refusal", name, dest, v, err)
		}
		msg := err.Error()
		if !strings.Contains(msg, "secret "+name) || !strings.Contains(msg, dest) || !strings.Contains(msg, why) {
			t.Fatalf("refusal %q: want the secret, %s and %q", msg, dest, why)
		}
		if strings.Contains(msg, value) {
			t.Fatalf("refusal quotes the value: %q", msg)
		}
	}
	ok("open", "", "feed.example.com:443")
	refused("open", "", "attacker.test:443", "not among")
	ok("wild", "", "a.example.com:443")
	refused("wild", "", "example.com:443", "not among")
	refused("none", "", "feed.example.com:443", "names no allowed hosts")
	refused("bad", "", "feed.example.com:443", "malformed")
	ok("json", "k", "feed.example.com:443")
	refused("json", "k", "attacker.test:443", "not among")
	refused("json", "missing", "attacker.test:443", "not among") // the allowance first: no word on the keys
}

func TestFileSource(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "s.json")
	// The original format (plain strings) beside the object form with an allowance.
	if err := os.WriteFile(good, []byte(`{"feed/token":"t-123",
		"db": {"value": "d-789", "allowed_hosts": ["db.example.com", "*.feeds.example.com:8443"]},
		"closed": {"value": "c-1"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if v, err := (File{Path: good}).Fetch(ctx, "feed/token"); err != nil || v.Value != "t-123" || len(v.AllowedHosts) != 0 {
		t.Fatalf("Fetch = %+v, %v", v, err)
	}
	if v, err := (File{Path: good}).Fetch(ctx, "db"); err != nil || v.Value != "d-789" ||
		!slices.Equal(v.AllowedHosts, []string{"db.example.com", "*.feeds.example.com:8443"}) {
		t.Fatalf("Fetch = %+v, %v", v, err)
	}
	if _, err := (File{Path: good}).Fetch(ctx, "other"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing name: %v", err)
	}
	// Through the cache: a plain string is read but allowed nowhere; the object form
	// goes where it says.
	c := &Cache{Source: File{Path: good}}
	for name, dest := range map[string]string{"feed/token": "db.example.com:443", "closed": "db.example.com:443", "db": "x.feeds.example.com:443"} {
		if _, err := c.Resolve(ctx, schema.SecretRef{Name: name}, dest); !errors.Is(err, schema.ErrInvalid) {
			t.Errorf("%s to %s: %v, want a refusal", name, dest, err)
		}
	}
	if v, err := c.Resolve(ctx, schema.SecretRef{Name: "db"}, "x.feeds.example.com:8443"); err != nil || v != "d-789" {
		t.Fatalf("db: %q, %v", v, err)
	}

	for name, body := range map[string]string{
		"bad value":      `{"a":"t-456", "b": 3}`,
		"misspelt field": `{"a": {"value": "t-456", "allowed_host": ["x.example"]}}`,
		"no value":       `{"a": {"allowed_hosts": ["t-456.example"]}}`,
		"value not text": `{"a": {"value": ["t-456"]}}`,
		"not an object":  `["t-456"]`,
	} {
		bad := filepath.Join(dir, "bad.json")
		if err := os.WriteFile(bad, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		fetched := "b"
		if name != "bad value" {
			fetched = "a"
		}
		_, err := (File{Path: bad}).Fetch(ctx, fetched)
		if err == nil || strings.Contains(err.Error(), "t-456") {
			t.Fatalf("%s: %v", name, err)
		}
	}
	if _, err := (File{Path: filepath.Join(dir, "none")}).Fetch(ctx, "a"); err == nil {
		t.Fatal("absent file accepted")
	}
}

// fakeSM is a strict fake of the two Secrets Manager calls (the consumer-declared
// interface): it checks the id asked for, fails on anything else, and counts value
// reads.
type fakeSM struct {
	t     *testing.T
	want  string
	tags  []smtypes.Tag
	out   *secretsmanager.GetSecretValueOutput
	reads *int
}

func (f fakeSM) DescribeSecret(_ context.Context, in *secretsmanager.DescribeSecretInput,
	_ ...func(*secretsmanager.Options)) (*secretsmanager.DescribeSecretOutput, error) {
	if in.SecretId == nil || *in.SecretId != f.want {
		f.t.Fatalf("described %v, want %s", in.SecretId, f.want)
	}
	if f.out == nil {
		return nil, errors.New("ResourceNotFoundException")
	}
	return &secretsmanager.DescribeSecretOutput{Name: &f.want, Tags: f.tags}, nil
}

func (f fakeSM) GetSecretValue(_ context.Context, in *secretsmanager.GetSecretValueInput,
	_ ...func(*secretsmanager.Options)) (*secretsmanager.GetSecretValueOutput, error) {
	if in.SecretId == nil || *in.SecretId != f.want {
		f.t.Fatalf("asked for %v, want %s", in.SecretId, f.want)
	}
	*f.reads++
	return f.out, nil
}

func tag(k, v string) smtypes.Tag { return smtypes.Tag{Key: &k, Value: &v} }

func TestManagerSource(t *testing.T) {
	v := "sm-value"
	reads := 0
	arn := "arn:aws:secretsmanager:r:1:secret:x"
	m := Manager{Client: fakeSM{t: t, want: arn, reads: &reads, out: &secretsmanager.GetSecretValueOutput{SecretString: &v},
		tags: []smtypes.Tag{tag("team", "feeds"), tag(TagAllowedHosts, "stream.example.com, *.example.net:8443")}}}
	got, err := m.Fetch(context.Background(), arn)
	if err != nil || got.Value != v || !slices.Equal(got.AllowedHosts, []string{"stream.example.com", "*.example.net:8443"}) || reads != 1 {
		t.Fatalf("Fetch = %+v, %v (%d reads)", got, err, reads)
	}
	// Untagged: allowed nowhere, and the value is not even read.
	untagged := Manager{Client: fakeSM{t: t, want: "u", reads: &reads, out: &secretsmanager.GetSecretValueOutput{SecretString: &v},
		tags: []smtypes.Tag{tag("team", "feeds")}}}
	if got, err := untagged.Fetch(context.Background(), "u"); err != nil || got.Value != "" || len(got.AllowedHosts) != 0 || reads != 1 {
		t.Fatalf("untagged Fetch = %+v, %v (%d reads)", got, err, reads)
	}
	bin := Manager{Client: fakeSM{t: t, want: "b", reads: &reads, out: &secretsmanager.GetSecretValueOutput{SecretBinary: []byte{1}},
		tags: []smtypes.Tag{tag(TagAllowedHosts, "x.example")}}}
	if _, err := bin.Fetch(context.Background(), "b"); err == nil || !strings.Contains(err.Error(), "binary") {
		t.Fatalf("binary secret: %v", err)
	}
	none := Manager{Client: fakeSM{t: t, want: "n", reads: &reads}}
	if _, err := none.Fetch(context.Background(), "n"); err == nil || !strings.Contains(err.Error(), "secret n") {
		t.Fatalf("missing secret: %v", err)
	}
}
