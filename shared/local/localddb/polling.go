package localddb

import (
	"context"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/schema"
)

// EnsurePollingIndex adds the seed's index (schema.PollingIndex) to table if it is
// missing, and waits until it is active. Only polling mode needs it; stream mode
// never creates it, because every heartbeat would write it twice.
func EnsurePollingIndex(ctx context.Context, db *dynamodb.Client, table string) error {
	ix := schema.PollingIndex
	active := func() (exists, ready bool, err error) {
		out, err := db.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: &table})
		if err != nil {
			return false, false, fmt.Errorf("describe table %s: %w", table, err)
		}
		for _, g := range out.Table.GlobalSecondaryIndexes {
			if aws.ToString(g.IndexName) == ix.Name {
				return true, g.IndexStatus == types.IndexStatusActive || g.IndexStatus == "", nil
			}
		}
		return false, false, nil
	}
	exists, ready, err := active()
	if err != nil || ready {
		return err
	}
	if !exists {
		_, err = db.UpdateTable(ctx, &dynamodb.UpdateTableInput{
			TableName: &table,
			AttributeDefinitions: []types.AttributeDefinition{
				{AttributeName: aws.String(ix.PartitionKey), AttributeType: types.ScalarAttributeTypeS},
				{AttributeName: aws.String(ix.SortKey), AttributeType: types.ScalarAttributeTypeN},
			},
			GlobalSecondaryIndexUpdates: []types.GlobalSecondaryIndexUpdate{{Create: &types.CreateGlobalSecondaryIndexAction{
				IndexName: aws.String(ix.Name),
				KeySchema: []types.KeySchemaElement{
					{AttributeName: aws.String(ix.PartitionKey), KeyType: types.KeyTypeHash},
					{AttributeName: aws.String(ix.SortKey), KeyType: types.KeyTypeRange},
				},
				Projection: &types.Projection{ProjectionType: types.ProjectionTypeKeysOnly},
			}}},
		})
		if err != nil {
			return fmt.Errorf("add index %s to %s: %w", ix.Name, table, err)
		}
	}
	for deadline := time.Now().Add(5 * time.Minute); time.Now().Before(deadline); {
		if _, ready, err := active(); err != nil || ready {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	return fmt.Errorf("index %s on %s did not become active", ix.Name, table)
}
