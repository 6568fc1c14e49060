// Package localddb is what local runs, tests and benchmarks do to DynamoDB and
// deployed code never does: create the table from the shared schema (on AWS the CDK
// stack creates it), add the seed's polling index (polling mode's prerequisite), and
// meter the capacity units a client is billed for.
//
// Guarantees: EnsureTable and EnsurePollingIndex are idempotent and return once the
// table or index is active. Not guaranteed: that a table created here matches the
// deployed one beyond what shared/schema describes (point-in-time recovery, deletion
// protection and the like are the CDK stack's).
package localddb

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/schema"
)

// CreateTableInput renders schema.Table as a CreateTable call for table name.
func CreateTableInput(name string) *dynamodb.CreateTableInput {
	def := schema.Table
	in := &dynamodb.CreateTableInput{
		TableName:   aws.String(name),
		BillingMode: types.BillingModePayPerRequest,
		KeySchema:   []types.KeySchemaElement{{AttributeName: aws.String(def.PartitionKey), KeyType: types.KeyTypeHash}},
		StreamSpecification: &types.StreamSpecification{
			StreamEnabled:  aws.Bool(true),
			StreamViewType: types.StreamViewType(def.StreamView),
		},
	}
	for _, ix := range def.Indexes {
		in.GlobalSecondaryIndexes = append(in.GlobalSecondaryIndexes, types.GlobalSecondaryIndex{
			IndexName:  aws.String(ix.Name),
			KeySchema:  []types.KeySchemaElement{{AttributeName: aws.String(ix.PartitionKey), KeyType: types.KeyTypeHash}},
			Projection: &types.Projection{ProjectionType: types.ProjectionType(ix.Projection)},
		})
	}
	in.AttributeDefinitions = append(in.AttributeDefinitions, types.AttributeDefinition{
		AttributeName: aws.String(def.PartitionKey), AttributeType: types.ScalarAttributeTypeS})
	for _, ix := range def.Indexes {
		if ix.PartitionKey == def.PartitionKey {
			continue
		}
		in.AttributeDefinitions = append(in.AttributeDefinitions, types.AttributeDefinition{
			AttributeName: aws.String(ix.PartitionKey), AttributeType: types.ScalarAttributeTypeS})
	}
	return in
}

// EnsureTable creates table name from the schema if it does not exist, waits until
// it is active, and turns TTL on. It reports whether it created the table.
func EnsureTable(ctx context.Context, db *dynamodb.Client, name string) (bool, error) {
	_, err := db.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(name)})
	if err == nil {
		return false, nil
	}
	var nf *types.ResourceNotFoundException
	if !errors.As(err, &nf) {
		return false, fmt.Errorf("describe table %s: %w", name, err)
	}
	if _, err := db.CreateTable(ctx, CreateTableInput(name)); err != nil {
		var inUse *types.ResourceInUseException
		if errors.As(err, &inUse) {
			return false, nil // created concurrently
		}
		return false, fmt.Errorf("create table %s: %w", name, err)
	}
	w := dynamodb.NewTableExistsWaiter(db, func(o *dynamodb.TableExistsWaiterOptions) {
		o.MinDelay, o.MaxDelay = 20*time.Millisecond, time.Second
	})
	if err := w.Wait(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(name)}, time.Minute); err != nil {
		return true, fmt.Errorf("wait for table %s: %w", name, err)
	}
	_, err = db.UpdateTimeToLive(ctx, &dynamodb.UpdateTimeToLiveInput{
		TableName: aws.String(name),
		TimeToLiveSpecification: &types.TimeToLiveSpecification{
			AttributeName: aws.String(schema.Table.TTLAttribute), Enabled: aws.Bool(true)},
	})
	if err != nil {
		return true, fmt.Errorf("enable TTL on %s: %w", name, err)
	}
	return true, nil
}
