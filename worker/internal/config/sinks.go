package config

import (
	"context"
	"fmt"

	"strings"

	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/sockfleet/sockfleet/shared/ddb"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/worker/internal/sink"
)

// OpenRouter returns a router over def (the fleet's sink) and one sink per
// destination SinksAllowed names: a file for file:PATH, else a Kinesis stream (by
// name or ARN, with the standard AWS settings and the options kin). A connection's
// sink attribute may name only these.
func (c *Config) OpenRouter(ctx context.Context, def sink.Sink, kin sink.KinesisOptions) (*sink.Router, error) {
	names, err := schema.ParseSinksAllowed(c.SinksAllowed)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", schema.EnvSinksAllowed, err)
	}
	r := &sink.Router{Default: def, Dests: make(map[string]sink.Sink, len(names))}
	var client *kinesis.Client
	for _, name := range names {
		var s sink.Sink
		if path, ok := strings.CutPrefix(name, "file:"); ok {
			s, err = sink.OpenFile(path)
		} else {
			if client == nil {
				aws, lerr := ddb.LoadConfig(ctx)
				if lerr != nil {
					return nil, fmt.Errorf("%s: %w", schema.EnvSinksAllowed, lerr)
				}
				client = kinesis.NewFromConfig(aws)
			}
			s, err = sink.NewKinesis(client, name, kin)
		}
		if err != nil {
			for _, opened := range r.Dests {
				_ = opened.Close()
			}
			return nil, fmt.Errorf("%s: %s: %w", schema.EnvSinksAllowed, name, err)
		}
		r.Dests[name] = s
	}
	return r, nil
}
