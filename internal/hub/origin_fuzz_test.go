package hub

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// FuzzOriginAllowed feeds the Origin and Host of a websocket upgrade to
// the origin check. The decision is the one a browser's origin
// (scheme://host[:port]) calls for: no Origin is allowed (not a browser);
// otherwise the origin's host must be the request's, or the origin one of
// those configured, case aside. Nothing after the host changes it.
func FuzzOriginAllowed(f *testing.F) {
	for _, s := range [][2]string{
		{"", "leasehold.test"},
		{"http://leasehold.test", "leasehold.test"},
		{"https://LEASEHOLD.test", "leasehold.test"},
		{"http://leasehold.test:8080", "leasehold.test"},
		{"https://dash.example.com", "leasehold.test"},
		{"https://dash.example.com/path?q#f", "leasehold.test"},
		{"https://dash.example.com.evil.example", "leasehold.test"},
		{"https://evil.example@dash.example.com", "leasehold.test"},
		{"https://dash.example.com@evil.example", "leasehold.test"},
		{"http://dash.example.com", "leasehold.test"},
		{"null", "leasehold.test"},
		{"file://", "leasehold.test"},
		{" https://dash.example.com", "leasehold.test"},
		{"https://[::1]:8080", "[::1]:8080"},
	} {
		f.Add(s[0], s[1])
	}
	h := New(Deps{AllowedOrigins: []string{"https://dash.example.com", "http://localhost:3000"}})
	f.Fuzz(func(t *testing.T, origin, host string) {
		r := &http.Request{Header: http.Header{}, Host: host}
		if origin != "" {
			r.Header.Set("Origin", origin)
		}
		got := h.originAllowed(r)
		if origin == "" {
			if !got {
				t.Fatalf("no Origin, host %q: refused", host)
			}
			return
		}
		u, err := url.Parse(origin)
		if err != nil || u.Host == "" {
			if got {
				t.Fatalf("Origin %q (no host in it), host %q: allowed", origin, host)
			}
			return
		}
		listed := false
		for _, o := range []string{"https://dash.example.com", "http://localhost:3000"} {
			listed = listed || strings.EqualFold(u.Scheme+"://"+u.Host, o)
		}
		if want := strings.EqualFold(u.Host, host) || listed; got != want {
			t.Fatalf("Origin %q (scheme %q, host %q), request host %q: allowed %v, want %v", origin, u.Scheme, u.Host, host, got, want)
		}
	})
}
