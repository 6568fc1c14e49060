// Package ddb loads the AWS settings every deployed binary (worker, reconciler,
// operator CLI) starts from.
//
// Endpoints always come from the SDK's standard settings (AWS_ENDPOINT_URL_DYNAMODB,
// AWS_ENDPOINT_URL_DYNAMODB_STREAMS, AWS_REGION, credentials, profiles), so the
// same binaries run against AWS and against a local engine with no code change.
package ddb

import (
	"context"
	"errors"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
)

// LoadConfig loads the standard AWS settings.
func LoadConfig(ctx context.Context) (aws.Config, error) {
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return aws.Config{}, fmt.Errorf("load AWS settings: %w", err)
	}
	if cfg.Region == "" {
		return aws.Config{}, errors.New("load AWS settings: no region: set AWS_REGION or a profile's region")
	}
	return cfg, nil
}
