package iam

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Proxy sits in front of a local engine (DynamoDB with Streams, or Kinesis) and
// authorizes every request as the principal that signed it, as AWS would, before
// forwarding it. The principal is the access key id of the request's SigV4
// signature (its Credential=): a key in Roles runs as that role; a key in Admins is
// unrestricted (the operator, the test harness); any other key is refused.
//
// A denied call gets AWS's AccessDeniedException (HTTP 400) and is not forwarded;
// each denial is logged (role, action, resource) and kept for Denials.
type Proxy struct {
	target string
	mapper *Mapper
	roles  map[string]*Policy
	admins map[string]bool
	log    *slog.Logger
	ln     net.Listener
	srv    *http.Server

	mu      sync.Mutex
	denials []Denial
	// Shard iterators handed out, and the stream each reads: GetRecords names only
	// its iterator, and IAM authorizes it on the stream. Two generations bound the
	// memory: when the current one is full it becomes the previous one.
	iters, oldIters map[string]string
}

// Denial is one refused call.
type Denial struct {
	Role, Action, Resource string
	Message                string // as returned to the caller
	// Code is the error code returned: AccessDeniedException, or
	// UnrecognizedClientException for a key that is no principal at all.
	Code string
}

// ProxyConfig configures a Proxy.
type ProxyConfig struct {
	Target string // http://host:port of the engine
	// Addr to listen on; default 127.0.0.1:0.
	Addr   string
	Mapper *Mapper
	// Roles maps an access key id to the policy of the role it runs as.
	Roles map[string]*Policy
	// Admins are access key ids allowed everything.
	Admins []string
	Log    *slog.Logger
}

// iterGeneration bounds each generation of the shard iterator map.
const iterGeneration = 1 << 14

// NewProxy starts a proxy; Close stops it.
func NewProxy(c ProxyConfig) (*Proxy, error) {
	if c.Mapper == nil {
		return nil, fmt.Errorf("iam proxy: no Mapper")
	}
	addr := c.Addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("iam proxy: %w", err)
	}
	p := &Proxy{
		target: strings.TrimSuffix(c.Target, "/"), mapper: c.Mapper, roles: c.Roles, admins: map[string]bool{},
		log: c.Log, ln: ln, iters: map[string]string{}, oldIters: map[string]string{},
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	for _, a := range c.Admins {
		p.admins[a] = true
	}
	p.srv = &http.Server{Handler: p, ReadHeaderTimeout: 5 * time.Second}
	go p.srv.Serve(ln)
	return p, nil
}

// Endpoint is the proxy's URL, to use as the service's endpoint.
func (p *Proxy) Endpoint() string { return "http://" + p.ln.Addr().String() }

// Close stops the proxy.
func (p *Proxy) Close() error { return p.srv.Close() }

// Denials returns the calls refused so far.
func (p *Proxy) Denials() []Denial {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Denial(nil), p.denials...)
}

// AccessKey returns the access key id of a SigV4 Authorization header.
func AccessKey(authorization string) string {
	_, rest, ok := strings.Cut(authorization, "Credential=")
	if !ok {
		return ""
	}
	key, _, _ := strings.Cut(rest, "/")
	return key
}

// SessionARN is the principal AWS names in its messages for role running as the
// session "local".
func SessionARN(env Env, role string) string {
	return "arn:" + env.Partition + ":sts::" + env.Account + ":assumed-role/" + role + "/local"
}

func (p *Proxy) streamOf(iter string) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if a, ok := p.iters[iter]; ok {
		return a, true
	}
	a, ok := p.oldIters[iter]
	return a, ok
}

func (p *Proxy) rememberIter(iter, stream string) {
	if iter == "" {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.iters) >= iterGeneration {
		p.oldIters, p.iters = p.iters, map[string]string{}
	}
	p.iters[iter] = stream
}

func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, "read request", http.StatusBadRequest)
		return
	}
	target := r.Header.Get("X-Amz-Target")
	prefix, op, _ := strings.Cut(target, ".")
	key := AccessKey(r.Header.Get("Authorization"))
	json11 := strings.HasPrefix(prefix, "Kinesis_")

	// The stream a GetShardIterator or GetRecords call reads, to remember for the
	// iterator it hands back.
	var recordsStream string
	if !p.admins[key] {
		var c call
		switch {
		case strings.HasPrefix(prefix, "DynamoDB_"), strings.HasPrefix(prefix, "DynamoDBStreams_"):
			c, err = p.mapper.dynamo(op, body, p.streamOf)
		case json11:
			c, err = p.mapper.kinesis(op, body, p.streamOf)
		default:
			err = fmt.Errorf("unknown service target %q", target)
		}
		if denied := p.authorize(key, c, err); denied != nil {
			p.deny(w, *denied, json11)
			return
		}
		if (op == "GetShardIterator" || op == "GetRecords") && len(c.reqs) == 1 {
			recordsStream = c.reqs[0].Resources[0]
		}
	}

	req, err := http.NewRequestWithContext(r.Context(), r.Method, p.target+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	req.Header = r.Header.Clone()
	req.ContentLength = int64(len(body))
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	if recordsStream != "" && resp.StatusCode == http.StatusOK {
		var out struct{ ShardIterator, NextShardIterator string }
		if json.Unmarshal(data, &out) == nil {
			p.rememberIter(out.ShardIterator, recordsStream)
			p.rememberIter(out.NextShardIterator, recordsStream)
		}
	}
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	w.Write(data)
}

// authorize decides a call for key; nil means allowed.
func (p *Proxy) authorize(key string, c call, mapErr error) *Denial {
	pol, ok := p.roles[key]
	principal := SessionARN(p.mapper.Env, key)
	if !ok {
		if key == "" {
			key = "(unsigned)"
		}
		// AWS's answer to a key it does not know; the local reason follows it.
		return &Denial{Role: key, Action: c.service + ":" + c.op, Code: "UnrecognizedClientException", Message: fmt.Sprintf(
			"The security token included in the request is invalid. (Access key %q is neither a role of the stack nor an administrator of the local fleet.)", key)}
	}
	if mapErr != nil {
		return &Denial{Role: pol.Role, Action: c.service + ":" + c.op, Message: fmt.Sprintf(
			"User: %s is not authorized: the local IAM enforcement cannot map this request: %v", principal, mapErr)}
	}
	for _, req := range c.reqs {
		d, err := pol.Evaluate(req)
		if err != nil {
			return &Denial{Role: pol.Role, Action: req.Action, Resource: strings.Join(req.Resources, ","), Message: fmt.Sprintf(
				"User: %s is not authorized: the local IAM enforcement cannot evaluate this request: %v", principal, err)}
		}
		if d.Allowed {
			continue
		}
		why := "because no identity-based policy allows the " + req.Action + " action"
		if d.ExplicitDeny {
			why = "with an explicit deny in an identity-based policy"
		}
		return &Denial{Role: pol.Role, Action: req.Action, Resource: d.Resource, Message: fmt.Sprintf(
			"User: %s is not authorized to perform: %s on resource: %s %s", principal, req.Action, d.Resource, why)}
	}
	return nil
}

// deny answers as AWS does when IAM refuses a call: HTTP 400 with an
// AccessDeniedException (d.Code, if set, instead), in the service's JSON protocol:
// 1.0 for DynamoDB and its Streams, whose __type carries the coral namespace; 1.1
// for Kinesis, whose __type is the bare name. Both write the text under "Message".
func (p *Proxy) deny(w http.ResponseWriter, d Denial, json11 bool) {
	if d.Code == "" {
		d.Code = "AccessDeniedException"
	}
	p.mu.Lock()
	p.denials = append(p.denials, d)
	p.mu.Unlock()
	p.log.Warn("IAM denied", "role", d.Role, "action", d.Action, "resource", d.Resource, "message", d.Message)
	var body []byte
	if json11 {
		w.Header().Set("Content-Type", "application/x-amz-json-1.1")
		body, _ = json.Marshal(map[string]string{"__type": d.Code, "Message": d.Message})
	} else {
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		body, _ = json.Marshal(map[string]string{"__type": "com.amazon.coral.service#" + d.Code, "Message": d.Message})
	}
	w.Header().Set("X-Amzn-ErrorType", d.Code)
	w.WriteHeader(http.StatusBadRequest)
	w.Write(body)
}
