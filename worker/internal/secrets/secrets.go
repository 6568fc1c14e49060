// Package secrets resolves the {{secret:NAME}} and {{secret:NAME#KEY}} references of
// a connection's spec: from AWS Secrets Manager in production, or from a local JSON
// file of name → value (make run), through the same cache and the same
// substitution code in the stream.
//
// Guarantees: a value is cached at most TTL, and Forget drops it at once (the stream
// forgets a connection's secrets after a 401/403 handshake, so a rotated credential
// is re-read). No error of this package contains a secret value, so errors may be
// logged and written to status_error. Non-guarantee: a value read just before the
// secret was rotated is used until TTL or a refused handshake.
package secrets

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/sockfleet/sockfleet/shared/schema"
)

// ErrNotFound is returned for a secret (or a key of a JSON secret) that does not exist.
var ErrNotFound = errors.New("secret not found")

// Source fetches a secret's current value by name (or ARN).
type Source interface {
	Fetch(ctx context.Context, name string) (string, error)
}

// Cache resolves references through a Source, keeping each value for TTL.
type Cache struct {
	Source Source
	TTL    time.Duration    // default 5m
	Now    func() time.Time // default time.Now

	mu sync.Mutex
	m  map[string]entry
}

type entry struct {
	val string
	at  time.Time
}

// Resolve returns ref's value: the whole secret, or with ref.Key the field of a
// JSON-object secret (a string field as is, any other as its JSON text).
func (c *Cache) Resolve(ctx context.Context, ref schema.SecretRef) (string, error) {
	v, err := c.get(ctx, ref.Name)
	if err != nil || ref.Key == "" {
		return v, err
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal([]byte(v), &obj) != nil {
		return "", fmt.Errorf("secret %s: not a JSON object, so key %q cannot be picked", ref.Name, ref.Key)
	}
	raw, ok := obj[ref.Key]
	if !ok {
		return "", fmt.Errorf("secret %s: key %q: %w", ref.Name, ref.Key, ErrNotFound)
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	return string(raw), nil
}

func (c *Cache) get(ctx context.Context, name string) (string, error) {
	now := c.now()
	ttl := c.TTL
	if ttl <= 0 {
		ttl = 5 * time.Minute
	}
	c.mu.Lock()
	e, ok := c.m[name]
	c.mu.Unlock()
	if ok && now.Sub(e.at) < ttl {
		return e.val, nil
	}
	// Fetched without the lock: a slow Secrets Manager must not stall other names.
	v, err := c.Source.Fetch(ctx, name)
	if err != nil {
		return "", err
	}
	c.mu.Lock()
	if c.m == nil {
		c.m = map[string]entry{}
	}
	c.m[name] = entry{val: v, at: now}
	c.mu.Unlock()
	return v, nil
}

// Forget drops name's cached value, so the next Resolve fetches it again.
func (c *Cache) Forget(name string) {
	c.mu.Lock()
	delete(c.m, name)
	c.mu.Unlock()
}

func (c *Cache) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

// File is a local Source: a JSON object of name → value, read on every fetch (the
// Cache bounds how often), so editing the file is like rotating a secret.
type File struct{ Path string }

// Fetch returns the value of name in the file.
func (f File) Fetch(_ context.Context, name string) (string, error) {
	b, err := os.ReadFile(f.Path)
	if err != nil {
		return "", fmt.Errorf("secrets file: %w", err)
	}
	var m map[string]string
	if err := json.Unmarshal(b, &m); err != nil {
		// The JSON error may quote part of the file, which holds secrets: say only where.
		return "", fmt.Errorf("secrets file %s: not a JSON object of string values", f.Path)
	}
	v, ok := m[name]
	if !ok {
		return "", fmt.Errorf("secret %s: %w in %s", name, ErrNotFound, f.Path)
	}
	return v, nil
}

// GetSecretValueAPI is the one Secrets Manager call the Manager source makes.
type GetSecretValueAPI interface {
	GetSecretValue(ctx context.Context, in *secretsmanager.GetSecretValueInput,
		opts ...func(*secretsmanager.Options)) (*secretsmanager.GetSecretValueOutput, error)
}

// Manager is the AWS Secrets Manager Source (the AWSCURRENT version of a string secret).
type Manager struct{ Client GetSecretValueAPI }

// Fetch returns the secret string of name (a name or an ARN).
func (m Manager) Fetch(ctx context.Context, name string) (string, error) {
	out, err := m.Client.GetSecretValue(ctx, &secretsmanager.GetSecretValueInput{SecretId: &name})
	if err != nil {
		return "", fmt.Errorf("secret %s: %w", name, err)
	}
	if out.SecretString == nil {
		return "", fmt.Errorf("secret %s: binary secrets are not supported; store a string", name)
	}
	return *out.SecretString, nil
}
