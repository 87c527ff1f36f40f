package server

import (
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// fakeClock is a clock the test moves by hand.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time          { return c.t }
func (c *fakeClock) advance(d time.Duration) { c.t = c.t.Add(d) }

func addr(s string) netip.Prefix { return clientPrefix(netip.MustParseAddr(s)) }

// nthAddr is the i-th of many client addresses.
func nthAddr(i int) netip.Prefix {
	return clientPrefix(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}))
}

func TestRateLimiterBucket(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	l := newRateLimiter(2, 3, nil, clock.now) // 2 a second, bursts of 3
	a, b := addr("192.0.2.1"), addr("192.0.2.2")

	for i := range 3 {
		if ok, _ := l.allow(a); !ok {
			t.Fatalf("request %d of a burst of 3 refused", i+1)
		}
	}
	ok, wait := l.allow(a)
	if ok || wait != 500*time.Millisecond {
		t.Fatalf("4th request: ok %v, retry after %v; want refused, 500ms (one token at 2/s)", ok, wait)
	}
	if ok, _ := l.allow(b); !ok {
		t.Fatal("another client was refused while the first one was over its limit")
	}

	clock.advance(499 * time.Millisecond)
	if ok, wait := l.allow(a); ok || wait != time.Millisecond {
		t.Fatalf("499ms later: ok %v, retry after %v; want refused, 1ms", ok, wait)
	}
	clock.advance(time.Millisecond)
	if ok, _ := l.allow(a); !ok {
		t.Fatal("a token later: refused")
	}
	if ok, _ := l.allow(a); ok {
		t.Fatal("the refilled token was spent twice")
	}

	// A long idle refills the bucket to its size, not beyond.
	clock.advance(time.Hour)
	for i := range 3 {
		if ok, _ := l.allow(a); !ok {
			t.Fatalf("after an hour: request %d of 3 refused", i+1)
		}
	}
	if ok, _ := l.allow(a); ok {
		t.Fatal("after an hour: a 4th request was allowed; the bucket holds 3")
	}
}

func TestRateLimiterDefaults(t *testing.T) {
	t.Parallel()
	for _, rate := range []float64{0, -1} {
		if l := newRateLimiter(rate, 10, nil, time.Now); l != nil {
			t.Errorf("rate %v: a limiter, want none (no limit)", rate)
		}
	}
	if l := newRateLimiter(2.5, 0, nil, time.Now); l.burst != 3 {
		t.Errorf("rate 2.5, burst 0: burst %v, want 3 (the rate rounded up)", l.burst)
	}
	if l := newRateLimiter(0.1, 0, nil, time.Now); l.burst != 1 {
		t.Errorf("rate 0.1, burst 0: burst %v, want 1", l.burst)
	}
}

// TestRateLimiterForgetsIdleClients: a bucket that has refilled is
// forgotten, so the memory kept follows the clients seen lately, however
// many came before; and it never passes maxClients.
func TestRateLimiterForgetsIdleClients(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	l := newRateLimiter(10, 20, nil, clock.now) // refills in 2s
	for i := range 1000 {
		l.allow(nthAddr(i))
	}
	if n := len(l.buckets); n != 1000 {
		t.Fatalf("%d buckets after 1000 clients, want 1000", n)
	}
	clock.advance(2 * time.Second)
	l.allow(addr("192.0.2.1"))
	if n := len(l.buckets); n != 1 {
		t.Fatalf("%d buckets once the 1000 had refilled, want 1 (the new client's)", n)
	}
	// A client that is still short of tokens is remembered: forgetting it
	// would give it a fresh burst.
	for range 20 {
		l.allow(addr("192.0.2.2"))
	}
	clock.advance(2 * time.Second)
	l.allow(addr("192.0.2.3"))
	if _, ok := l.buckets[addr("192.0.2.2")]; ok {
		t.Fatal("a refilled bucket was kept")
	}

	for i := range maxClients + 100 {
		l.allow(nthAddr(i))
	}
	if n := len(l.buckets); n > maxClients {
		t.Fatalf("%d buckets, over the bound of %d", n, maxClients)
	}
}

func TestRateLimiterClient(t *testing.T) {
	t.Parallel()
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("::1/128")}
	open := newRateLimiter(1, 1, nil, time.Now)
	proxied := newRateLimiter(1, 1, trusted, time.Now)
	for _, tc := range []struct {
		name, remote string
		xff          []string
		l            *rateLimiter
		want         string
	}{
		{"peer", "192.0.2.1:4711", nil, open, "192.0.2.1/32"},
		{"forwarded-for ignored without trusted proxies", "192.0.2.1:4711", []string{"198.51.100.7"}, open, "192.0.2.1/32"},
		{"forwarded-for ignored from an untrusted peer", "192.0.2.1:4711", []string{"198.51.100.7"}, proxied, "192.0.2.1/32"},
		{"client behind a trusted proxy", "10.1.2.3:4711", []string{"198.51.100.7"}, proxied, "198.51.100.7/32"},
		{"spoofed entries left of the real client", "10.1.2.3:4711", []string{"6.6.6.6, 198.51.100.7"}, proxied, "198.51.100.7/32"},
		{"a chain of trusted proxies", "10.1.2.3:4711", []string{"198.51.100.7, 10.9.9.9", "10.8.8.8"}, proxied, "198.51.100.7/32"},
		{"garbage stops the walk", "10.1.2.3:4711", []string{"198.51.100.7, nonsense"}, proxied, "10.1.2.3/32"},
		{"an entry with a port", "10.1.2.3:4711", []string{"[2001:db8::7]:443"}, proxied, "2001:db8::/64"},
		{"every hop trusted", "[::1]:4711", []string{"10.0.0.1"}, proxied, "10.0.0.1/32"},
		{"IPv6 by /64", "[2001:db8:1:2:3:4:5:6]:4711", nil, open, "2001:db8:1:2::/64"},
		{"IPv4 mapped in IPv6", "[::ffff:192.0.2.1]:4711", nil, open, "192.0.2.1/32"},
		{"not TCP", "@", nil, open, "invalid Prefix"},
	} {
		r := &http.Request{RemoteAddr: tc.remote, Header: http.Header{}}
		for _, v := range tc.xff {
			r.Header.Add("X-Forwarded-For", v)
		}
		if got := tc.l.client(r).String(); got != tc.want {
			t.Errorf("%s: client %s, want %s", tc.name, got, tc.want)
		}
	}
}

// FuzzClientKey feeds the peer address and X-Forwarded-For that pick a
// request's rate-limit bucket: the bucket is the peer's unless the peer is
// trusted, and then it is one of the addresses named, never one the
// client could not have been.
func FuzzClientKey(f *testing.F) {
	f.Add("10.1.2.3:4711", "198.51.100.7")
	f.Add("10.1.2.3:4711", "6.6.6.6, 198.51.100.7, 10.0.0.9")
	f.Add("192.0.2.1:80", "198.51.100.7")
	f.Add("[::1]:80", "[2001:db8::1]:443, fe80::1%eth0")
	f.Add("[::ffff:10.0.0.1]:1", "::ffff:198.51.100.7")
	f.Add("10.0.0.1:1", ",,, ,")
	f.Add("not an address", "198.51.100.7")
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("::1/128")}
	l := newRateLimiter(1, 1, trusted, time.Now)
	f.Fuzz(func(t *testing.T, remote, xff string) {
		r := &http.Request{RemoteAddr: remote, Header: http.Header{"X-Forwarded-For": {xff}}}
		got := l.client(r)
		peer, err := netip.ParseAddrPort(remote)
		if err != nil {
			if got.IsValid() {
				t.Fatalf("peer %q (not an address): bucket %v, want the one for such peers", remote, got)
			}
			return
		}
		peerKey := clientPrefix(peer.Addr().Unmap())
		if !l.isTrusted(peer.Addr().Unmap()) {
			if got != peerKey {
				t.Fatalf("untrusted peer %q with X-Forwarded-For %q: bucket %v, want the peer's %v", remote, xff, got, peerKey)
			}
			return
		}
		if got == peerKey {
			return
		}
		// Otherwise got is one of the forwarded addresses.
		for _, e := range strings.Split(xff, ",") {
			if a, ok := parseHop(e); ok && clientPrefix(a) == got {
				return
			}
		}
		t.Fatalf("peer %q, X-Forwarded-For %q: bucket %v is neither the peer's nor a forwarded address", remote, xff, got)
	})
}
