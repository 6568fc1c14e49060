package main

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsapplicationautoscaling"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatch"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatchactions"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsdynamodb"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsec2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsecrassets"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsecs"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsevents"
	"github.com/aws/aws-cdk-go/awscdk/v2/awseventstargets"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awskinesis"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambdaeventsources"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssecretsmanager"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssns"
	"github.com/aws/aws-cdk-go/awscdk/v2/interfaces/interfacesawscloudwatch"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"

	"github.com/sockfleet/sockfleet/shared/filters"
	"github.com/sockfleet/sockfleet/shared/schema"
)

// Worker task size. A worker's connections are mostly idle sockets (tens of KB each
// in Go), so 0.5 vCPU / 1 GB holds maxConnectionsPerTask (500 by default) with room
// for TLS handshakes after a failover; CPU and memory autoscaling cover heavier streams.
const (
	workerCPU    = 512
	workerMemory = 1024
)

// sweepPeriodSeconds is the backstop sweep's schedule. At one minute, a hung
// worker's leases are released at most skew margin + one period (65 s) after they
// expire, well inside the 2-minute orphan alarm, and reading a 1,000-connection
// table once a minute costs about 1.7 million read units (21 cents) a month.
const sweepPeriodSeconds = 60

// WorkerUpdateKeys are the partition keys a worker may UpdateItem: connections,
// worker items and connect-quota items.
var WorkerUpdateKeys = []string{schema.ConnPrefix + "*", schema.WorkerPrefix + "*", schema.QuotaPrefix + "*"}

// Worker shutdown: ECS sends SIGTERM, waits stopTimeout, then SIGKILLs. The worker's
// drain (stop sockets, checkpoint and release each lease) must finish well inside
// that, or its connections wait for the crash path instead of the release path.
const (
	stopTimeoutSeconds  = 120 // the Fargate maximum
	drainTimeoutSeconds = 60
)

// StackProps configures the sockfleet stack.
type StackProps struct {
	awscdk.StackProps
	Config Config
	// RepoRoot is the worker image's Docker build context: the repository root, with
	// the Dockerfile and .dockerignore.
	RepoRoot string
	// ReconcilerCode is the directory holding the reconciler's `bootstrap` binary.
	// Empty means RepoRoot/bin/reconciler, where `make lambda` writes it.
	ReconcilerCode string
}

// NewStack defines the whole AWS side of sockfleet: the table and its stream, the
// reconciler Lambda and its triggers, the worker fleet on Fargate, the network
// between them, alarms and a dashboard.
func NewStack(scope constructs.Construct, id string, props *StackProps) awscdk.Stack {
	cfg := props.Config
	stack := awscdk.NewStack(scope, jsii.String(id), &props.StackProps)
	// The worker service's name doubles as the ServiceName dimension of the workers'
	// metrics (autoscaling reads it), so it is derived from the stack name.
	serviceName := *stack.StackName() + "-worker"
	retention := retentionEnum[cfg.RetentionDays]

	table := newTable(stack, cfg)

	// Network. Workers live in private subnets and dial their upstreams through
	// NAT; DynamoDB traffic takes the free gateway endpoint instead. A NAT gateway
	// lives in one AZ, and private subnets route to their own AZ's gateway when there
	// is one per AZ (the default): with a single shared gateway, losing its AZ cuts
	// every worker off from its upstreams.
	var vpc awsec2.IVpc
	if cfg.VpcID != "" {
		vpc = awsec2.Vpc_FromLookup(stack, jsii.String("Vpc"), &awsec2.VpcLookupOptions{VpcId: jsii.String(cfg.VpcID)})
	} else {
		vpc = awsec2.NewVpc(stack, jsii.String("Vpc"), &awsec2.VpcProps{
			MaxAzs:      jsii.Number(MaxAZs),
			NatGateways: jsii.Number(float64(cfg.NatGateways)),
			GatewayEndpoints: &map[string]*awsec2.GatewayVpcEndpointOptions{
				"DynamoDb": {Service: awsec2.GatewayVpcEndpointAwsService_DYNAMODB()},
			},
		})
	}
	private := &awsec2.SubnetSelection{SubnetType: awsec2.SubnetType_PRIVATE_WITH_EGRESS}

	workerSG := awsec2.NewSecurityGroup(stack, jsii.String("WorkerSecurityGroup"), &awsec2.SecurityGroupProps{
		Vpc:              vpc,
		Description:      jsii.String("sockfleet workers: outbound to upstreams and AWS; inbound only the wakeup port, from the reconciler and other workers"),
		AllowAllOutbound: jsii.Bool(true),
	})
	reconcilerSG := awsec2.NewSecurityGroup(stack, jsii.String("ReconcilerSecurityGroup"), &awsec2.SecurityGroupProps{
		Vpc:              vpc,
		Description:      jsii.String("sockfleet reconciler: wakeup calls to workers, HTTPS to AWS APIs"),
		AllowAllOutbound: jsii.Bool(false),
	})
	wakeupPort := awsec2.Port_Tcp(jsii.Number(schema.DefaultWakeupPort))
	// The workers' only ingress, both on the wakeup port: the reconciler's wakeups,
	// and the workers' own calls to each other (POST /v1/handoff, the make-before-break
	// handoff, docs/HANDOFF.md). A security group admits nothing inbound that a rule
	// does not allow, members of the same group included, so the self-referencing
	// rule is needed; CDK renders it as a separate AWS::EC2::SecurityGroupIngress
	// resource, as a group cannot name itself in its own inline rules. (Ingress only:
	// the group already allows all outbound.)
	reconcilerSG.Connections().AllowTo(workerSG, wakeupPort, jsii.String("wakeup calls"))
	workerSG.AddIngressRule(workerSG, wakeupPort, jsii.String("handoff calls between workers"), jsii.Bool(false))
	reconcilerSG.AddEgressRule(awsec2.Peer_AnyIpv4(), awsec2.Port_Tcp(jsii.Number(443)),
		jsii.String("AWS APIs: DynamoDB (gateway endpoint), Secrets Manager"), jsii.Bool(false))

	// The HMAC key of wakeup calls. Nothing outside the stack ever needs it.
	wakeupSecret := awssecretsmanager.NewSecret(stack, jsii.String("WakeupSecret"), &awssecretsmanager.SecretProps{
		Description: jsii.String("sockfleet: HMAC key authenticating the reconciler's wakeup calls to workers"),
		GenerateSecretString: &awssecretsmanager.SecretStringGenerator{
			PasswordLength:     jsii.Number(64),
			ExcludePunctuation: jsii.Bool(true),
		},
	})

	cluster := awsecs.NewCluster(stack, jsii.String("Cluster"), &awsecs.ClusterProps{
		Vpc:                 vpc,
		ContainerInsightsV2: awsecs.ContainerInsights_ENABLED,
	})

	alarmTopic := awssns.NewTopic(stack, jsii.String("Alarms"), &awssns.TopicProps{
		DisplayName: jsii.String("sockfleet alarms"),
	})
	// Where Lambda reports stream batches it gave up on (after retries, or when too
	// old). The design has no SQS; the record only says which shard and sequence
	// numbers were skipped, and the sweep repairs what they would have triggered.
	failedBatches := awssns.NewTopic(stack, jsii.String("FailedStreamBatches"), &awssns.TopicProps{
		DisplayName: jsii.String("sockfleet reconciler: stream batches given up on"),
	})

	reconciler := newReconciler(stack, reconcilerProps{
		cfg:         cfg,
		codeDir:     reconcilerCodeDir(props),
		vpc:         vpc,
		subnets:     private,
		sg:          reconcilerSG,
		table:       table,
		secret:      wakeupSecret,
		cluster:     cluster,
		serviceName: serviceName,
		failures:    failedBatches,
		retention:   retention,
	})

	stream, streamRef := newSinkStream(stack, cfg)
	service := newWorkers(stack, workerProps{
		sink:        stream,
		sinkRef:     streamRef,
		cfg:         cfg,
		repoRoot:    props.RepoRoot,
		cluster:     cluster,
		subnets:     private,
		sg:          workerSG,
		table:       table,
		secret:      wakeupSecret,
		serviceName: serviceName,
		retention:   retention,
	})

	// Like the Lambda (which CDK makes depend on them itself), the service must not
	// start tasks before its subnets' default routes to NAT exist: a task started
	// without them cannot pull its image from ECR or its secret from Secrets Manager
	// (no interface endpoints: both go through NAT) and fails to start, which on a
	// fresh stack's first deploy can trip the deployment circuit breaker and roll
	// the whole stack back.
	service.Node().AddDependency(vpc.SelectSubnets(private).InternetConnectivityEstablished)

	alarms := newAlarms(stack, table, reconciler, service, cluster, failedBatches, alarmTopic, serviceName)
	newDashboard(stack, table, reconciler, service, alarms, serviceName)

	out := func(id, desc string, v *string) {
		awscdk.NewCfnOutput(stack, jsii.String(id), &awscdk.CfnOutputProps{Value: v, Description: jsii.String(desc)})
	}
	out("TableName", "the connections table: flip desired_state here", table.TableName())
	out("ClusterName", "the ECS cluster of the workers", cluster.ClusterName())
	out("ServiceName", "the workers' ECS service, also the ServiceName dimension of the workers' metrics", service.ServiceName())
	out("FunctionName", "the reconciler Lambda", reconciler.FunctionName())
	out("AlarmTopicArn", "subscribe here to receive alarms", alarmTopic.TopicArn())
	return stack
}

func reconcilerCodeDir(props *StackProps) string {
	if props.ReconcilerCode != "" {
		return props.ReconcilerCode
	}
	return filepath.Join(props.RepoRoot, "bin", "reconciler")
}

// newTable builds the table from schema.Table, the same definition the local
// bootstrap creates, so production and local runs cannot drift. With
// KeepLegacyRegistryIndex it also keeps the registry index of earlier versions.
func newTable(stack awscdk.Stack, cfg Config) awsdynamodb.TableV2 {
	def := schema.Table
	indexes := def.Indexes
	if cfg.KeepLegacyRegistryIndex {
		indexes = append(slices.Clip(indexes), schema.LegacyRegistryIndex)
	}
	var gsis []*awsdynamodb.GlobalSecondaryIndexPropsV2
	for _, ix := range indexes {
		gsis = append(gsis, &awsdynamodb.GlobalSecondaryIndexPropsV2{
			IndexName:      jsii.String(ix.Name),
			PartitionKey:   &awsdynamodb.Attribute{Name: jsii.String(ix.PartitionKey), Type: awsdynamodb.AttributeType_STRING},
			ProjectionType: awsdynamodb.ProjectionType(ix.Projection),
		})
	}
	return awsdynamodb.NewTableV2(stack, jsii.String("Table"), &awsdynamodb.TablePropsV2{
		PartitionKey:           &awsdynamodb.Attribute{Name: jsii.String(def.PartitionKey), Type: awsdynamodb.AttributeType_STRING},
		GlobalSecondaryIndexes: &gsis,
		// On demand: the write rate is steady and small per connection, and capacity
		// planning would have to cover deploy-time bursts of releases and acquires.
		Billing:             awsdynamodb.Billing_OnDemand(nil),
		DynamoStream:        awsdynamodb.StreamViewType(def.StreamView),
		TimeToLiveAttribute: jsii.String(def.TTLAttribute),
		PointInTimeRecoverySpecification: &awsdynamodb.PointInTimeRecoverySpecification{
			PointInTimeRecoveryEnabled: jsii.Bool(true),
		},
		// The table is the operators' source of truth (which connections exist and
		// should run, and where each resumes): it outlives the stack.
		RemovalPolicy:      awscdk.RemovalPolicy_RETAIN,
		DeletionProtection: jsii.Bool(true),
	})
}

type reconcilerProps struct {
	cfg         Config
	codeDir     string
	vpc         awsec2.IVpc
	subnets     *awsec2.SubnetSelection
	sg          awsec2.ISecurityGroup
	table       awsdynamodb.TableV2
	secret      awssecretsmanager.ISecret
	cluster     awsecs.ICluster
	serviceName string
	failures    awssns.ITopic
	retention   awslogs.RetentionDays
}

// newReconciler defines the Lambda that turns stream records, task-stopped events
// and the sweep into wakeups and releases.
func newReconciler(stack awscdk.Stack, p reconcilerProps) awslambda.Function {
	logs := awslogs.NewLogGroup(stack, jsii.String("ReconcilerLogs"), &awslogs.LogGroupProps{
		Retention:     p.retention,
		RemovalPolicy: awscdk.RemovalPolicy_DESTROY,
	})
	fn := awslambda.NewFunction(stack, jsii.String("Reconciler"), &awslambda.FunctionProps{
		Description:  jsii.String("sockfleet reconciler: wakes workers for connections that need an owner or an action"),
		Runtime:      awslambda.Runtime_PROVIDED_AL2023(),
		Architecture: awslambda.Architecture_ARM_64(),
		Handler:      jsii.String("bootstrap"),
		Code:         awslambda.Code_FromAsset(jsii.String(p.codeDir), nil),
		// The work is I/O: a few DynamoDB calls and HTTP wakeups per batch, with
		// tiny payloads. 256 MB rather than 128 buys a larger CPU and network share
		// for a fan-out of parallel wakeups, at a cost measured in cents.
		MemorySize: jsii.Number(256),
		// 30 s covers a worst-case batch: 100 records, each woken with a bounded
		// per-call timeout and re-routed to a few more workers when refused. It stays
		// well under the 1-minute sweep schedule, so sweeps never pile up, and a hung
		// invocation is retried by the event source long before records age out.
		Timeout:        awscdk.Duration_Seconds(jsii.Number(30)),
		Vpc:            p.vpc,
		VpcSubnets:     p.subnets,
		SecurityGroups: &[]awsec2.ISecurityGroup{p.sg},
		LogGroup:       logs,
		Environment: &map[string]*string{
			schema.EnvTable:           p.table.TableName(),
			schema.EnvWakeupSecretARN: p.secret.SecretArn(),
			schema.EnvClusterARN:      p.cluster.ClusterArn(),
			schema.EnvSkewMargin:      jsii.String(seconds(int(skewMargin.Seconds()))),
			// The sweep reads one scan segment per period, so it must know the
			// schedule's period.
			schema.EnvSweepPeriod: jsii.String(seconds(sweepPeriodSeconds)),
			// Rebalance rounds (README, "Spreading load"): the defaults, written out so
			// an operator sees and edits them on the function.
			schema.EnvRebalance:            jsii.String("on"),
			schema.EnvRebalanceTolerance:   jsii.String("0.1"),
			schema.EnvRebalanceMaxFraction: jsii.String("0.1"),
			schema.EnvRebalanceCooling:     jsii.String("5m"),
			schema.EnvRebalanceMinInterval: jsii.String("5s"),
			schema.EnvRebalanceSettle:      jsii.String("15s"),
		},
	})

	// Exactly what the handler calls: reads and conditional updates (releases,
	// sweep nudges, declaring members dead), Query on the lease_owner and registry
	// indexes, BatchGetItem of the worker items the registry index lists and of a
	// rebalance round's candidates, PutItem of tombstones and of a stopped task's
	// gone item, DeleteItem of worker items lapsed an hour ago, and the sweep's
	// Scan. The event source below adds the stream read; SnsDlq adds sns:Publish.
	p.table.Grant(fn, jsii.String("dynamodb:GetItem"), jsii.String("dynamodb:BatchGetItem"), jsii.String("dynamodb:UpdateItem"),
		jsii.String("dynamodb:PutItem"), jsii.String("dynamodb:DeleteItem"), jsii.String("dynamodb:Query"), jsii.String("dynamodb:Scan"))
	fn.AddToRolePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Actions:   jsii.Strings("secretsmanager:GetSecretValue"),
		Resources: jsii.Strings(*p.secret.SecretArn()),
	}))
	if p.cfg.Tracing {
		addReconcilerTracing(stack, fn)
	}

	// The stream trigger. Filters drop heartbeats before they can invoke anything;
	// they are rendered from the same patterns the local stream poller applies.
	var fc []*map[string]any
	for _, pattern := range filters.JSON() {
		fc = append(fc, &map[string]any{"pattern": pattern})
	}
	fn.AddEventSource(awslambdaeventsources.NewDynamoEventSource(p.table, &awslambdaeventsources.DynamoEventSourceProps{
		StartingPosition: awslambda.StartingPosition_LATEST,
		Filters:          &fc,
		// A batch is one invocation's fan-out; 100 bounds it for the timeout above.
		BatchSize: jsii.Number(100),
		// Failover latency is the point of the stream: never wait to fill a batch.
		MaxBatchingWindow: awscdk.Duration_Seconds(jsii.Number(0)),
		// A poison record is isolated by bisection and reported per item, so one bad
		// item cannot stall its shard; retries are finite and records expire after an
		// hour, by which time the sweep has repaired anything they would have done.
		BisectBatchOnError:      jsii.Bool(true),
		RetryAttempts:           jsii.Number(5),
		MaxRecordAge:            awscdk.Duration_Hours(jsii.Number(1)),
		ReportBatchItemFailures: jsii.Bool(true),
		OnFailure:               awslambdaeventsources.NewSnsDlq(p.failures),
	}))

	target := func(input awsevents.RuleTargetInput) awsevents.IRuleTarget {
		return awseventstargets.NewLambdaFunction(fn, &awseventstargets.LambdaFunctionProps{
			Event: input,
			// Both triggers are repaired by the next sweep if lost, so a bounded
			// retry beats EventBridge's 24-hour default (and needs no SQS DLQ).
			RetryAttempts: jsii.Number(8),
			MaxEventAge:   awscdk.Duration_Minutes(jsii.Number(15)),
		})
	}
	// Crash path: the worker container of a task of this cluster stopped. The
	// handler releases the task's leases; the releases reach the stream and are
	// reassigned from there. It matches on the container, not the task: an exited
	// container is reported STOPPED while its task is still DEACTIVATING or
	// DEPROVISIONING (tens of seconds), and the process is gone by then, whereas a
	// task's desiredStatus STOPPED comes while a draining worker still runs. The
	// containers array matches if any entry has these values, so the handler checks
	// that one entry is the stopped worker container (handler.TaskEvent.WorkerGone).
	awsevents.NewRule(stack, jsii.String("TaskStopped"), &awsevents.RuleProps{
		Description: jsii.String("sockfleet: a worker container stopped; release its task's leases"),
		EventPattern: &awsevents.EventPattern{
			Source:     jsii.Strings("aws.ecs"),
			DetailType: jsii.Strings("ECS Task State Change"),
			Detail: &map[string]any{
				"clusterArn": []*string{p.cluster.ClusterArn()},
				"containers": map[string]any{
					"name":       []string{schema.WorkerContainer},
					"lastStatus": []string{"STOPPED"},
				},
			},
		},
		Targets: &[]awsevents.IRuleTarget{target(nil)},
	})
	// Backstop sweep: releases leases that expired without an event (a hung or
	// partitioned worker) and nudges unowned STARTED connections.
	awsevents.NewRule(stack, jsii.String("Sweep"), &awsevents.RuleProps{
		Description: jsii.String("sockfleet: backstop sweep of expired leases"),
		Schedule:    awsevents.Schedule_Rate(awscdk.Duration_Seconds(jsii.Number(sweepPeriodSeconds))),
		Targets: &[]awsevents.IRuleTarget{target(awsevents.RuleTargetInput_FromObject(
			map[string]string{schema.SweepInputKey: schema.SweepInputValue}))},
	})
	return fn
}

type workerProps struct {
	cfg         Config
	repoRoot    string
	cluster     awsecs.ICluster
	subnets     *awsec2.SubnetSelection
	sg          awsec2.ISecurityGroup
	table       awsdynamodb.TableV2
	secret      awssecretsmanager.ISecret
	serviceName string
	retention   awslogs.RetentionDays
	sink        awskinesis.IStream // nil: the workers write to stdout
	sinkRef     *string            // the stream as SOCKFLEET_SINK names it
}

// newSinkStream is the Kinesis stream the workers deliver to, unless the
// kinesisStream knob chose stdout: created here (the default; on demand, so no shard
// count to size; encrypted with the AWS-managed key, which needs no KMS grant), or
// an existing one by ARN.
func newSinkStream(stack awscdk.Stack, cfg Config) (awskinesis.IStream, *string) {
	switch {
	case cfg.SinkIsStdout():
		return nil, nil
	case cfg.KinesisStream == KinesisCreate:
		s := awskinesis.NewStream(stack, jsii.String("Messages"), &awskinesis.StreamProps{
			StreamMode:      awskinesis.StreamMode_ON_DEMAND,
			Encryption:      awskinesis.StreamEncryption_MANAGED,
			RetentionPeriod: awscdk.Duration_Hours(jsii.Number(24)),
		})
		awscdk.NewCfnOutput(stack, jsii.String("KinesisStreamName"), &awscdk.CfnOutputProps{
			Value: s.StreamName(), Description: jsii.String("the Kinesis stream the workers deliver messages to"),
		})
		return s, s.StreamName()
	default:
		return awskinesis.Stream_FromStreamArn(stack, jsii.String("Messages"), jsii.String(cfg.KinesisStream)), jsii.String(cfg.KinesisStream)
	}
}

// newWorkers defines the worker fleet: task definition, service and autoscaling.
func newWorkers(stack awscdk.Stack, p workerProps) awsecs.FargateService {
	cfg := p.cfg
	task := awsecs.NewFargateTaskDefinition(stack, jsii.String("WorkerTask"), &awsecs.FargateTaskDefinitionProps{
		Cpu:            jsii.Number(workerCPU),
		MemoryLimitMiB: jsii.Number(workerMemory),
		RuntimePlatform: &awsecs.RuntimePlatform{
			CpuArchitecture:       awsecs.CpuArchitecture_ARM64(),
			OperatingSystemFamily: awsecs.OperatingSystemFamily_LINUX(),
		},
	})
	// Leases: acquire, renew, checkpoint and release are UpdateItem; GetItem reads
	// an item back after an ambiguous write, a host's 429 hold without a connect
	// quota, and confirms a phantom lease; Query on the lease_owner index finds what
	// the worker still holds and, at each backstop pass, every item that names it
	// (the reconciliation, worker/internal/owner); BatchGetItem is the backstop read
	// of its own connections. table.Grant covers the table and its indexes.
	p.table.Grant(task.TaskRole(), jsii.String("dynamodb:GetItem"), jsii.String("dynamodb:BatchGetItem"),
		jsii.String("dynamodb:Query"))
	// UpdateItem reaches exactly the worker's three kinds of item: connections
	// (leases), its registry item (membership) and the per-host connect-quota items
	// (docs/CONNECTIONS.md), by dynamodb:LeadingKeys. On the base table only: no
	// index is ever updated.
	task.TaskRole().AddToPrincipalPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Actions:   jsii.Strings("dynamodb:UpdateItem"),
		Resources: jsii.Strings(*p.table.TableArn()),
		Conditions: &map[string]any{
			"ForAllValues:StringLike": map[string]any{"dynamodb:LeadingKeys": WorkerUpdateKeys},
		},
	}))
	// The worker's only PutItem and DeleteItem calls are on its own registry item
	// (shared/registry: Join and, in polling mode, Put and Delete), never on a
	// connection item, so both are limited to WORKER# keys. dynamodb:LeadingKeys is
	// the partition key values a request touches; ForAllValues requires every one of
	// them to match. Put and Delete act on the base table only.
	task.TaskRole().AddToPrincipalPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Actions:   jsii.Strings("dynamodb:PutItem", "dynamodb:DeleteItem"),
		Resources: jsii.Strings(*p.table.TableArn()),
		Conditions: &map[string]any{
			"ForAllValues:StringLike": map[string]any{"dynamodb:LeadingKeys": []string{schema.WorkerPrefix + "*"}},
		},
	}))
	// The start-up pass (owner.ScanCandidates) scans the base table once per worker
	// start for STARTED connections without a live owner. Scan on the table's ARN
	// only: an index is a resource of its own (TABLE/index/NAME), and no index is
	// scanned. A statement rather than table.Grant, which would add the indexes.
	task.TaskRole().AddToPrincipalPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Actions:   jsii.Strings("dynamodb:Scan"),
		Resources: jsii.Strings(*p.table.TableArn()),
	}))
	// Connection specs' {{secret:NAME}} references: read, with the tag naming the
	// hosts each may be sent to (DescribeSecret), and only under the prefix the
	// operator chose (docs/CONNECTIONS.md).
	if cfg.SecretsPrefix != "" {
		task.TaskRole().AddToPrincipalPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Actions: jsii.Strings("secretsmanager:GetSecretValue", "secretsmanager:DescribeSecret"),
			Resources: jsii.Strings(*stack.FormatArn(&awscdk.ArnComponents{
				Service: jsii.String("secretsmanager"), Resource: jsii.String("secret"),
				ResourceName: jsii.String(cfg.SecretsPrefix + "*"), ArnFormat: awscdk.ArnFormat_COLON_RESOURCE_NAME,
			})),
		}))
	}

	// Customer-managed KMS keys: exactly the action each use needs, on that key.
	// A Kinesis producer needs kms:GenerateDataKey on an SSE-KMS stream's key;
	// GetSecretValue needs kms:Decrypt on the secret's key. The AWS-managed keys
	// (alias/aws/kinesis, aws/secretsmanager) need neither.
	if cfg.KinesisKMSKeyARN != "" {
		task.TaskRole().AddToPrincipalPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Actions:   jsii.Strings("kms:GenerateDataKey"),
			Resources: jsii.Strings(cfg.KinesisKMSKeyARN),
		}))
	}
	if cfg.SecretsKMSKeyARN != "" {
		task.TaskRole().AddToPrincipalPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Actions:   jsii.Strings("kms:Decrypt"),
			Resources: jsii.Strings(cfg.SecretsKMSKeyARN),
		}))
	}

	env := map[string]*string{
		schema.EnvTable:          p.table.TableName(),
		schema.EnvListenAddr:     jsii.String(":" + strconv.Itoa(schema.DefaultWakeupPort)),
		schema.EnvMaxConnections: jsii.String(strconv.Itoa(cfg.MaxConnectionsPerTask)),
		schema.EnvLease:          jsii.String(seconds(cfg.LeaseSeconds)),
		schema.EnvRenewInterval:  jsii.String(seconds(cfg.RenewSeconds)),
		schema.EnvRenewDeadline:  jsii.String(seconds(int(cfg.RenewDeadline().Seconds()))),
		schema.EnvSkewMargin:     jsii.String(seconds(int(skewMargin.Seconds()))),
		schema.EnvDrainTimeout:   jsii.String(seconds(drainTimeoutSeconds)),
		schema.EnvServiceName:    jsii.String(p.serviceName),
	}
	if p.sink != nil {
		// grantWrite: PutRecord(s) and ListShards on this stream, for the task role
		// alone: the execution role never touches messages.
		p.sink.GrantWrite(task.TaskRole())
		env[schema.EnvSink] = awscdk.Fn_Join(jsii.String(""), &[]*string{jsii.String("kinesis:"), p.sinkRef})
	}
	allowSinkStreams(stack, task, cfg, env)

	if cfg.Tracing {
		for k, v := range tracingEnv("sockfleet-worker") {
			env[k] = v
		}
	}

	logs := awslogs.NewLogGroup(stack, jsii.String("WorkerLogs"), &awslogs.LogGroupProps{
		Retention:     p.retention,
		RemovalPolicy: awscdk.RemovalPolicy_DESTROY,
	})
	task.AddContainer(jsii.String("worker"), &awsecs.ContainerDefinitionOptions{
		// The reconciler's task-stopped path looks for this name in ECS events.
		ContainerName: jsii.String(schema.WorkerContainer),
		Image: awsecs.ContainerImage_FromAsset(jsii.String(p.repoRoot), &awsecs.AssetImageProps{
			File:     jsii.String("Dockerfile"),
			Platform: awsecrassets.Platform_LINUX_ARM64(),
		}),
		Essential: jsii.Bool(true),
		PortMappings: &[]*awsecs.PortMapping{{
			Name:          jsii.String("wakeup"),
			ContainerPort: jsii.Number(schema.DefaultWakeupPort),
			Protocol:      awsecs.Protocol_TCP,
		}},
		Environment: &env,
		// Injected by ECS at task start (the execution role reads it), never baked
		// into the image or visible in the task definition.
		Secrets: &map[string]awsecs.Secret{
			schema.EnvWakeupSecret: awsecs.Secret_FromSecretsManager(p.secret, nil),
		},
		// The image is distroless (no shell, no curl): the worker binary probes its
		// own /healthz.
		HealthCheck: &awsecs.HealthCheck{
			Command:     jsii.Strings("CMD", "/worker", "healthcheck"),
			Interval:    awscdk.Duration_Seconds(jsii.Number(15)),
			Timeout:     awscdk.Duration_Seconds(jsii.Number(5)),
			Retries:     jsii.Number(3),
			StartPeriod: awscdk.Duration_Seconds(jsii.Number(30)),
		},
		StopTimeout: awscdk.Duration_Seconds(jsii.Number(stopTimeoutSeconds)),
		Logging:     workerLogDriver(logs, p.sink == nil),
	})
	// After the worker, which stays the task's first container.
	if cfg.Tracing {
		addWorkerTracing(stack, task, logs)
	}

	service := awsecs.NewFargateService(stack, jsii.String("WorkerService"), &awsecs.FargateServiceProps{
		Cluster:        p.cluster,
		TaskDefinition: task,
		ServiceName:    jsii.String(p.serviceName),
		// No DesiredCount: autoscaling owns the count. CloudFormation writes a
		// template's DesiredCount on every update of the service, so a fixed one would
		// reset a scaled-out fleet to it on each deploy. Without it, CloudFormation
		// creates the service with one task and leaves the count alone on updates;
		// registering the scalable target below (MinCapacity = desiredCount) then
		// raises an active service into its [min, max] range at once
		// (Application Auto Scaling, RegisterScalableTarget).
		// Deploys start new tasks before stopping old ones, so capacity never dips
		// while the old tasks drain and hand their connections over.
		MinHealthyPercent: jsii.Number(100),
		MaxHealthyPercent: jsii.Number(200),
		CircuitBreaker:    &awsecs.DeploymentCircuitBreaker{Enable: jsii.Bool(true), Rollback: jsii.Bool(true)},
		SecurityGroups:    &[]awsec2.ISecurityGroup{p.sg},
		VpcSubnets:        p.subnets,
		AssignPublicIp:    jsii.Bool(false),
		PropagateTags:     awsecs.PropagatedTagSource_SERVICE,
	})

	scaling := service.AutoScaleTaskCount(&awsapplicationautoscaling.EnableScalingProps{
		MinCapacity: jsii.Number(float64(cfg.DesiredCount)),
		MaxCapacity: jsii.Number(float64(cfg.MaxCount)),
	})
	// Scaling out is cheap; scaling in makes a worker drain and hand over all its
	// connections, so it waits longer.
	scaleOut := awscdk.Duration_Minutes(jsii.Number(1))
	scaleIn := awscdk.Duration_Minutes(jsii.Number(10))
	scaling.ScaleOnCpuUtilization(jsii.String("Cpu"), &awsecs.CpuUtilizationScalingProps{
		TargetUtilizationPercent: jsii.Number(60), ScaleOutCooldown: scaleOut, ScaleInCooldown: scaleIn,
	})
	scaling.ScaleOnMemoryUtilization(jsii.String("Memory"), &awsecs.MemoryUtilizationScalingProps{
		TargetUtilizationPercent: jsii.Number(70), ScaleOutCooldown: scaleOut, ScaleInCooldown: scaleIn,
	})
	// Connections per task: each worker emits OwnedConnections (EMF, dimension
	// ServiceName = this service) every renew tick; the average over the service is
	// connections per task.
	scaling.ScaleToTrackCustomMetric(jsii.String("Connections"), &awsecs.TrackCustomMetricProps{
		Metric:           fleetMetric(p.serviceName, schema.MetricOwned, "Average", 1),
		TargetValue:      jsii.Number(cfg.ConnectionsTarget()),
		ScaleOutCooldown: scaleOut,
		ScaleInCooldown:  scaleIn,
	})
	return service
}

// workerLogDriver ships the worker container's stdout and stderr to logs.
//
// With a Kinesis sink the pipe carries diagnostics only, and a slow log pipeline must
// never block the process writing them: the driver runs non-blocking with a 25 MiB
// buffer, and drops lines when it is full.
//
// With the stdout sink the pipe carries the messages themselves, and the worker counts
// a batch delivered (and may checkpoint past it) once its write returns. A
// non-blocking driver would accept a write and then drop it from a full buffer, a
// silent loss. So the driver runs in blocking mode (the awslogs default): a full
// pipeline blocks the write, the worker's sink write timeout (SOCKFLEET_SINK_TIMEOUT)
// abandons it, the batch counts as failed and is retried (docs/SINKS.md). The cost
// is that log lines on stderr wait too while the pipeline is stalled. Even so the
// driver, not CloudWatch, acknowledges a line; the Kinesis sink acknowledges a record
// only once the stream stored it, and is why it is the default.
func workerLogDriver(logs awslogs.ILogGroup, stdoutSink bool) awsecs.LogDriver {
	props := &awsecs.AwsLogDriverProps{
		LogGroup:      logs,
		StreamPrefix:  jsii.String("worker"),
		Mode:          awsecs.AwsLogDriverMode_NON_BLOCKING,
		MaxBufferSize: awscdk.Size_Mebibytes(jsii.Number(25)),
	}
	if stdoutSink {
		props.Mode, props.MaxBufferSize = awsecs.AwsLogDriverMode_BLOCKING, nil
	}
	return awsecs.LogDriver_AwsLogs(props)
}

// reconcilerMetric is one of the reconciler's own metrics. It emits them without
// dimensions: the stack name is fixed, so there is one deployment per account and
// region.
func reconcilerMetric(name, stat string, minutes float64) awscloudwatch.Metric {
	return awscloudwatch.NewMetric(&awscloudwatch.MetricProps{
		Namespace:  jsii.String(schema.MetricNamespace),
		MetricName: jsii.String(name),
		Statistic:  jsii.String(stat),
		Period:     awscdk.Duration_Minutes(jsii.Number(minutes)),
	})
}

// fleetMetric is one of the workers' metrics, which carry the ServiceName dimension.
func fleetMetric(serviceName, name, stat string, minutes float64) awscloudwatch.Metric {
	return awscloudwatch.NewMetric(&awscloudwatch.MetricProps{
		Namespace:     jsii.String(schema.MetricNamespace),
		MetricName:    jsii.String(name),
		DimensionsMap: &map[string]*string{schema.MetricDimService: jsii.String(serviceName)},
		Statistic:     jsii.String(stat),
		Period:        awscdk.Duration_Minutes(jsii.Number(minutes)),
	})
}

// newAlarms defines the alarms, all notifying alarmTopic.
func newAlarms(stack awscdk.Stack, table awsdynamodb.TableV2, fn awslambda.Function, service awsecs.FargateService,
	cluster awsecs.ICluster, failures, alarmTopic awssns.ITopic, serviceName string) []awscloudwatch.IAlarm {
	var alarms []awscloudwatch.IAlarm
	add := func(id string, props *awscloudwatch.AlarmProps) {
		a := awscloudwatch.NewAlarm(stack, jsii.String(id+"Alarm"), props)
		a.AddAlarmAction(awscloudwatchactions.NewSnsAction(alarmTopic))
		alarms = append(alarms, a)
	}

	// STARTED connections without a live owner for more than 2 minutes. The sweep
	// reports the age of the oldest orphan, which says "for how long" directly;
	// a count of orphans above zero on consecutive sweeps could be different
	// connections each time (normal churn during a deploy) and alarm falsely.
	// Missing data breaches: a silent sweep means nobody is looking. 2 of 3
	// minutes, so one sweep landing in the next minute's bucket is no alarm.
	add("OrphanedConnections", &awscloudwatch.AlarmProps{
		AlarmDescription:   jsii.String("A STARTED connection has had no live owner for more than 2 minutes, or the sweep stopped reporting."),
		Metric:             reconcilerMetric(schema.MetricOrphanedOldest, "Maximum", 1),
		Threshold:          jsii.Number(120),
		ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_THRESHOLD,
		EvaluationPeriods:  jsii.Number(3),
		DatapointsToAlarm:  jsii.Number(2),
		TreatMissingData:   awscloudwatch.TreatMissingData_BREACHING,
	})
	add("ReconcilerErrors", &awscloudwatch.AlarmProps{
		AlarmDescription: jsii.String("The reconciler failed whole invocations (per-record failures are retried and reported separately)."),
		Metric: fn.MetricErrors(&awscloudwatch.MetricOptions{
			Statistic: jsii.String("Sum"), Period: awscdk.Duration_Minutes(jsii.Number(5)),
		}),
		Threshold:          jsii.Number(1),
		ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
		EvaluationPeriods:  jsii.Number(1),
		TreatMissingData:   awscloudwatch.TreatMissingData_NOT_BREACHING,
	})
	// Throttled invocations delay wakeups (stream batches wait and retry) and sweeps.
	add("ReconcilerThrottles", &awscloudwatch.AlarmProps{
		AlarmDescription: jsii.String("The reconciler was throttled: wakeups and sweeps are delayed (check the account's Lambda concurrency)."),
		Metric: fn.MetricThrottles(&awscloudwatch.MetricOptions{
			Statistic: jsii.String("Sum"), Period: awscdk.Duration_Minutes(jsii.Number(5)),
		}),
		Threshold:          jsii.Number(1),
		ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
		EvaluationPeriods:  jsii.Number(1),
		TreatMissingData:   awscloudwatch.TreatMissingData_NOT_BREACHING,
	})
	// Fewer workers running than ECS wants, for 5 minutes in a row: tasks that fail
	// to start or keep crashing (image pull, secrets, health check). A scale-out or a
	// deploy closes the gap within a minute or two. Container Insights (enabled on
	// the cluster) publishes both counts per service, every minute.
	taskCount := func(name string) awscloudwatch.IMetric {
		return awscloudwatch.NewMetric(&awscloudwatch.MetricProps{
			Namespace:  jsii.String("ECS/ContainerInsights"),
			MetricName: jsii.String(name),
			DimensionsMap: &map[string]*string{
				"ClusterName": cluster.ClusterName(),
				"ServiceName": service.ServiceName(),
			},
			Statistic: jsii.String("Average"),
			Period:    awscdk.Duration_Minutes(jsii.Number(1)),
		})
	}
	add("WorkersBelowDesired", &awscloudwatch.AlarmProps{
		AlarmDescription: jsii.String("Fewer worker tasks are running than the service wants, for 5 minutes: tasks fail to start or keep stopping."),
		Metric: awscloudwatch.NewMathExpression(&awscloudwatch.MathExpressionProps{
			Expression: jsii.String("desired - running"),
			UsingMetrics: &map[string]awscloudwatch.IMetric{
				"desired": taskCount("DesiredTaskCount"),
				"running": taskCount("RunningTaskCount"),
			},
			Label:  jsii.String("worker tasks missing"),
			Period: awscdk.Duration_Minutes(jsii.Number(1)),
		}),
		Threshold:          jsii.Number(0),
		ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_THRESHOLD,
		EvaluationPeriods:  jsii.Number(5),
		DatapointsToAlarm:  jsii.Number(5),
		TreatMissingData:   awscloudwatch.TreatMissingData_NOT_BREACHING,
	})
	// Stream lag is failover latency: a minute behind for 3 minutes is an incident.
	add("StreamIteratorAge", &awscloudwatch.AlarmProps{
		AlarmDescription: jsii.String("The reconciler is more than a minute behind the table's stream."),
		Metric: fn.Metric(jsii.String("IteratorAge"), &awscloudwatch.MetricOptions{
			Statistic: jsii.String("Maximum"), Period: awscdk.Duration_Minutes(jsii.Number(1)),
		}),
		Threshold:          jsii.Number(60_000), // milliseconds
		ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_THRESHOLD,
		EvaluationPeriods:  jsii.Number(3),
		TreatMissingData:   awscloudwatch.TreatMissingData_NOT_BREACHING,
	})
	// A worker self-fences only when it could not renew for the renew deadline: a
	// partition, a hung process or DynamoDB trouble. Any occurrence is worth a look.
	add("SelfFences", &awscloudwatch.AlarmProps{
		AlarmDescription:   jsii.String("Workers stopped streaming connections because they could not renew their leases."),
		Metric:             fleetMetric(serviceName, schema.MetricSelfFences, "Sum", 5),
		Threshold:          jsii.Number(1),
		ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
		EvaluationPeriods:  jsii.Number(1),
		TreatMissingData:   awscloudwatch.TreatMissingData_NOT_BREACHING,
	})
	// A connection that has received no data message for its idle_timeout (the fleet's
	// SOCKFLEET_IDLE_TIMEOUT when the item sets none): an upstream that went quiet, or
	// a resume point it never reaches. The worker reports its count every renew
	// interval; the fleet's Maximum above zero for 3 minutes in a row is a connection
	// that stays idle (one that resumes clears its count at once). Missing data is no
	// alarm: no workers means nothing idle, and the orphan alarm watches for that.
	add("IdleConnections", &awscloudwatch.AlarmProps{
		AlarmDescription:   jsii.String("A connection has received no data for its idle_timeout (status idle) for 3 minutes: the upstream went quiet or never reaches the resume point."),
		Metric:             fleetMetric(serviceName, schema.MetricIdle, "Maximum", 1),
		Threshold:          jsii.Number(0),
		ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_THRESHOLD,
		EvaluationPeriods:  jsii.Number(3),
		DatapointsToAlarm:  jsii.Number(3),
		TreatMissingData:   awscloudwatch.TreatMissingData_NOT_BREACHING,
	})
	add("FailedStreamBatches", &awscloudwatch.AlarmProps{
		AlarmDescription: jsii.String("The reconciler gave up on stream records; the sweep repairs ownership, but find out why."),
		Metric: failures.Metric(jsii.String("NumberOfMessagesPublished"), &awscloudwatch.MetricOptions{
			Statistic: jsii.String("Sum"), Period: awscdk.Duration_Minutes(jsii.Number(5)),
		}),
		Threshold:          jsii.Number(1),
		ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
		EvaluationPeriods:  jsii.Number(1),
		TreatMissingData:   awscloudwatch.TreatMissingData_NOT_BREACHING,
	})
	return alarms
}

func newDashboard(stack awscdk.Stack, table awsdynamodb.TableV2, fn awslambda.Function, service awsecs.FargateService,
	alarms []awscloudwatch.IAlarm, serviceName string) {
	alarmRefs := make([]interfacesawscloudwatch.IAlarmRef, len(alarms))
	for i, a := range alarms {
		alarmRefs[i] = a
	}
	graph := func(title string, metrics ...awscloudwatch.IMetric) awscloudwatch.IWidget {
		return awscloudwatch.NewGraphWidget(&awscloudwatch.GraphWidgetProps{
			Title: jsii.String(title), Left: &metrics, Width: jsii.Number(8), Height: jsii.Number(6),
		})
	}
	lambdaMetric := func(name, stat string) awscloudwatch.IMetric {
		return fn.Metric(jsii.String(name), &awscloudwatch.MetricOptions{
			Statistic: jsii.String(stat), Period: awscdk.Duration_Minutes(jsii.Number(1)),
		})
	}
	dash := awscloudwatch.NewDashboard(stack, jsii.String("Dashboard"), &awscloudwatch.DashboardProps{
		DefaultInterval: awscdk.Duration_Hours(jsii.Number(3)),
	})
	dash.AddWidgets(
		graph("Connections per worker",
			fleetMetric(serviceName, schema.MetricOwned, "Average", 1),
			fleetMetric(serviceName, schema.MetricOwned, "Maximum", 1)),
		graph("Orphaned connections",
			reconcilerMetric(schema.MetricOrphaned, "Maximum", 1),
			reconcilerMetric(schema.MetricOrphanedOldest, "Maximum", 1)),
		graph("Worker trouble",
			fleetMetric(serviceName, schema.MetricSelfFences, "Sum", 1),
			fleetMetric(serviceName, schema.MetricRenewFailures, "Sum", 1),
			reconcilerMetric(schema.MetricWakeupsUndelivered, "Sum", 1)),
	)
	dash.AddWidgets(
		graph("Reconciler", lambdaMetric("Invocations", "Sum"), lambdaMetric("Errors", "Sum"), lambdaMetric("Throttles", "Sum")),
		graph("Reconciler duration and stream lag (ms)", lambdaMetric("Duration", "p99"), lambdaMetric("IteratorAge", "Maximum")),
		graph("Table writes (WCU)", table.MetricConsumedWriteCapacityUnits(&awscloudwatch.MetricOptions{
			Statistic: jsii.String("Sum"), Period: awscdk.Duration_Minutes(jsii.Number(1)),
		})),
	)
	dash.AddWidgets(
		graph("Idle and quota-waiting connections (worker maximum)",
			fleetMetric(serviceName, schema.MetricIdle, "Maximum", 1),
			fleetMetric(serviceName, schema.MetricQuotaWaiting, "Maximum", 1)),
	)
	dash.AddWidgets(
		graph("Worker CPU and memory (%)", service.MetricCpuUtilization(nil), service.MetricMemoryUtilization(nil)),
		awscloudwatch.NewAlarmStatusWidget(&awscloudwatch.AlarmStatusWidgetProps{
			Title: jsii.String("Alarms"), Alarms: &alarmRefs, Width: jsii.Number(16), Height: jsii.Number(6),
		}),
	)
}

// seconds renders a whole number of seconds as a Go duration string.
func seconds(n int) string { return fmt.Sprintf("%ds", n) }

// retentionEnum maps validated retention days (Config.Validate) to the CDK enum.
var retentionEnum = map[int]awslogs.RetentionDays{
	1: awslogs.RetentionDays_ONE_DAY, 3: awslogs.RetentionDays_THREE_DAYS, 5: awslogs.RetentionDays_FIVE_DAYS,
	7: awslogs.RetentionDays_ONE_WEEK, 14: awslogs.RetentionDays_TWO_WEEKS, 30: awslogs.RetentionDays_ONE_MONTH,
	60: awslogs.RetentionDays_TWO_MONTHS, 90: awslogs.RetentionDays_THREE_MONTHS, 120: awslogs.RetentionDays_FOUR_MONTHS,
	150: awslogs.RetentionDays_FIVE_MONTHS, 180: awslogs.RetentionDays_SIX_MONTHS, 365: awslogs.RetentionDays_ONE_YEAR,
	400: awslogs.RetentionDays_THIRTEEN_MONTHS, 545: awslogs.RetentionDays_EIGHTEEN_MONTHS, 731: awslogs.RetentionDays_TWO_YEARS,
	1096: awslogs.RetentionDays_THREE_YEARS, 1827: awslogs.RetentionDays_FIVE_YEARS, 2192: awslogs.RetentionDays_SIX_YEARS,
	2557: awslogs.RetentionDays_SEVEN_YEARS, 2922: awslogs.RetentionDays_EIGHT_YEARS, 3288: awslogs.RetentionDays_NINE_YEARS,
	3653: awslogs.RetentionDays_TEN_YEARS,
}
