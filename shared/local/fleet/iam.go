package fleet

import (
	"context"
	"errors"
	"fmt"
	"github.com/sockfleet/sockfleet/shared/local/cdkout"
	"log/slog"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/sockfleet/sockfleet/shared/local/iam"
	"github.com/sockfleet/sockfleet/shared/schema"
)

// AdminKey is the access key id of the unrestricted local principal: the operator's
// CLI and the test harness, as an administrator would be in AWS.
const AdminKey = "local"

// IAMConfig says which template to enforce, and in front of which engines.
type IAMConfig struct {
	// Template is the synthesized template; nil loads the one cdkout.Find finds
	// from the working directory up (`make template` writes it).
	Template *iam.Template
	Endpoint string // the DynamoDB engine (with Streams)
	Table    string // the local table, which the template's table stands for
	// KinesisEndpoint, if set, is the Kinesis engine, and KinesisStream the local
	// stream the template's Kinesis stream (if any) stands for.
	KinesisEndpoint, KinesisStream string
	Log                            *slog.Logger
}

// IAM is the stack's IAM policies enforced in front of the local engines. Point every
// process at DynamoDBEndpoint (and KinesisEndpoint) and give Config the Keys: each
// process then runs as its role in the stack.
type IAM struct {
	DynamoDB, Kinesis *iam.Proxy
	Keys              Keys
	// Statements lists, by role logical id, the statements in force.
	Statements map[string][]iam.Statement
}

// Keys are the access key ids the fleet's processes sign with. Empty means AdminKey.
type Keys struct {
	Worker, Reconciler string
}

// LoadTemplate loads the synthesized template found from the working directory up.
func LoadTemplate() (*iam.Template, error) {
	path, err := cdkout.Find(".")
	if err != nil {
		return nil, err
	}
	return iam.LoadTemplate(path)
}

// EnforceIAM starts the enforcing proxies. The roles are found in the template: the
// worker runs as the task role of the task definition with the worker container;
// the reconciler (and the stream poller, which plays the event source mapping that
// reads the stream with the function's role) as the role of the function the
// table's stream feeds. Their access key ids are their roles' logical ids.
func EnforceIAM(ctx context.Context, c IAMConfig) (*IAM, error) {
	tpl := c.Template
	if tpl == nil {
		var err error
		if tpl, err = LoadTemplate(); err != nil {
			return nil, fmt.Errorf("enforce IAM: %w", err)
		}
	}
	tableID, err := tpl.Table()
	if err != nil {
		return nil, fmt.Errorf("enforce IAM: %w", err)
	}
	worker, err := tpl.TaskRole(schema.WorkerContainer)
	if err != nil {
		return nil, fmt.Errorf("enforce IAM: %w", err)
	}
	reconciler, err := tpl.StreamFunctionRole(tableID)
	if err != nil {
		return nil, fmt.Errorf("enforce IAM: %w", err)
	}
	keys, err := tpl.TableKeys(tableID)
	if err != nil {
		return nil, fmt.Errorf("enforce IAM: %w", err)
	}
	names := map[string]string{tableID: c.Table}
	if id, err := tpl.KinesisStream(); err != nil {
		return nil, fmt.Errorf("enforce IAM: %w", err)
	} else if id != "" && c.KinesisStream != "" {
		names[id] = c.KinesisStream
	}
	env := iam.Env{Partition: "aws", Account: LocalAccount, Region: LocalRegion, Names: names}
	// The table's stream as the engine names it, so GetAtt StreamArn is that stream.
	db := dynamodb.New(dynamodb.Options{
		Region: LocalRegion, BaseEndpoint: aws.String(c.Endpoint),
		Credentials: credentials.NewStaticCredentialsProvider(AdminKey, AdminKey, ""),
	})
	desc, err := db.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: &c.Table})
	if err != nil {
		return nil, fmt.Errorf("enforce IAM: describe table %s: %w", c.Table, err)
	}
	streamARN := aws.ToString(desc.Table.LatestStreamArn)
	if streamARN != "" {
		env.StreamARNs = map[string]string{tableID: streamARN}
	}
	out := &IAM{Keys: Keys{Worker: worker, Reconciler: reconciler}, Statements: map[string][]iam.Statement{}}
	roles := map[string]*iam.Policy{}
	for _, role := range []string{worker, reconciler} {
		p, err := tpl.Policy(role, env)
		if err != nil {
			return nil, fmt.Errorf("enforce IAM: %w", err)
		}
		roles[role] = p
		out.Statements[role] = p.Statements
	}
	mapper := &iam.Mapper{
		Env: env, Tables: map[string]iam.TableKeys{c.Table: keys},
		StreamARN: func(table string) string {
			if table == c.Table {
				return streamARN
			}
			return ""
		},
	}
	log := c.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	pc := iam.ProxyConfig{Mapper: mapper, Roles: roles, Admins: []string{AdminKey}, Log: log}
	pc.Target = c.Endpoint
	if out.DynamoDB, err = iam.NewProxy(pc); err != nil {
		return nil, fmt.Errorf("enforce IAM: %w", err)
	}
	if c.KinesisEndpoint != "" {
		pc.Target = c.KinesisEndpoint
		if out.Kinesis, err = iam.NewProxy(pc); err != nil {
			out.Close()
			return nil, fmt.Errorf("enforce IAM: %w", err)
		}
	}
	log.Info("enforcing the stack's IAM policies", "worker role", worker, "reconciler role", reconciler, "endpoint", out.DynamoDB.Endpoint())
	return out, nil
}

// Denials lists every call refused so far, on either engine.
func (i *IAM) Denials() []iam.Denial {
	var d []iam.Denial
	for _, p := range []*iam.Proxy{i.DynamoDB, i.Kinesis} {
		if p != nil {
			d = append(d, p.Denials()...)
		}
	}
	return d
}

// Close stops the proxies.
func (i *IAM) Close() error {
	var errs []error
	for _, p := range []*iam.Proxy{i.DynamoDB, i.Kinesis} {
		if p != nil {
			errs = append(errs, p.Close())
		}
	}
	return errors.Join(errs...)
}
