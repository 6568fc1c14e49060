package main

import (
	"net"
	"sync"
	"time"
)

// delayLink is a TCP proxy in front of the upstream that makes it look, in timing,
// like an upstream on another host rtt away: a new connection reaches the upstream
// one rtt after it was accepted (the TCP handshake), and every chunk of bytes, each
// way, is held for half of rtt. A dial through it (connect, then the WebSocket
// upgrade) takes two round trips, as a plain ws:// dial over a network does (TLS,
// for wss://, would add one or two more). Messages keep their spacing: each is
// delayed by the same half round trip.
type delayLink struct {
	ln     net.Listener
	target string
	rtt    time.Duration
	mu     sync.Mutex
	conns  map[net.Conn]bool
	wg     sync.WaitGroup
}

func newDelayLink(target string, rtt time.Duration) (*delayLink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	d := &delayLink{ln: ln, target: target, rtt: rtt, conns: map[net.Conn]bool{}}
	d.wg.Go(d.serve)
	return d, nil
}

// Addr is the host:port to dial instead of the upstream's.
func (d *delayLink) Addr() string { return d.ln.Addr().String() }

// Close stops accepting and cuts every connection.
func (d *delayLink) Close() {
	d.ln.Close()
	d.mu.Lock()
	for c := range d.conns {
		c.Close()
	}
	d.mu.Unlock()
	d.wg.Wait()
}

func (d *delayLink) track(c net.Conn, on bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if on {
		d.conns[c] = true
	} else {
		delete(d.conns, c)
	}
}

func (d *delayLink) serve() {
	for {
		c, err := d.ln.Accept()
		if err != nil {
			return
		}
		d.wg.Go(func() { d.pipe(c) })
	}
}

func (d *delayLink) pipe(c net.Conn) {
	d.track(c, true)
	defer d.track(c, false)
	defer c.Close()
	time.Sleep(d.rtt) // the TCP handshake with a distant host
	u, err := net.Dial("tcp", d.target)
	if err != nil {
		return
	}
	d.track(u, true)
	defer d.track(u, false)
	defer u.Close()
	done := make(chan struct{})
	go func() { d.oneWay(u, c); close(done) }()
	d.oneWay(c, u)
	<-done
}

// oneWay copies src to dst, each chunk half a round trip after it was read. When src
// ends, dst is closed once what was read before has been written.
func (d *delayLink) oneWay(dst, src net.Conn) {
	type chunk struct {
		b   []byte
		due time.Time
	}
	ch := make(chan chunk, 4096)
	go func() {
		defer close(ch)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				ch <- chunk{buf[:n], time.Now().Add(d.rtt / 2)}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range ch {
		time.Sleep(time.Until(c.due))
		if _, err := dst.Write(c.b); err != nil {
			break
		}
	}
	src.Close() // ends the reader, if dst failed first
	dst.Close()
	for range ch {
	}
}
