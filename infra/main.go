// Command infra is sockfleet's CDK app. `cdk deploy` from the repository root builds
// it and runs it there (see ../cdk.json: the CLI hands it paths relative to the
// root, so it must not run inside infra/). It defines one stack, Sockfleet, with
// everything the fleet needs in AWS. The context knobs it reads are documented in
// the README, section "Deploying to AWS", and their defaults sit in cdk.json.
package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/jsii-runtime-go"
)

// stackName is the CloudFormation stack, and the prefix of the worker service name.
const stackName = "Sockfleet"

func main() {
	err := run()
	jsii.Close()
	if err != nil {
		fmt.Fprintln(os.Stderr, "sockfleet infra:", err)
		os.Exit(1)
	}
}

func run() error {
	wd, err := os.Getwd()
	if err != nil {
		return err
	}
	root, err := findRepoRoot(wd)
	if err != nil {
		return err
	}
	app := awscdk.NewApp(nil)
	cfg, err := ConfigFromContext(func(key string) any { return app.Node().TryGetContext(jsii.String(key)) })
	if err != nil {
		return err
	}
	code := filepath.Join(root, "bin", "reconciler")
	if _, err := os.Stat(filepath.Join(code, "bootstrap")); err != nil {
		return fmt.Errorf("the reconciler binary is missing (%w); run `make synth` or `make deploy`, which build it first", err)
	}

	props := awscdk.StackProps{
		Description: jsii.String("sockfleet: WebSocket connection fleet with DynamoDB leases"),
	}
	// Looking up an existing VPC needs a concrete account and region; without one
	// the stack stays environment-agnostic and deploys wherever the CLI points.
	if cfg.VpcID != "" {
		account, region := os.Getenv("CDK_DEFAULT_ACCOUNT"), os.Getenv("CDK_DEFAULT_REGION")
		if account == "" || region == "" {
			return fmt.Errorf("context %s needs AWS credentials and a region, to look the VPC up", ctxVpcID)
		}
		props.Env = &awscdk.Environment{Account: jsii.String(account), Region: jsii.String(region)}
	}
	NewStack(app, stackName, &StackProps{StackProps: props, Config: cfg, RepoRoot: root, ReconcilerCode: code})
	app.Synth(nil)
	return nil
}

// findRepoRoot walks up from dir to the directory holding cdk.json: the Docker
// build context of the worker image, and the base of bin/reconciler.
func findRepoRoot(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "cdk.json")); err == nil {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", errors.New("no cdk.json in " + dir + " or above; run from the repository")
		}
	}
}
