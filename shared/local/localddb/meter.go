package localddb

import (
	"context"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go/middleware"
)

// Meter counts the capacity units DynamoDB bills a client for, index writes included:
// it asks every call for ReturnConsumedCapacity=INDEXES and adds up the answers.
// Benchmarks use it to compare designs by what they cost, not by argument.
type Meter struct {
	mu     sync.Mutex
	read   float64
	write  float64
	byPart map[string]float64 // "table" or an index name -> units
}

// Option installs the meter on a client: dynamodb.NewFromConfig(cfg, m.Option).
func (m *Meter) Option(o *dynamodb.Options) {
	o.APIOptions = append(o.APIOptions, func(st *middleware.Stack) error {
		return st.Initialize.Add(middleware.InitializeMiddlewareFunc("sockfleetMeter", m.handle), middleware.After)
	})
}

// Units returns the read and write units counted so far.
func (m *Meter) Units() (read, write float64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.read, m.write
}

// Parts returns the units counted per table and per index.
func (m *Meter) Parts() map[string]float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]float64, len(m.byPart))
	for k, v := range m.byPart {
		out[k] = v
	}
	return out
}

// Reset zeroes the counters.
func (m *Meter) Reset() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.read, m.write, m.byPart = 0, 0, nil
}

func (m *Meter) handle(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
	const idx = types.ReturnConsumedCapacityIndexes
	write := true
	switch p := in.Parameters.(type) {
	case *dynamodb.GetItemInput:
		p.ReturnConsumedCapacity, write = idx, false
	case *dynamodb.QueryInput:
		p.ReturnConsumedCapacity, write = idx, false
	case *dynamodb.ScanInput:
		p.ReturnConsumedCapacity, write = idx, false
	case *dynamodb.PutItemInput:
		p.ReturnConsumedCapacity = idx
	case *dynamodb.UpdateItemInput:
		p.ReturnConsumedCapacity = idx
	case *dynamodb.DeleteItemInput:
		p.ReturnConsumedCapacity = idx
	}
	out, md, err := next.HandleInitialize(ctx, in)
	var cc *types.ConsumedCapacity
	switch r := out.Result.(type) {
	case *dynamodb.GetItemOutput:
		cc = r.ConsumedCapacity
	case *dynamodb.QueryOutput:
		cc = r.ConsumedCapacity
	case *dynamodb.ScanOutput:
		cc = r.ConsumedCapacity
	case *dynamodb.PutItemOutput:
		cc = r.ConsumedCapacity
	case *dynamodb.UpdateItemOutput:
		cc = r.ConsumedCapacity
	case *dynamodb.DeleteItemOutput:
		cc = r.ConsumedCapacity
	}
	// A failed conditional write is billed too, but the SDK returns no output for it;
	// count it as the 1 unit DynamoDB charges for a small item.
	if cc == nil && err != nil && write {
		cc = &types.ConsumedCapacity{CapacityUnits: aws.Float64(1), Table: &types.Capacity{CapacityUnits: aws.Float64(1)}}
	}
	if cc != nil {
		m.add(cc, write)
	}
	return out, md, err
}

func (m *Meter) add(cc *types.ConsumedCapacity, write bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.byPart == nil {
		m.byPart = map[string]float64{}
	}
	total := aws.ToFloat64(cc.CapacityUnits)
	if write {
		m.write += total
	} else {
		m.read += total
	}
	if cc.Table != nil {
		m.byPart["table"] += aws.ToFloat64(cc.Table.CapacityUnits)
	}
	for name, c := range cc.GlobalSecondaryIndexes {
		m.byPart[name] += aws.ToFloat64(c.CapacityUnits)
	}
}
