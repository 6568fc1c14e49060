package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	"github.com/sockfleet/sockfleet/shared/registry"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

// DynamoDB is the part of the SDK client the CLI uses.
type DynamoDB interface {
	PutItem(context.Context, *dynamodb.PutItemInput, ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error)
	UpdateItem(context.Context, *dynamodb.UpdateItemInput, ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
	DeleteItem(context.Context, *dynamodb.DeleteItemInput, ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error)
	Scan(context.Context, *dynamodb.ScanInput, ...func(*dynamodb.Options)) (*dynamodb.ScanOutput, error)
	Query(context.Context, *dynamodb.QueryInput, ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error)
	BatchGetItem(context.Context, *dynamodb.BatchGetItemInput, ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error)
}

type cli struct {
	db    DynamoDB
	table string
	out   io.Writer
	now   func() time.Time
}

// add is the console's "Create item" with Pk, desired_state and ws_url; it refuses
// to overwrite an existing connection.
func (c *cli) add(ctx context.Context, id, url string, stopped bool, spec schema.Spec) error {
	if err := schema.ValidateID(id); err != nil {
		return err
	}
	if err := schema.ValidateURL(url); err != nil {
		return err
	}
	state := schema.Started
	if stopped {
		state = schema.Stopped
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	_, err := c.db.PutItem(ctx, &dynamodb.PutItemInput{
		TableName:                &c.table,
		Item:                     codec.EncodeConnection(codec.Connection{ID: id, DesiredState: state, WSURL: url, Spec: spec}),
		ConditionExpression:      aws.String("attribute_not_exists(#pk)"),
		ExpressionAttributeNames: map[string]string{"#pk": schema.AttrPK},
	})
	if isCondFailed(err) {
		return fmt.Errorf("connection %s already exists", id)
	}
	if err != nil {
		return explain(err, c.table)
	}
	fmt.Fprintf(c.out, "added %s (%s) -> %s%s\n", id, state, url, describeSpec(spec))
	return nil
}

// setState is the console edit of one attribute, desired_state, on CONN#<id>.
func (c *cli) setState(ctx context.Context, id string, state schema.State) error {
	return c.set(ctx, id, schema.AttrDesiredState, string(state))
}

// setURL is the console edit of ws_url on CONN#<id>.
func (c *cli) setURL(ctx context.Context, id, url string) error {
	if err := schema.ValidateURL(url); err != nil {
		return err
	}
	return c.set(ctx, id, schema.AttrWSURL, url)
}

func (c *cli) set(ctx context.Context, id, attr, value string) error {
	if err := schema.ValidateID(id); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	_, err := c.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 &c.table,
		Key:                       connKey(id),
		UpdateExpression:          aws.String("SET #a = :v"),
		ConditionExpression:       aws.String("attribute_exists(#pk)"),
		ExpressionAttributeNames:  map[string]string{"#a": attr, "#pk": schema.AttrPK},
		ExpressionAttributeValues: map[string]types.AttributeValue{":v": codec.S(value)},
	})
	if isCondFailed(err) {
		return fmt.Errorf("no connection %s", id)
	}
	if err != nil {
		return explain(err, c.table)
	}
	fmt.Fprintf(c.out, "%s: %s = %s\n", id, attr, value)
	return nil
}

// remove is the console's "Delete item" on CONN#<id>.
func (c *cli) remove(ctx context.Context, id string) error {
	if err := schema.ValidateID(id); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	_, err := c.db.DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName:                &c.table,
		Key:                      connKey(id),
		ConditionExpression:      aws.String("attribute_exists(#pk)"),
		ExpressionAttributeNames: map[string]string{"#pk": schema.AttrPK},
	})
	if isCondFailed(err) {
		return fmt.Errorf("no connection %s", id)
	}
	if err != nil {
		return explain(err, c.table)
	}
	fmt.Fprintf(c.out, "removed %s\n", id)
	return nil
}

// row is one connection as listed, decoded or not.
type row struct {
	c   codec.Connection
	err error
}

func (c *cli) connections(ctx context.Context) ([]row, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var rows []row
	var start map[string]types.AttributeValue
	for {
		out, err := c.db.Scan(ctx, &dynamodb.ScanInput{
			TableName:                 &c.table,
			FilterExpression:          aws.String("begins_with(#pk, :p)"),
			ExpressionAttributeNames:  map[string]string{"#pk": schema.AttrPK},
			ExpressionAttributeValues: map[string]types.AttributeValue{":p": codec.S(schema.ConnPrefix)},
			ExclusiveStartKey:         start,
		})
		if err != nil {
			return nil, explain(err, c.table)
		}
		for _, it := range out.Items {
			conn, err := codec.DecodeConnection(it)
			rows = append(rows, row{conn, err})
		}
		if len(out.LastEvaluatedKey) == 0 {
			break
		}
		start = out.LastEvaluatedKey
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].c.ID < rows[j].c.ID })
	return rows, nil
}

func (c *cli) listConns(ctx context.Context) error {
	rows, err := c.connections(ctx)
	if err != nil {
		return err
	}
	c.printConns(rows)
	return nil
}

func (c *cli) printConns(rows []row) {
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tDESIRED\tOWNER\tLEASE LEFT\tVERSION\tLAST_SEQ\tSTATUS")
	now := c.now().UnixMilli()
	for _, r := range rows {
		owner, left := "-", "-"
		if r.c.Owned() {
			owner = r.c.LeaseOwner
			left = (time.Duration(r.c.LeaseExpiresAtMs-now) * time.Millisecond).Round(time.Second).String()
			if r.c.LeaseExpiresAtMs == schema.LeaseHeldByMember {
				left = "member" // stream mode: as long as the owner's membership
			}
		}
		status := r.c.Status
		if r.c.StatusError != "" {
			status += ": " + r.c.StatusError
		}
		if r.err != nil {
			status = "INVALID: " + r.err.Error()
		}
		desired := string(r.c.DesiredState)
		if desired == "" {
			desired = "?"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\n", r.c.ID, desired, owner, left, r.c.LeaseVersion, r.c.LastSeq, clip(status, 80))
	}
	tw.Flush()
}

func (c *cli) listWorkers(ctx context.Context) error {
	ws, bad, err := (&registry.Registry{DB: c.db, Table: c.table}).List(ctx)
	if err != nil {
		return explain(err, c.table)
	}
	c.printWorkers(ws, bad)
	return nil
}

func (c *cli) printWorkers(ws []codec.Worker, bad []error) {
	sort.Slice(ws, func(i, j int) bool { return ws[i].ID < ws[j].ID })
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "WORKER\tADDRESS\tLOAD/CAP\tDRAINING\tHEARTBEAT")
	now := c.now().UnixMilli()
	for _, w := range ws {
		hb := "expires in " + (time.Duration(w.HeartbeatExpiresAtMs-now) * time.Millisecond).Round(time.Second).String()
		if !w.Live(now) {
			hb = "LAPSED " + (time.Duration(now-w.HeartbeatExpiresAtMs) * time.Millisecond).Round(time.Second).String() + " ago"
		}
		if w.Dead() {
			hb = "DEAD (declared " + (time.Duration(now-w.DeadAtMs) * time.Millisecond).Round(time.Second).String() + " ago)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d/%d\t%v\t%s\n", w.ID, w.Addr, w.Load, w.Capacity, w.Draining, hb)
	}
	tw.Flush()
	for _, e := range bad {
		fmt.Fprintln(c.out, "INVALID worker item:", e)
	}
}

func (c *cli) watch(ctx context.Context, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		rows, err := c.connections(ctx)
		if err != nil {
			return err
		}
		ws, bad, err := (&registry.Registry{DB: c.db, Table: c.table}).List(ctx)
		if err != nil {
			return explain(err, c.table)
		}
		fmt.Fprint(c.out, "\033[H\033[2J")
		fmt.Fprintf(c.out, "sockfleet  table %s  %s  (Ctrl-C to quit)\n\n", c.table, c.now().Format(time.TimeOnly))
		c.printConns(rows)
		fmt.Fprintln(c.out)
		c.printWorkers(ws, bad)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func connKey(id string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{schema.AttrPK: codec.S(schema.ConnKey(id))}
}

func isCondFailed(err error) bool {
	var ccf *types.ConditionalCheckFailedException
	return errors.As(err, &ccf)
}

// explain turns SDK errors into messages an operator can act on.
func explain(err error, table string) error {
	var nf *types.ResourceNotFoundException
	if errors.As(err, &nf) {
		return fmt.Errorf("table %s not found (set --table or %s)", table, schema.EnvTable)
	}
	var api smithy.APIError
	if errors.As(err, &api) {
		return fmt.Errorf("DynamoDB refused: %s: %s", api.ErrorCode(), api.ErrorMessage())
	}
	if errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "connect:") || strings.Contains(err.Error(), "dial tcp") {
		return fmt.Errorf("cannot reach DynamoDB (check AWS_REGION, AWS_ENDPOINT_URL_DYNAMODB, credentials): %w", err)
	}
	return err
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
