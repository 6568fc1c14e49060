package main

import (
	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsecs"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"
	"github.com/aws/jsii-runtime-go"
)

// Tracing on AWS: the workers and the reconciler export their spans (OpenTelemetry,
// OTLP/HTTP, package shared/tracing) to X-Ray's OTLP endpoint,
// https://xray.REGION.amazonaws.com/v1/traces, the route AWS documents now that the
// X-Ray SDKs and daemon are in maintenance (the ADOT page of the awsxray exporter is
// marked deprecated and points here):
//
//	https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/CloudWatch-OTLPEndpoint.html
//	https://aws-otel.github.io/docs/getting-started/x-ray
//
// The endpoint takes only SigV4-signed requests, which the Go SDK's OTLP exporter
// does not make, and AWS documents collector-less export only for its ADOT SDKs
// (Java, Python, JavaScript, .NET), not Go. So for Go the documented route is the
// ADOT collector, which signs with its sigv4auth extension and sends with its
// otlphttp exporter:
//
//   - the worker task runs it as a sidecar container (ADOT on ECS:
//     https://aws-otel.github.io/docs/setup/ecs), reached on 127.0.0.1:4318 in the
//     task's network namespace, so no security group rule changes;
//   - the reconciler runs it as the ADOT collector Lambda layer, a Lambda
//     extension on localhost:4318 (https://aws-otel.github.io/docs/getting-started/lambda/lambda-go,
//     configured as https://aws-otel.github.io/docs/getting-started/lambda/lambda-custom-configuration).
//
// The endpoint needs Transaction Search enabled once per account and region (README,
// "Tracing"), and grants xray:PutSpans (and xray:PutSpansForIndexing, for the share
// of spans indexed as trace summaries) to the role that signs.
//
// The context knob tracing=false removes the sidecar, the layer, the grants and the
// OTEL_* settings: the processes then run with tracing off (no endpoint set).
const (
	ctxTracing = "tracing"

	// adotCollectorImage is the ADOT collector the worker task runs beside the worker.
	adotCollectorImage = "public.ecr.aws/aws-observability/aws-otel-collector:v0.43.1"
	// adotLambdaLayer is the ADOT collector layer for arm64 functions, published by
	// AWS in every commercial region under this account, at a pinned version.
	adotLambdaLayer = "arn:${AWS::Partition}:lambda:${AWS::Region}:901920570463:layer:aws-otel-collector-arm64-ver-0-117-0:1"
	// collectorContainer is the sidecar's container name.
	collectorContainer = "otel-collector"
	// collectorEndpoint is where a process sends its spans: the collector beside it.
	collectorEndpoint = "http://127.0.0.1:4318"
	// collectorConfigEnv holds the Lambda layer's configuration (the layer reads
	// OPENTELEMETRY_COLLECTOR_CONFIG_URI, here env:SOCKFLEET_COLLECTOR_CONFIG).
	collectorConfigEnv = "SOCKFLEET_COLLECTOR_CONFIG"
)

// xrayWrite is what the signing role needs for the OTLP endpoint. X-Ray has no
// resource-level permissions: the resource is "*".
var xrayWrite = []string{"xray:PutSpans", "xray:PutSpansForIndexing"}

// collectorConfig is the collector's configuration: OTLP/HTTP in on loopback, signed
// OTLP/HTTP out to the region's X-Ray endpoint. batch is for the long-running
// sidecar; the Lambda extension flushes at the end of each invocation instead, so it
// gets none.
func collectorConfig(stack awscdk.Stack, batch bool) *string {
	processors := "[]"
	if batch {
		processors = "[batch]"
	}
	return awscdk.Fn_Sub(jsii.String(`extensions:
  sigv4auth:
    region: ${AWS::Region}
    service: xray
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:4318
processors:
  batch:
    timeout: 5s
exporters:
  otlphttp:
    traces_endpoint: https://xray.${AWS::Region}.${AWS::URLSuffix}/v1/traces
    compression: gzip
    auth:
      authenticator: sigv4auth
service:
  extensions: [sigv4auth]
  pipelines:
    traces:
      receivers: [otlp]
      processors: `+processors+`
      exporters: [otlphttp]
`), nil)
}

// tracingEnv is the OTEL_* settings of a process whose spans go to the collector
// beside it. The service name is the tracing contract's; sampling stays at the
// processes' default (every ownership trace: they are rare events).
func tracingEnv(service string) map[string]*string {
	return map[string]*string{
		"OTEL_EXPORTER_OTLP_ENDPOINT": jsii.String(collectorEndpoint),
		"OTEL_EXPORTER_OTLP_PROTOCOL": jsii.String("http/protobuf"),
		"OTEL_SERVICE_NAME":           jsii.String(service),
	}
}

// addWorkerTracing adds the collector sidecar to the worker task and the grant its
// signing needs to the task role (the worker's OTEL_* settings are tracingEnv's).
// The sidecar is not essential, and the worker does not wait for it: if it fails,
// the worker goes on streaming and its spans are dropped, since tracing must never
// take connections down.
func addWorkerTracing(stack awscdk.Stack, task awsecs.FargateTaskDefinition, logs awslogs.ILogGroup) {
	task.TaskRole().AddToPrincipalPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Actions:   jsii.Strings(xrayWrite...),
		Resources: jsii.Strings("*"),
	}))
	task.AddContainer(jsii.String(collectorContainer), &awsecs.ContainerDefinitionOptions{
		ContainerName: jsii.String(collectorContainer),
		Image:         awsecs.ContainerImage_FromRegistry(jsii.String(adotCollectorImage), nil),
		Essential:     jsii.Bool(false),
		// A hard cap, so a collector that backs up can never starve the worker.
		MemoryLimitMiB: jsii.Number(128),
		Environment:    &map[string]*string{"AOT_CONFIG_CONTENT": collectorConfig(stack, true)},
		Logging: awsecs.LogDriver_AwsLogs(&awsecs.AwsLogDriverProps{
			LogGroup: logs, StreamPrefix: jsii.String(collectorContainer),
		}),
	})
}

// addReconcilerTracing adds the ADOT collector layer to the reconciler, its
// configuration and OTEL_* settings, and the grant its signing needs.
func addReconcilerTracing(stack awscdk.Stack, fn awslambda.Function) {
	fn.AddLayers(awslambda.LayerVersion_FromLayerVersionArn(stack, jsii.String("CollectorLayer"),
		awscdk.Fn_Sub(jsii.String(adotLambdaLayer), nil)))
	for k, v := range tracingEnv("sockfleet-reconciler") {
		fn.AddEnvironment(jsii.String(k), v, nil)
	}
	fn.AddEnvironment(jsii.String(collectorConfigEnv), collectorConfig(stack, false), nil)
	fn.AddEnvironment(jsii.String("OPENTELEMETRY_COLLECTOR_CONFIG_URI"), jsii.String("env:"+collectorConfigEnv), nil)
	fn.AddToRolePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Actions:   jsii.Strings(xrayWrite...),
		Resources: jsii.Strings("*"),
	}))
}
