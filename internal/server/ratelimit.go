package server

import (
	"fmt"
	"math"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"
)

// maxClients bounds the buckets a rateLimiter keeps (about 64 bytes each).
// Idle buckets go long before that; the bound holds when addresses are
// sprayed faster than buckets refill.
const maxClients = 1 << 16

// rateLimiter is a token bucket per client: a client may make burst
// requests at once, then rate a second. A client is an IPv4 address or an
// IPv6 /64 (what one host usually has to itself, and could otherwise
// rotate through for fresh buckets).
type rateLimiter struct {
	rate    float64       // tokens a second
	burst   float64       // the bucket's size
	refill  time.Duration // from empty to full: a bucket idle that long is as good as none
	trusted []netip.Prefix
	now     func() time.Time

	mu        sync.Mutex
	buckets   map[netip.Prefix]bucket
	nextSweep time.Time
}

type bucket struct {
	tokens float64
	at     time.Time // when tokens was counted
}

// newRateLimiter returns a limiter of rate requests a second in bursts of
// burst (at least 1; zero means rate rounded up), or nil when rate is not
// above zero: no limit. X-Forwarded-For is believed only from trusted peers.
func newRateLimiter(rate float64, burst int, trusted []netip.Prefix, now func() time.Time) *rateLimiter {
	if !(rate > 0) { // NaN too
		return nil
	}
	if burst < 1 {
		burst = int(min(math.Ceil(rate), math.MaxInt32))
	}
	return &rateLimiter{
		rate:    rate,
		burst:   float64(burst),
		refill:  seconds(float64(burst) / rate),
		trusted: trusted,
		now:     now,
		buckets: make(map[netip.Prefix]bucket),
	}
}

// allow takes a token from client's bucket. Without one it returns how
// long until the bucket holds one again.
func (l *rateLimiter) allow(client netip.Prefix) (ok bool, retryAfter time.Duration) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sweep(now)
	b, seen := l.buckets[client]
	if !seen {
		if len(l.buckets) >= maxClients {
			// Under an address spray: forget anyone, which at worst
			// gives them a fresh bucket; memory stays bounded.
			for k := range l.buckets {
				delete(l.buckets, k)
				break
			}
		}
		b = bucket{tokens: l.burst, at: now}
	}
	if elapsed := now.Sub(b.at); elapsed > 0 {
		b.tokens = min(l.burst, b.tokens+elapsed.Seconds()*l.rate)
		b.at = now
	}
	if b.tokens >= 1 {
		b.tokens--
		l.buckets[client] = b
		return true, 0
	}
	l.buckets[client] = b
	return false, seconds((1 - b.tokens) / l.rate)
}

// seconds converts s to a Duration, capped at a year: far beyond any
// useful limit, and far inside a Duration's range.
func seconds(s float64) time.Duration {
	const year = 365 * 24 * time.Hour
	return time.Duration(min(s, year.Seconds()) * float64(time.Second))
}

// sweep forgets the buckets that have refilled, since a full bucket is the
// same as none. It runs at most once a refill time (or a second, when that
// is shorter), so the buckets kept are those of the clients seen in the
// last two of those, and a request pays O(1) for it on average.
func (l *rateLimiter) sweep(now time.Time) {
	if now.Before(l.nextSweep) {
		return
	}
	l.nextSweep = now.Add(max(l.refill, time.Second))
	for k, b := range l.buckets {
		if now.Sub(b.at) >= l.refill {
			delete(l.buckets, k)
		}
	}
}

// client returns the address r is limited by: the peer's or, when the
// peer is a trusted proxy, the nearest address in X-Forwarded-For, read
// from the right (proxies append), that is not a trusted proxy's. An
// address that cannot be parsed stops the walk, as nothing left of it can
// be believed.
func (l *rateLimiter) client(r *http.Request) netip.Prefix {
	peer, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Prefix{} // not TCP: one bucket for all such peers
	}
	addr := peer.Addr().Unmap()
	if !l.isTrusted(addr) {
		return clientPrefix(addr)
	}
	hops := r.Header.Values("X-Forwarded-For")
	for i := len(hops) - 1; i >= 0; i-- {
		entries := strings.Split(hops[i], ",")
		for j := len(entries) - 1; j >= 0; j-- {
			hop, ok := parseHop(entries[j])
			if !ok {
				return clientPrefix(addr)
			}
			addr = hop
			if !l.isTrusted(addr) {
				return clientPrefix(addr)
			}
		}
	}
	return clientPrefix(addr)
}

func (l *rateLimiter) isTrusted(addr netip.Addr) bool {
	for _, p := range l.trusted {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// parseHop parses one X-Forwarded-For entry: an address, or an address and
// port as some proxies write it ("192.0.2.1:4711", "[2001:db8::1]:4711").
func parseHop(s string) (netip.Addr, bool) {
	s = strings.TrimSpace(s)
	if a, err := netip.ParseAddr(s); err == nil && a.Zone() == "" {
		return a.Unmap(), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil && ap.Addr().Zone() == "" {
		return ap.Addr().Unmap(), true
	}
	return netip.Addr{}, false
}

// clientPrefix is the unit a client is counted by: an IPv4 address, or the
// /64 of an IPv6 address.
func clientPrefix(a netip.Addr) netip.Prefix {
	if a.Is4() {
		return netip.PrefixFrom(a, 32)
	}
	p, _ := a.WithZone("").Prefix(64)
	return p
}

// rateLimited reports whether the limit applies to path: the API and the
// websocket upgrade. Health, readiness and metrics are for probes and
// scrapers that must never be turned away, and the page and its static
// files are served from memory.
func rateLimited(path string) bool {
	return strings.HasPrefix(path, "/api/") || path == "/ws"
}

// limitRate answers 429, with Retry-After in seconds, a request to a
// limited path from a client over its budget, and counts it in m. It runs
// before the token check, so that guessing tokens costs budget too.
func limitRate(next http.Handler, l *rateLimiter, m *Metrics) http.Handler {
	if l == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !rateLimited(r.URL.Path) {
			next.ServeHTTP(w, r)
			return
		}
		client := l.client(r)
		ok, wait := l.allow(client)
		if ok {
			next.ServeHTTP(w, r)
			return
		}
		m.rateLimited.Inc()
		secs := max(1, int64(math.Ceil(wait.Seconds())))
		w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
		who := "this address"
		if client.IsValid() {
			who = client.Masked().String()
			if client.Addr().Is4() {
				who = client.Addr().String()
			}
		}
		encode(w, http.StatusTooManyRequests, errorBody{Error: fmt.Sprintf(
			"too many requests from %s (the limit is %g a second, in bursts of %g); retry in %d s",
			who, l.rate, l.burst, secs)})
	})
}
