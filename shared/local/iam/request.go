package iam

import (
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// Keys of a table as the request mapping needs them: the partition key attribute of
// the table and of each index, for dynamodb:LeadingKeys.
type TableKeys struct {
	PartitionKey string
	Indexes      map[string]string // index name -> partition key attribute
}

// TableKeys reads the key schema of the table with this logical id.
func (t *Template) TableKeys(id string) (TableKeys, error) {
	r, ok := t.Resources[id]
	if !ok || (r.Type != "AWS::DynamoDB::GlobalTable" && r.Type != "AWS::DynamoDB::Table") {
		return TableKeys{}, fmt.Errorf("table keys: %s is not a DynamoDB table of the template", id)
	}
	hash := func(schema any) string {
		list, _ := schema.([]any)
		for _, k := range list {
			if m, _ := k.(map[string]any); m["KeyType"] == "HASH" {
				s, _ := m["AttributeName"].(string)
				return s
			}
		}
		return ""
	}
	k := TableKeys{PartitionKey: hash(r.Properties["KeySchema"]), Indexes: map[string]string{}}
	gsis, _ := r.Properties["GlobalSecondaryIndexes"].([]any)
	lsis, _ := r.Properties["LocalSecondaryIndexes"].([]any)
	for _, g := range append(gsis, lsis...) {
		m, _ := g.(map[string]any)
		name, _ := m["IndexName"].(string)
		k.Indexes[name] = hash(m["KeySchema"])
	}
	if k.PartitionKey == "" {
		return k, fmt.Errorf("table keys: %s has no HASH key", id)
	}
	return k, nil
}

// call is what one request asks: one or more authorization requests (a batch or a
// transaction asks one per table and action), all of which must be allowed.
type call struct {
	service string // dynamodb or kinesis
	op      string
	reqs    []Request
}

// Mapper turns engine requests into authorization requests.
type Mapper struct {
	Env Env
	// Tables gives the key schema of a local table by name, for
	// dynamodb:LeadingKeys; a table missing here has unknown leading keys.
	Tables map[string]TableKeys
	// StreamARN returns the ARN of a table's stream, for ListStreams; nil or "":
	// the table's ARN + "/stream/*".
	StreamARN func(table string) string
}

type attr = map[string]json.RawMessage

// dynamoBody is the union of the request fields the mapping reads.
type dynamoBody struct {
	TableName, IndexName, StreamArn, ShardIterator string
	Key, Item                                      map[string]attr
	RequestItems                                   map[string]json.RawMessage
	TransactItems                                  []map[string]json.RawMessage
	KeyConditionExpression                         string
	ExpressionAttributeNames                       map[string]string
	ExpressionAttributeValues                      map[string]attr
	// Kinesis
	StreamName, StreamARN string
}

func (m *Mapper) tableARN(name string) string { return m.Env.arn("dynamodb", "table/"+name) }

// dynamo maps a DynamoDB or DynamoDB Streams call. streamOf resolves a shard
// iterator to the stream it reads.
func (m *Mapper) dynamo(op string, body []byte, streamOf func(iter string) (string, bool)) (call, error) {
	c := call{service: "dynamodb", op: op}
	var b dynamoBody
	if len(body) > 0 {
		if err := json.Unmarshal(body, &b); err != nil {
			return c, fmt.Errorf("%s: decode request: %w", op, err)
		}
	}
	one := func(action, resource string, ctx map[string][]string, unknown ...string) {
		c.reqs = append(c.reqs, Request{Action: "dynamodb:" + action, Resources: []string{resource}, Context: ctx, Unknown: unknown})
	}
	table := func() (string, error) {
		if b.TableName == "" {
			return "", fmt.Errorf("%s: no TableName", op)
		}
		arn := m.tableARN(b.TableName)
		if b.IndexName != "" {
			arn += "/index/" + b.IndexName
		}
		return arn, nil
	}
	switch op {
	case "GetItem", "PutItem", "UpdateItem", "DeleteItem":
		arn, err := table()
		if err != nil {
			return c, err
		}
		item := b.Key
		if op == "PutItem" {
			item = b.Item
		}
		ctx, unknown := m.leading(b.TableName, item)
		one(op, arn, ctx, unknown...)
	case "Query":
		arn, err := table()
		if err != nil {
			return c, err
		}
		ctx, unknown := m.queryLeading(b)
		one(op, arn, ctx, unknown...)
	case "BatchGetItem", "BatchWriteItem":
		names := make([]string, 0, len(b.RequestItems))
		for name := range b.RequestItems {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			var items []map[string]attr
			if op == "BatchGetItem" {
				var ka struct{ Keys []map[string]attr }
				if err := json.Unmarshal(b.RequestItems[name], &ka); err != nil {
					return c, fmt.Errorf("%s: RequestItems[%s]: %w", op, name, err)
				}
				items = ka.Keys
			} else {
				var ws []struct {
					PutRequest    *struct{ Item map[string]attr }
					DeleteRequest *struct{ Key map[string]attr }
				}
				if err := json.Unmarshal(b.RequestItems[name], &ws); err != nil {
					return c, fmt.Errorf("%s: RequestItems[%s]: %w", op, name, err)
				}
				for _, w := range ws {
					if w.PutRequest != nil {
						items = append(items, w.PutRequest.Item)
					}
					if w.DeleteRequest != nil {
						items = append(items, w.DeleteRequest.Key)
					}
				}
			}
			ctx, unknown := m.leading(name, items...)
			one(op, m.tableARN(name), ctx, unknown...)
		}
	case "TransactWriteItems", "TransactGetItems":
		// No IAM action of their own: each item asks for the action it performs.
		actions := map[string]string{"Put": "PutItem", "Update": "UpdateItem", "Delete": "DeleteItem", "ConditionCheck": "ConditionCheckItem", "Get": "GetItem"}
		for i, ti := range b.TransactItems {
			for kind, raw := range ti {
				action, ok := actions[kind]
				if !ok {
					return c, fmt.Errorf("%s: item %d: unknown kind %s", op, i, kind)
				}
				var x struct {
					TableName string
					Key, Item map[string]attr
				}
				if err := json.Unmarshal(raw, &x); err != nil {
					return c, fmt.Errorf("%s: item %d: %w", op, i, err)
				}
				item := x.Key
				if kind == "Put" {
					item = x.Item
				}
				ctx, unknown := m.leading(x.TableName, item)
				one(action, m.tableARN(x.TableName), ctx, unknown...)
			}
		}
	case "DescribeStream", "GetShardIterator":
		if b.StreamArn == "" {
			return c, fmt.Errorf("%s: no StreamArn", op)
		}
		one(op, b.StreamArn, nil)
	case "GetRecords":
		arn, ok := streamOf(b.ShardIterator)
		if !ok {
			return c, fmt.Errorf("GetRecords: a shard iterator this proxy did not hand out; its stream is unknown")
		}
		one(op, arn, nil)
	case "ListStreams":
		res := "*"
		if b.TableName != "" {
			res = m.tableARN(b.TableName) + "/stream/*"
			if m.StreamARN != nil {
				if a := m.StreamARN(b.TableName); a != "" {
					res = a
				}
			}
		}
		one(op, res, nil)
	case "ListTables", "DescribeLimits", "DescribeEndpoints":
		one(op, "*", nil)
	case "ExecuteStatement", "BatchExecuteStatement", "ExecuteTransaction":
		return c, fmt.Errorf("%s: PartiQL is not mapped to IAM actions locally", op)
	default:
		// Table-level operations (DescribeTable, CreateTable, UpdateTimeToLive, ...).
		arn, err := table()
		if err != nil {
			return c, err
		}
		one(op, arn, nil)
	}
	return c, nil
}

// leading computes dynamodb:LeadingKeys from items' keys. An item without the
// partition key, or a table whose keys are unknown, makes the key unknown.
func (m *Mapper) leading(table string, items ...map[string]attr) (map[string][]string, []string) {
	const key = "dynamodb:leadingkeys"
	tk, ok := m.Tables[table]
	if !ok {
		return nil, []string{key}
	}
	pk := tk.PartitionKey
	var vals []string
	for _, it := range items {
		v, ok := scalar(it[pk])
		if !ok {
			return nil, []string{key}
		}
		if !contains(vals, v) {
			vals = append(vals, v)
		}
	}
	return map[string][]string{key: vals}, nil
}

// equality of the partition key in a KeyConditionExpression: `name = :value`.
var keyEq = regexp.MustCompile(`(#?[A-Za-z0-9_.-]+)\s*=\s*(:[A-Za-z0-9_]+)`)

func (m *Mapper) queryLeading(b dynamoBody) (map[string][]string, []string) {
	const key = "dynamodb:leadingkeys"
	tk, ok := m.Tables[b.TableName]
	if !ok {
		return nil, []string{key}
	}
	pk := tk.PartitionKey
	if b.IndexName != "" {
		if pk, ok = tk.Indexes[b.IndexName]; !ok {
			return nil, []string{key}
		}
	}
	for _, sm := range keyEq.FindAllStringSubmatch(b.KeyConditionExpression, -1) {
		name := sm[1]
		if strings.HasPrefix(name, "#") {
			name = b.ExpressionAttributeNames[name]
		}
		if name != pk {
			continue
		}
		if v, ok := scalar(b.ExpressionAttributeValues[sm[2]]); ok {
			return map[string][]string{key: {v}}, nil
		}
	}
	return nil, []string{key}
}

// scalar is the string form of an S, N or B attribute value.
func scalar(a attr) (string, bool) {
	for _, t := range []string{"S", "N", "B"} {
		if raw, ok := a[t]; ok {
			var s string
			if json.Unmarshal(raw, &s) == nil {
				return s, true
			}
		}
	}
	return "", false
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// kinesis maps a Kinesis call.
func (m *Mapper) kinesis(op string, body []byte, streamOf func(iter string) (string, bool)) (call, error) {
	c := call{service: "kinesis", op: op}
	var b dynamoBody
	if len(body) > 0 {
		if err := json.Unmarshal(body, &b); err != nil {
			return c, fmt.Errorf("kinesis %s: decode request: %w", op, err)
		}
	}
	res := b.StreamARN
	switch {
	case res != "":
	case op == "GetRecords":
		arn, ok := streamOf(b.ShardIterator)
		if !ok {
			return c, fmt.Errorf("kinesis GetRecords: a shard iterator this proxy did not hand out; its stream is unknown")
		}
		res = arn
	case b.StreamName != "":
		res = m.Env.arn("kinesis", "stream/"+b.StreamName)
	case op == "ListStreams" || op == "DescribeLimits" || op == "DescribeAccountSettings":
		res = "*"
	default:
		return c, fmt.Errorf("kinesis %s: no StreamName or StreamARN", op)
	}
	c.reqs = []Request{{Action: "kinesis:" + op, Resources: []string{res}}}
	return c, nil
}
