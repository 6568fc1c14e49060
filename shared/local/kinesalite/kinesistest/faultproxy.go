package kinesistest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
)

// FaultProxy sits between a Kinesis client and the engine and fails chosen entries
// of PutRecords calls the way Kinesis does: a failed entry is not written, and the
// answer carries its ErrorCode with FailedRecordCount. Everything else passes through.
type FaultProxy struct {
	Endpoint string // http://127.0.0.1:PORT of the proxy

	mu sync.Mutex
	// fail decides each PutRecords entry: "" forwards it, anything else is the
	// ErrorCode it fails with. call counts PutRecords calls from 0.
	fail func(call, entry int, partitionKey string, data []byte) string
	// whole, when set, fails a whole PutRecords call with this error type (HTTP 400).
	whole func(call int) string

	calls    atomic.Int64
	Failed   atomic.Int64 // entries failed so far
	Rejected atomic.Int64 // whole calls failed so far
	target   string
}

// NewFaultProxy starts a proxy in front of target, closed when t ends.
func NewFaultProxy(t testing.TB, target string) *FaultProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &FaultProxy{Endpoint: "http://" + ln.Addr().String(), target: target}
	srv := &http.Server{Handler: p}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return p
}

// FailEntries sets the per-entry decision (nil: none fail).
func (p *FaultProxy) FailEntries(f func(call, entry int, partitionKey string, data []byte) string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fail = f
}

// FailCalls sets the whole-call decision (nil: none fail).
func (p *FaultProxy) FailCalls(f func(call int) string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.whole = f
}

// Calls is how many PutRecords calls reached the proxy.
func (p *FaultProxy) Calls() int { return int(p.calls.Load()) }

type putRecordsIn struct {
	Records []struct {
		Data         []byte
		PartitionKey string
	}
	StreamName string `json:",omitempty"`
	StreamARN  string `json:",omitempty"`
}

type putRecordsEntry struct {
	SequenceNumber string `json:",omitempty"`
	ShardId        string `json:",omitempty"`
	ErrorCode      string `json:",omitempty"`
	ErrorMessage   string `json:",omitempty"`
}

type putRecordsOut struct {
	FailedRecordCount int
	Records           []putRecordsEntry
}

func (p *FaultProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	if r.Header.Get("X-Amz-Target") != "Kinesis_20131202.PutRecords" {
		p.forward(w, r, body)
		return
	}
	call := int(p.calls.Add(1) - 1)
	p.mu.Lock()
	fail, whole := p.fail, p.whole
	p.mu.Unlock()
	if whole != nil {
		if code := whole(call); code != "" {
			p.Rejected.Add(1)
			w.Header().Set("Content-Type", "application/x-amz-json-1.1")
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprintf(w, `{"__type":%q,"message":"injected"}`, code)
			return
		}
	}
	var in putRecordsIn
	if err := json.Unmarshal(body, &in); err != nil || fail == nil {
		p.forward(w, r, body)
		return
	}
	codes := make([]string, len(in.Records))
	kept := in
	kept.Records = nil
	for i, rec := range in.Records {
		codes[i] = fail(call, i, rec.PartitionKey, rec.Data)
		if codes[i] == "" {
			kept.Records = append(kept.Records, rec)
		}
	}
	out := putRecordsOut{Records: make([]putRecordsEntry, len(in.Records))}
	if len(kept.Records) > 0 {
		fwd, _ := json.Marshal(kept)
		rec := &recorder{header: http.Header{}}
		p.forward(rec, r, fwd)
		if rec.code != http.StatusOK {
			copyResponse(w, rec)
			return
		}
		var got putRecordsOut
		if err := json.Unmarshal(rec.body.Bytes(), &got); err != nil || len(got.Records) != len(kept.Records) {
			copyResponse(w, rec)
			return
		}
		out.FailedRecordCount = got.FailedRecordCount
		j := 0
		for i := range codes {
			if codes[i] == "" {
				out.Records[i] = got.Records[j]
				j++
			}
		}
	}
	for i, code := range codes {
		if code != "" {
			out.Records[i] = putRecordsEntry{ErrorCode: code, ErrorMessage: "injected"}
			out.FailedRecordCount++
			p.Failed.Add(1)
		}
	}
	b, _ := json.Marshal(out)
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	_, _ = w.Write(b)
}

func (p *FaultProxy) forward(w http.ResponseWriter, r *http.Request, body []byte) {
	req, err := http.NewRequestWithContext(r.Context(), r.Method, p.target+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	req.Header = r.Header.Clone()
	req.Header.Del("Content-Length")
	req.ContentLength = int64(len(body))
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for k, v := range resp.Header {
		if k != "Content-Length" {
			w.Header()[k] = v
		}
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}

type recorder struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }
func (r *recorder) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.code = http.StatusOK
	}
	return r.body.Write(b)
}
func (r *recorder) WriteHeader(code int) { r.code = code }

func copyResponse(w http.ResponseWriter, rec *recorder) {
	for k, v := range rec.header {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.code)
	_, _ = w.Write(rec.body.Bytes())
}
