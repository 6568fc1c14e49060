package secrets

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/sockfleet/sockfleet/shared/schema"
)

// countingSource is a strict fake Source (pure logic: the cache's TTL and keys).
type countingSource struct {
	vals  map[string]string
	calls int
}

func (c *countingSource) Fetch(_ context.Context, name string) (string, error) {
	c.calls++
	v, ok := c.vals[name]
	if !ok {
		return "", ErrNotFound
	}
	return v, nil
}

func TestCacheTTLForgetAndKeys(t *testing.T) {
	now := time.Unix(1000, 0)
	src := &countingSource{vals: map[string]string{"tok": "v1", "json": `{"api_key":"k-1","n":7}`, "plain": "not json"}}
	c := &Cache{Source: src, TTL: time.Minute, Now: func() time.Time { return now }}
	ctx := context.Background()
	get := func(ref schema.SecretRef) string {
		t.Helper()
		v, err := c.Resolve(ctx, ref)
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
		_, err := c.Resolve(ctx, ref)
		if err == nil {
			t.Fatalf("%+v resolved", ref)
		}
		if strings.Contains(err.Error(), "k-1") || strings.Contains(err.Error(), "not json") {
			t.Fatalf("error quotes a secret value: %v", err)
		}
	}
}

func TestFileSource(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "s.json")
	if err := os.WriteFile(good, []byte(`{"feed/token":"t-123"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if v, err := (File{Path: good}).Fetch(context.Background(), "feed/token"); err != nil || v != "t-123" {
		t.Fatalf("Fetch = %q, %v", v, err)
	}
	if _, err := (File{Path: good}).Fetch(context.Background(), "other"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing name: %v", err)
	}
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"a":"t-456", "b": 3}`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := (File{Path: bad}).Fetch(context.Background(), "a")
	if err == nil || strings.Contains(err.Error(), "t-456") {
		t.Fatalf("bad file: %v", err)
	}
	if _, err := (File{Path: filepath.Join(dir, "none")}).Fetch(context.Background(), "a"); err == nil {
		t.Fatal("absent file accepted")
	}
}

// fakeSM is a strict fake of the one Secrets Manager call (the consumer-declared
// interface): it checks the id asked for and fails on anything else.
type fakeSM struct {
	t    *testing.T
	want string
	out  *secretsmanager.GetSecretValueOutput
}

func (f fakeSM) GetSecretValue(_ context.Context, in *secretsmanager.GetSecretValueInput,
	_ ...func(*secretsmanager.Options)) (*secretsmanager.GetSecretValueOutput, error) {
	if in.SecretId == nil || *in.SecretId != f.want {
		f.t.Fatalf("asked for %v, want %s", in.SecretId, f.want)
	}
	if f.out == nil {
		return nil, errors.New("ResourceNotFoundException")
	}
	return f.out, nil
}

func TestManagerSource(t *testing.T) {
	v := "sm-value"
	m := Manager{Client: fakeSM{t: t, want: "arn:aws:secretsmanager:r:1:secret:x", out: &secretsmanager.GetSecretValueOutput{SecretString: &v}}}
	if got, err := m.Fetch(context.Background(), "arn:aws:secretsmanager:r:1:secret:x"); err != nil || got != v {
		t.Fatalf("Fetch = %q, %v", got, err)
	}
	bin := Manager{Client: fakeSM{t: t, want: "b", out: &secretsmanager.GetSecretValueOutput{SecretBinary: []byte{1}}}}
	if _, err := bin.Fetch(context.Background(), "b"); err == nil || !strings.Contains(err.Error(), "binary") {
		t.Fatalf("binary secret: %v", err)
	}
	none := Manager{Client: fakeSM{t: t, want: "n"}}
	if _, err := none.Fetch(context.Background(), "n"); err == nil || !strings.Contains(err.Error(), "secret n") {
		t.Fatalf("missing secret: %v", err)
	}
}
