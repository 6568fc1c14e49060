package main

import (
	"fmt"
	"strings"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsecs"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/jsii-runtime-go"

	"github.com/sockfleet/sockfleet/shared/schema"
)

// ctxSinkStreams lists the Kinesis streams a connection's own sink attribute may
// name (docs/CONNECTIONS.md, "sink"): names (in the stack's account and region) or
// ARNs, as a string separated by commas or spaces, or a JSON list in cdk.json.
const ctxSinkStreams = "sinkStreams"

// sinkStreamsFrom reads the sinkStreams knob. Files (file:PATH) are for local runs
// only: a task has no file a consumer could read.
func sinkStreamsFrom(v any) (string, error) {
	var raw string
	switch x := v.(type) {
	case string:
		raw = x
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			s, ok := e.(string)
			if !ok {
				return "", fmt.Errorf("[%d] %v is not a string", i, e)
			}
			parts[i] = s
		}
		raw = strings.Join(parts, ",")
	default:
		return "", fmt.Errorf("%v is neither a string nor a list of strings", v)
	}
	names, err := schema.ParseSinksAllowed(raw)
	if err != nil {
		return "", err
	}
	for _, n := range names {
		if strings.HasPrefix(n, "file:") {
			return "", fmt.Errorf("%s: a file sink is for local runs; the stack allows Kinesis streams only", n)
		}
	}
	return strings.Join(names, ","), nil
}

// allowSinkStreams lets the workers write to each stream cfg.SinkStreams names
// (kinesis:PutRecords, the sink's only call, on exactly those streams) and tells
// them which they are (SOCKFLEET_SINKS_ALLOWED, the names as the items write them).
func allowSinkStreams(stack awscdk.Stack, task awsecs.TaskDefinition, cfg Config, env map[string]*string) {
	if cfg.SinkStreams == "" {
		return
	}
	names := strings.Split(cfg.SinkStreams, ",")
	arns := make([]*string, len(names))
	for i, n := range names {
		if strings.HasPrefix(n, "arn:") {
			arns[i] = jsii.String(n)
			continue
		}
		arns[i] = stack.FormatArn(&awscdk.ArnComponents{
			Service: jsii.String("kinesis"), Resource: jsii.String("stream"), ResourceName: jsii.String(n),
		})
	}
	task.TaskRole().AddToPrincipalPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Actions:   jsii.Strings("kinesis:PutRecords"),
		Resources: &arns,
	}))
	env[schema.EnvSinksAllowed] = jsii.String(cfg.SinkStreams)
}
