package app

import (
	"log/slog"

	"github.com/sockfleet/sockfleet/worker/internal/connquota"
	"github.com/sockfleet/sockfleet/worker/internal/metrics"
	wstream "github.com/sockfleet/sockfleet/worker/internal/stream"
)

// connectGate shares the connect quota (q, nil: none) and the upstreams' 429 holds
// with the whole fleet through the table (see stream.TableGate).
func connectGate(db DB, table string, q *wstream.Quota, m *metrics.Counters, log *slog.Logger) wstream.Gate {
	g := &wstream.TableGate{
		Store:   &connquota.Store{DB: db, Table: table},
		Local:   &wstream.LocalGate{},
		Metrics: m,
		Log:     log,
	}
	if q != nil {
		g.N, g.W = q.N, q.W
	}
	return g
}
