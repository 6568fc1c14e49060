package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/aws/jsii-runtime-go"
)

func TestDefaultConfigIsValid(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	if got := DefaultConfig().RenewDeadline().String(); got != "7s" {
		t.Errorf("renew deadline %s, want 7s", got)
	}
}

// cdk.json carries the defaults, so what the README documents, what synth uses and
// what DefaultConfig says are one set of numbers.
func TestCdkJSONKnobsAreTheDefaults(t *testing.T) {
	ctx, err := cdkContext()
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{ctxMaxConnections, ctxDesiredCount, ctxMaxCount, ctxLeaseSeconds, ctxRenewSeconds, ctxVpcID, ctxRetention,
		ctxKinesisStream, ctxSecretsPrefix, ctxKinesisKMSKey, ctxSecretsKMSKey, ctxNatGateways} {
		if _, ok := ctx[key]; !ok {
			t.Errorf("cdk.json context has no %s", key)
		}
	}
	got, err := ConfigFromContext(func(k string) any { return ctx[k] })
	if err != nil {
		t.Fatal(err)
	}
	if got != DefaultConfig() {
		t.Errorf("cdk.json knobs %+v, defaults %+v", got, DefaultConfig())
	}
}

// The tests synthesize with cdk.json's feature flags: one of them visibly changes
// the template (the VPC's default security group is stripped of its rules).
func TestFeatureFlagsFromCdkJSON(t *testing.T) {
	tpl, _ := template(t)
	check(t, "restrictDefaultSecurityGroup flag applied", func() {
		tpl.ResourceCountIs(jsii.String("Custom::VpcRestrictDefaultSG"), jsii.Number(1))
	})
}

func TestConfigFromContext(t *testing.T) {
	tests := []struct {
		name    string
		ctx     map[string]any
		want    func(Config) bool
		wantErr []string // substrings of the error; nil: no error
	}{
		{name: "empty keeps defaults", ctx: map[string]any{},
			want: func(c Config) bool { return c == DefaultConfig() }},
		{name: "numbers from cdk.json", ctx: map[string]any{ctxDesiredCount: 3.0, ctxMaxCount: 12.0, ctxRetention: 90.0},
			want: func(c Config) bool { return c.DesiredCount == 3 && c.MaxCount == 12 && c.RetentionDays == 90 }},
		{name: "strings from -c", ctx: map[string]any{ctxMaxConnections: "250", ctxVpcID: "vpc-0123456789abcdef0"},
			want: func(c Config) bool { return c.MaxConnectionsPerTask == 250 && c.VpcID == "vpc-0123456789abcdef0" }},
		{name: "the seed's timing is allowed", ctx: map[string]any{ctxLeaseSeconds: 20.0, ctxRenewSeconds: 5.0},
			want: func(c Config) bool { return c.LeaseSeconds == 20 && c.RenewSeconds == 5 }},
		{name: "not a number", ctx: map[string]any{ctxDesiredCount: "two"}, wantErr: []string{ctxDesiredCount, "whole number"}},
		{name: "fraction", ctx: map[string]any{ctxMaxCount: 2.5}, wantErr: []string{ctxMaxCount}},
		{name: "zero tasks", ctx: map[string]any{ctxDesiredCount: 0.0}, wantErr: []string{ctxDesiredCount}},
		{name: "max below desired", ctx: map[string]any{ctxDesiredCount: 5.0, ctxMaxCount: 4.0}, wantErr: []string{ctxMaxCount}},
		{name: "capacity", ctx: map[string]any{ctxMaxConnections: 0.0}, wantErr: []string{ctxMaxConnections}},
		{name: "lease too short for renew", ctx: map[string]any{ctxLeaseSeconds: 30.0, ctxRenewSeconds: 20.0},
			wantErr: []string{ctxLeaseSeconds, "at least 44"}},
		{name: "renew zero", ctx: map[string]any{ctxRenewSeconds: 0.0}, wantErr: []string{ctxRenewSeconds}},
		{name: "bad vpc", ctx: map[string]any{ctxVpcID: "subnet-123"}, wantErr: []string{ctxVpcID}},
		{name: "legacy index from -c", ctx: map[string]any{ctxLegacyIndex: "true"},
			want: func(c Config) bool { return c.KeepLegacyRegistryIndex }},
		{name: "legacy index from cdk.json", ctx: map[string]any{ctxLegacyIndex: false},
			want: func(c Config) bool { return !c.KeepLegacyRegistryIndex }},
		{name: "legacy index not a boolean", ctx: map[string]any{ctxLegacyIndex: "yes"}, wantErr: []string{ctxLegacyIndex, "true or false"}},
		{name: "nat gateway shared", ctx: map[string]any{ctxNatGateways: "1"},
			want: func(c Config) bool { return c.NatGateways == 1 }},
		{name: "no nat gateway", ctx: map[string]any{ctxNatGateways: 0.0}, wantErr: []string{ctxNatGateways}},
		{name: "more nat gateways than AZs", ctx: map[string]any{ctxNatGateways: 3.0}, wantErr: []string{ctxNatGateways}},
		{name: "kms keys", ctx: map[string]any{ctxKinesisStream: "arn:aws:kinesis:eu-west-1:123456789012:stream/feed",
			ctxKinesisKMSKey: "arn:aws:kms:eu-west-1:123456789012:key/11111111-2222-3333-4444-555555555555",
			ctxSecretsKMSKey: "arn:aws:kms:eu-west-1:123456789012:key/mrk-0123456789abcdef"},
			want: func(c Config) bool {
				return c.KinesisKMSKeyARN == "arn:aws:kms:eu-west-1:123456789012:key/11111111-2222-3333-4444-555555555555" &&
					c.SecretsKMSKeyARN == "arn:aws:kms:eu-west-1:123456789012:key/mrk-0123456789abcdef"
			}},
		{name: "kms alias is not a key", ctx: map[string]any{ctxSecretsKMSKey: "arn:aws:kms:eu-west-1:123456789012:alias/mine"},
			wantErr: []string{ctxSecretsKMSKey, "KMS key ARN"}},
		{name: "kinesis key for a created stream", ctx: map[string]any{
			ctxKinesisKMSKey: "arn:aws:kms:eu-west-1:123456789012:key/11111111-2222-3333-4444-555555555555"},
			wantErr: []string{ctxKinesisKMSKey, "existing stream"}},
		{name: "secrets key without secrets", ctx: map[string]any{ctxSecretsPrefix: "",
			ctxSecretsKMSKey: "arn:aws:kms:eu-west-1:123456789012:key/11111111-2222-3333-4444-555555555555"},
			wantErr: []string{ctxSecretsKMSKey, ctxSecretsPrefix}},
		{name: "kinesis create", ctx: map[string]any{ctxKinesisStream: "create"},
			want: func(c Config) bool { return c.KinesisStream == KinesisCreate && !c.SinkIsStdout() }},
		{name: "stdout", ctx: map[string]any{ctxKinesisStream: "stdout"},
			want: func(c Config) bool { return c.SinkIsStdout() }},
		{name: "stdout as empty", ctx: map[string]any{ctxKinesisStream: ""},
			want: func(c Config) bool { return c.SinkIsStdout() }},
		{name: "kinesis by ARN", ctx: map[string]any{ctxKinesisStream: "arn:aws:kinesis:eu-west-1:123456789012:stream/feed"},
			want: func(c Config) bool { return c.KinesisStream == "arn:aws:kinesis:eu-west-1:123456789012:stream/feed" }},
		{name: "kinesis bare name", ctx: map[string]any{ctxKinesisStream: "feed"}, wantErr: []string{ctxKinesisStream, "ARN"}},
		{name: "kinesis not a string", ctx: map[string]any{ctxKinesisStream: true}, wantErr: []string{ctxKinesisStream, "not a string"}},
		{name: "kinesis ARN of another service", ctx: map[string]any{ctxKinesisStream: "arn:aws:sqs:eu-west-1:123456789012:q"},
			wantErr: []string{ctxKinesisStream}},
		{name: "secrets prefix", ctx: map[string]any{ctxSecretsPrefix: "feeds/prod/"},
			want: func(c Config) bool { return c.SecretsPrefix == "feeds/prod/" }},
		{name: "no secrets", ctx: map[string]any{ctxSecretsPrefix: ""}, want: func(c Config) bool { return c.SecretsPrefix == "" }},
		{name: "bad secrets prefix", ctx: map[string]any{ctxSecretsPrefix: "feeds/*"}, wantErr: []string{ctxSecretsPrefix, "characters"}},
		{name: "secrets prefix not a string", ctx: map[string]any{ctxSecretsPrefix: 3.0}, wantErr: []string{ctxSecretsPrefix, "not a string"}},
		{name: "retention CloudWatch refuses", ctx: map[string]any{ctxRetention: 10.0}, wantErr: []string{ctxRetention, "14"}},
		{name: "all problems at once", ctx: map[string]any{ctxDesiredCount: 0.0, ctxRetention: 2.0},
			wantErr: []string{ctxDesiredCount, ctxRetention}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := ConfigFromContext(func(k string) any { return tt.ctx[k] })
			if tt.wantErr == nil {
				if err != nil {
					t.Fatal(err)
				}
				if !tt.want(c) {
					t.Errorf("got %+v", c)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error for %v", tt.ctx)
			}
			for _, s := range tt.wantErr {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		})
	}
}

func TestFindRepoRoot(t *testing.T) {
	root, err := findRepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	want, _ := filepath.Abs("..")
	if root != want {
		t.Errorf("root %s, want %s", root, want)
	}
	if _, err := findRepoRoot(t.TempDir()); err == nil {
		t.Error("found a repository root in an empty temporary directory")
	}
}
