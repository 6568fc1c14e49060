package wakeup

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// replyServer is a real HTTP server on 127.0.0.1 that checks the signature and
// answers with body.
func replyServer(t *testing.T, body string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if err := Verify(secret, time.Now(), r.Header.Get(HeaderTimestamp), r.Header.Get(HeaderSignature), b); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func TestClientReadsLoad(t *testing.T) {
	addr := replyServer(t, `{"v":1,"results":[{"id":"a","result":"acquired"}],"load":4}`)
	c := &Client{Secret: secret}
	resp, err := c.Send(context.Background(), addr, Request{Conns: []Conn{{ID: "a", Reason: NeedsOwner}}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Load == nil || *resp.Load != 4 || resp.Results[0].Result != Acquired {
		t.Errorf("reply %+v", resp)
	}
}

func TestClientRefusesBadReply(t *testing.T) {
	for name, body := range map[string]string{
		"negative load": `{"v":1,"results":[{"id":"a","result":"acquired"}],"load":-3}`,
		"wrong version": `{"v":9,"results":[]}`,
		"not json":      `<html>`,
	} {
		t.Run(name, func(t *testing.T) {
			addr := replyServer(t, body)
			_, err := (&Client{Secret: secret}).Send(context.Background(), addr, Request{Conns: []Conn{{ID: "a", Reason: NeedsOwner}}})
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("Send = %v, want ErrMalformed (the caller then re-routes every id)", err)
			}
		})
	}
}
