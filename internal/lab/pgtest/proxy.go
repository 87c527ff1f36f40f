package pgtest

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
)

// Proxy is a TCP proxy in front of a test's PostgreSQL server that can
// make the server's answers get lost on the way back, as a network that
// fails in one direction would: a request still arrives and is carried out,
// and its client never hears of it.
type Proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	conns  map[*proxied]bool
	closed bool
	arming bool // connections made now are armed too (DropAllAnswers)
	wg     sync.WaitGroup
}

// proxied is one client connection and its connection to the server.
type proxied struct {
	client, server net.Conn
	armed          atomic.Bool // the next statement's answer is to be dropped
	dark           atomic.Bool // the server's bytes are dropped
}

// NewProxy starts a proxy to the server of db's URL and returns it with
// the URL that reaches db through it. It stops when the test ends.
func NewProxy(t testing.TB, dbURL string) (*Proxy, string) {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatalf("pgtest: proxy: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("pgtest: proxy: %v", err)
	}
	p := &Proxy{ln: ln, target: u.Host, conns: map[*proxied]bool{}}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	u.Host = ln.Addr().String()
	return p, u.String()
}

// DropAnswers makes every connection open now drop what the server sends
// back from the next statement its client executes on, until it closes;
// what the client sends still arrives, and connections made later are not
// affected. A statement's preparation (pgx prepares one on its first use
// on a connection, and waits for that answer before it executes) is still
// answered, so that the statement itself is sent. It returns how many
// connections it armed.
func (p *Proxy) DropAnswers() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.armed.Store(true)
	}
	return len(p.conns)
}

// DropAllAnswers is DropAnswers for the connections open now and for
// every one made until the returned function is called: a pool that opens
// a connection meanwhile (under load, or to replace one whose statement
// hung) cannot slip an answered statement past the loss. After that call
// every connection that executed nothing meanwhile, and every new one, is
// answered again; the dark ones stay dark until they close.
func (p *Proxy) DropAllAnswers() (restore func()) {
	p.mu.Lock()
	p.arming = true
	p.mu.Unlock()
	p.DropAnswers()
	return func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.arming = false
		for c := range p.conns {
			c.armed.Store(false)
		}
	}
}

func (p *Proxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		c := &proxied{client: client, server: server}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = client.Close()
			_ = server.Close()
			return
		}
		p.conns[c] = true
		if p.arming {
			c.armed.Store(true)
		}
		p.mu.Unlock()
		p.wg.Go(func() { p.pipe(c) })
	}
}

// pipe carries c's bytes both ways until either side closes.
func (p *Proxy) pipe(c *proxied) {
	var wg sync.WaitGroup
	wg.Go(func() {
		_ = c.forward()
		_ = c.server.Close()
		_ = c.client.Close()
	})
	wg.Go(func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := c.server.Read(buf)
			if n > 0 && !c.dark.Load() {
				if _, werr := c.client.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		_ = c.client.Close()
		_ = c.server.Close()
	})
	wg.Wait()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// forward carries the client's messages to the server, one at a time, and
// darkens the connection as an armed one's client executes a statement
// (Execute of the extended protocol, or a simple Query). The first message
// is the startup message, which has no type byte.
func (c *proxied) forward() error {
	r := bufio.NewReader(c.client)
	startup := true
	var head [5]byte
	for {
		h := head[1:]
		if !startup {
			h = head[:]
		}
		if _, err := io.ReadFull(r, h); err != nil {
			return err
		}
		n := int64(binary.BigEndian.Uint32(h[len(h)-4:])) - 4
		if n < 0 {
			return errors.New("pgtest: proxy: a malformed message")
		}
		if !startup && (head[0] == 'E' || head[0] == 'Q') && c.armed.Load() {
			c.dark.Store(true)
		}
		startup = false
		if _, err := c.server.Write(h); err != nil {
			return err
		}
		if _, err := io.CopyN(c.server, r, n); err != nil {
			return err
		}
	}
}

func (p *Proxy) close() {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		_ = c.client.Close()
		_ = c.server.Close()
	}
	p.mu.Unlock()
	_ = p.ln.Close()
	p.wg.Wait()
}
