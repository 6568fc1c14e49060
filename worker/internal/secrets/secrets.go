// Package secrets resolves the {{secret:NAME}} and {{secret:NAME#KEY}} references of
// a connection's spec: from AWS Secrets Manager in production, or from a local JSON
// file (make run), through the same cache and the same substitution code in the
// stream.
//
// A value is handed out only for a destination its owner allowed: Resolve takes the
// dial target (host:port) the value is for and refuses, with a *NotAllowedError, a
// secret that names no allowed hosts or not that one. The allowance lives with the
// secret (the TagAllowedHosts tag in Secrets Manager, "allowed_hosts" in the local
// file), where whoever can create the secret can state it and whoever can only write
// the connection table cannot; so a table writer who points ws_url at a host of
// theirs and names a secret in a header gets a refusal, not the secret.
//
// Guarantees: a value and its allowance are cached together at most TTL, and Forget
// drops them at once (the stream forgets a connection's secrets after a 401/403
// handshake, so a rotated credential is re-read). No error of this package contains
// a secret value, so errors may be logged and written to status_error. A secret that
// allows no host is not read from Secrets Manager at all. Non-guarantees: a value
// (or an allowance) read just before it was changed is used until TTL or a refused
// handshake; the allowance names hosts, not what a host does with the value.
package secrets

import (
	"bytes"
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

// Secret is a secret as a Source read it.
type Secret struct {
	Value string
	// AllowedHosts are the host patterns (see ParseHosts) the value may be sent to,
	// as the secret's owner stated them; none: the value may be sent nowhere.
	AllowedHosts []string
}

// Source fetches a secret's current value and allowance by name (or ARN).
type Source interface {
	Fetch(ctx context.Context, name string) (Secret, error)
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
	val      string
	hosts    Hosts
	hostsErr error // the allowance is malformed: nothing is allowed
	at       time.Time
}

// Resolve returns ref's value for sending to dest, the dial target ("host:port") of
// the socket it goes out on: the whole secret, or with ref.Key the field of a
// JSON-object secret (a string field as is, any other as its JSON text). A secret
// whose allowance does not admit dest is refused with a *NotAllowedError.
func (c *Cache) Resolve(ctx context.Context, ref schema.SecretRef, dest string) (string, error) {
	e, err := c.get(ctx, ref.Name)
	if err != nil {
		return "", err
	}
	switch {
	case e.hostsErr != nil:
		return "", &NotAllowedError{Name: ref.Name, Dest: dest, Why: "its allowance is malformed: " + e.hostsErr.Error()}
	case e.hosts.Empty():
		return "", &NotAllowedError{Name: ref.Name, Dest: dest, Why: "the secret names no allowed hosts"}
	case !e.hosts.Allows(dest):
		return "", &NotAllowedError{Name: ref.Name, Dest: dest, Why: "not among the hosts the secret allows"}
	}
	v := e.val
	if ref.Key == "" {
		return v, nil
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

func (c *Cache) get(ctx context.Context, name string) (entry, error) {
	now := c.now()
	ttl := c.TTL
	if ttl <= 0 {
		ttl = 5 * time.Minute
	}
	c.mu.Lock()
	e, ok := c.m[name]
	c.mu.Unlock()
	if ok && now.Sub(e.at) < ttl {
		return e, nil
	}
	// Fetched without the lock: a slow Secrets Manager must not stall other names.
	sec, err := c.Source.Fetch(ctx, name)
	if err != nil {
		return entry{}, err
	}
	e = entry{val: sec.Value, at: now}
	e.hosts, e.hostsErr = ParseHosts(sec.AllowedHosts)
	c.mu.Lock()
	if c.m == nil {
		c.m = map[string]entry{}
	}
	c.m[name] = e
	c.mu.Unlock()
	return e, nil
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

// File is a local Source: a JSON object of name → secret, read on every fetch (the
// Cache bounds how often), so editing the file is like rotating a secret. A secret
// is either a string, its value, which allows no host (the file's original format,
// still read), or an object {"value": "…", "allowed_hosts": ["stream.example.com",
// "*.example.com"]}.
type File struct{ Path string }

// fileSecret is the object form of a secret in the file.
type fileSecret struct {
	Value        *string  `json:"value"`
	AllowedHosts []string `json:"allowed_hosts"`
}

// Fetch returns the secret name in the file.
func (f File) Fetch(_ context.Context, name string) (Secret, error) {
	b, err := os.ReadFile(f.Path)
	if err != nil {
		return Secret{}, fmt.Errorf("secrets file: %w", err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		// The JSON error may quote part of the file, which holds secrets: say only where.
		return Secret{}, fmt.Errorf("secrets file %s: not a JSON object", f.Path)
	}
	raw, ok := m[name]
	if !ok {
		return Secret{}, fmt.Errorf("secret %s: %w in %s", name, ErrNotFound, f.Path)
	}
	var v string
	if json.Unmarshal(raw, &v) == nil {
		return Secret{Value: v}, nil
	}
	var fs fileSecret
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields() // a misspelt allowed_hosts must not pass unnoticed
	if err := dec.Decode(&fs); err != nil || fs.Value == nil {
		// Again no JSON error: it may quote the value.
		return Secret{}, fmt.Errorf(`secret %s in %s: want a string or {"value": "…", "allowed_hosts": ["host", …]}`, name, f.Path)
	}
	return Secret{Value: *fs.Value, AllowedHosts: fs.AllowedHosts}, nil
}

// ManagerAPI is the two Secrets Manager calls the Manager source makes.
type ManagerAPI interface {
	DescribeSecret(ctx context.Context, in *secretsmanager.DescribeSecretInput,
		opts ...func(*secretsmanager.Options)) (*secretsmanager.DescribeSecretOutput, error)
	GetSecretValue(ctx context.Context, in *secretsmanager.GetSecretValueInput,
		opts ...func(*secretsmanager.Options)) (*secretsmanager.GetSecretValueOutput, error)
}

// Manager is the AWS Secrets Manager Source: the AWSCURRENT version of a string
// secret, allowed to the hosts its TagAllowedHosts tag lists. A secret without the
// tag allows no host, and its value is not read.
type Manager struct{ Client ManagerAPI }

// Fetch returns the secret name (a name or an ARN).
func (m Manager) Fetch(ctx context.Context, name string) (Secret, error) {
	desc, err := m.Client.DescribeSecret(ctx, &secretsmanager.DescribeSecretInput{SecretId: &name})
	if err != nil {
		return Secret{}, fmt.Errorf("secret %s: describe (for its %s tag): %w", name, TagAllowedHosts, err)
	}
	var sec Secret
	for _, t := range desc.Tags {
		if t.Key != nil && *t.Key == TagAllowedHosts && t.Value != nil {
			sec.AllowedHosts = append(sec.AllowedHosts, splitTag(*t.Value)...)
		}
	}
	if len(sec.AllowedHosts) == 0 {
		return sec, nil // allowed nowhere: no need to hold its value
	}
	out, err := m.Client.GetSecretValue(ctx, &secretsmanager.GetSecretValueInput{SecretId: &name})
	if err != nil {
		return Secret{}, fmt.Errorf("secret %s: %w", name, err)
	}
	if out.SecretString == nil {
		return Secret{}, fmt.Errorf("secret %s: binary secrets are not supported; store a string", name)
	}
	sec.Value = *out.SecretString
	return sec, nil
}
