package fleet

import (
	"bytes"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Faults says how often a FaultProxy misbehaves. Probabilities are per request.
type Faults struct {
	MaxLatency time.Duration // uniform extra latency in [0, MaxLatency)
	P5xx       float64       // answer 500 InternalServerError without forwarding
	PThrottle  float64       // answer 400 ThrottlingException without forwarding
	PDrop      float64       // forward (the write is applied), then drop the response
}

// FaultProxy sits between clients and DynamoDB and injects faults: latency, 5xx,
// throttling, responses dropped after the write was applied, and outages. Its
// choices come from a seeded source, so a failing chaos run can be replayed.
type FaultProxy struct {
	Target string // http://host:port of the real endpoint

	mu     sync.Mutex
	faults Faults
	rng    *rand.Rand
	down   atomic.Bool
	ln     net.Listener
	srv    *http.Server

	Injected atomic.Int64 // faults injected so far
	Meter    Meter        // capacity billed for everything that went through
}

// Meter adds up what DynamoDB bills for the traffic through a proxy: it asks each
// call for ReturnConsumedCapacity=INDEXES and reads the answer. A conditional write
// that fails is billed one write unit (items here are under 1 KB) and counted apart.
type Meter struct {
	mu sync.Mutex
	u  Usage
}

// Usage is what a Meter counted.
type Usage struct {
	ReadUnits, WriteUnits  float64
	ConditionalCheckFailed int
	Calls                  map[string]int // by operation
}

// Snapshot returns a copy of the counters.
func (m *Meter) Snapshot() Usage {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.u
	c.Calls = map[string]int{}
	for k, v := range m.u.Calls {
		c.Calls[k] = v
	}
	return c
}

// Sub returns u minus an earlier snapshot.
func (u Usage) Sub(earlier Usage) Usage {
	d := Usage{ReadUnits: u.ReadUnits - earlier.ReadUnits, WriteUnits: u.WriteUnits - earlier.WriteUnits,
		ConditionalCheckFailed: u.ConditionalCheckFailed - earlier.ConditionalCheckFailed, Calls: map[string]int{}}
	for k, v := range u.Calls {
		d.Calls[k] = v - earlier.Calls[k]
	}
	return d
}

var meteredOps = map[string]bool{ // op -> is a read
	"GetItem": true, "Query": true, "Scan": true, "BatchGetItem": true,
	"PutItem": false, "UpdateItem": false, "DeleteItem": false, "BatchWriteItem": false,
}

// request adds ReturnConsumedCapacity to a metered call's JSON body.
func (m *Meter) request(op string, body []byte) []byte {
	if _, ok := meteredOps[op]; !ok {
		return body
	}
	var in map[string]json.RawMessage
	if json.Unmarshal(body, &in) != nil {
		return body
	}
	in["ReturnConsumedCapacity"] = json.RawMessage(`"INDEXES"`)
	out, err := json.Marshal(in)
	if err != nil {
		return body
	}
	return out
}

func (m *Meter) response(op string, status int, body []byte) {
	read, metered := meteredOps[op]
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.u.Calls == nil {
		m.u.Calls = map[string]int{}
	}
	m.u.Calls[op]++
	if !metered {
		return
	}
	if status != http.StatusOK {
		if bytes.Contains(body, []byte("ConditionalCheckFailed")) {
			m.u.ConditionalCheckFailed++
			m.u.WriteUnits++
		}
		return
	}
	var out struct {
		ConsumedCapacity json.RawMessage
	}
	if json.Unmarshal(body, &out) != nil || len(out.ConsumedCapacity) == 0 {
		return
	}
	var ccs []struct{ CapacityUnits float64 }
	if out.ConsumedCapacity[0] != '[' {
		out.ConsumedCapacity = append(append([]byte{'['}, out.ConsumedCapacity...), ']')
	}
	if json.Unmarshal(out.ConsumedCapacity, &ccs) != nil {
		return
	}
	for _, cc := range ccs {
		if read {
			m.u.ReadUnits += cc.CapacityUnits
		} else {
			m.u.WriteUnits += cc.CapacityUnits
		}
	}
}

// NewFaultProxy listens on 127.0.0.1 and forwards to target.
func NewFaultProxy(target string, seed uint64) (*FaultProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &FaultProxy{Target: strings.TrimSuffix(target, "/"), rng: rand.New(rand.NewPCG(seed, seed^0x5eed)), ln: ln}
	p.srv = &http.Server{Handler: p, ReadHeaderTimeout: 5 * time.Second}
	go p.srv.Serve(ln)
	return p, nil
}

// Endpoint is the proxy's URL, to use as AWS_ENDPOINT_URL_DYNAMODB.
func (p *FaultProxy) Endpoint() string { return "http://" + p.ln.Addr().String() }

// SetFaults changes the fault mix.
func (p *FaultProxy) SetFaults(f Faults) {
	p.mu.Lock()
	p.faults = f
	p.mu.Unlock()
}

// SetDown starts or ends an outage: while down, every connection is cut at once.
func (p *FaultProxy) SetDown(down bool) { p.down.Store(down) }

// Close stops the proxy.
func (p *FaultProxy) Close() error { return p.srv.Close() }

type decision struct {
	latency                 time.Duration
	fail5xx, throttle, drop bool
}

func (p *FaultProxy) decide() decision {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := p.faults
	var d decision
	if f.MaxLatency > 0 {
		d.latency = time.Duration(p.rng.Int64N(int64(f.MaxLatency)))
	}
	r := p.rng.Float64()
	switch {
	case r < f.P5xx:
		d.fail5xx = true
	case r < f.P5xx+f.PThrottle:
		d.throttle = true
	case r < f.P5xx+f.PThrottle+f.PDrop:
		d.drop = true
	}
	return d
}

func (p *FaultProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if p.down.Load() {
		p.Injected.Add(1)
		cut(w)
		return
	}
	d := p.decide()
	time.Sleep(d.latency)
	const ns = "com.amazonaws.dynamodb.v20120810#"
	switch {
	case d.fail5xx:
		p.Injected.Add(1)
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		w.WriteHeader(http.StatusInternalServerError)
		io.WriteString(w, `{"__type":"`+ns+`InternalServerError","message":"injected fault"}`)
		return
	case d.throttle:
		p.Injected.Add(1)
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"__type":"`+ns+`ThrottlingException","message":"Rate of requests exceeds the allowed throughput."}`)
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		cut(w)
		return
	}
	target := r.Header.Get("X-Amz-Target")
	op := target[strings.LastIndexByte(target, '.')+1:]
	// Rewriting the body breaks the client's SigV4 signature; the local engine does
	// not check it, and this proxy only ever fronts the local engine.
	body = p.Meter.request(op, body)
	req, err := http.NewRequestWithContext(r.Context(), r.Method, p.Target+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		cut(w)
		return
	}
	req.Header = r.Header.Clone()
	req.ContentLength = int64(len(body))
	req.Header.Del("Content-Length")
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		cut(w)
		return
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err == nil {
		p.Meter.response(op, resp.StatusCode, data)
	}
	if err != nil || d.drop {
		if d.drop {
			p.Injected.Add(1)
		}
		cut(w) // applied upstream; the client never hears
		return
	}
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.Header().Del("Content-Length")
	w.WriteHeader(resp.StatusCode)
	w.Write(data)
}

// cut closes the client's connection without a response.
func cut(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if c, _, err := hj.Hijack(); err == nil {
			if tc, ok := c.(*net.TCPConn); ok {
				tc.SetLinger(0) // a reset, as a dead peer gives
			}
			c.Close()
			return
		}
	}
	panic(http.ErrAbortHandler)
}
