package server

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/leasehold/leasehold/internal/name"
)

// Scope names a kind of request a token may make.
type Scope string

// The scopes. A token with ScopeAdmin may make every request, within its
// prefixes.
const (
	// ScopeRead: every GET, the websocket and the dashboard's sign-in.
	ScopeRead Scope = "read"
	// ScopeLease: acquire, renew and release leases.
	ScopeLease Scope = "lease"
	// ScopeProduce: insert tasks, cancel and retry them, and add, replace
	// and remove schedules.
	ScopeProduce Scope = "produce"
	// ScopeWork: claim tasks, and heartbeat, complete, fail, snooze and
	// hand back those claimed.
	ScopeWork Scope = "work"
	// ScopeAdmin: all of the above, and the generator's switch.
	ScopeAdmin Scope = "admin"
)

// AllScopes are the scopes a token may name.
var AllScopes = []Scope{ScopeRead, ScopeLease, ScopeProduce, ScopeWork, ScopeAdmin}

// MinTokenBytes is the shortest token the server takes: a token is the only
// thing between a caller and the API, so it must not be guessable.
const MinTokenBytes = 16

// Token is one API token and what it may do. Each prefix list, when not
// empty, bounds the names the token may act on: Resources the leases (and a
// task's or schedule's lock), Queues and Kinds the tasks and schedules,
// Holders the holder of a lease and the processor of a task. Holders is
// what binds a lease to the token that took it: another token, whose
// holders do not match, cannot renew or release it.
type Token struct {
	Name      string   `json:"name"`
	Scopes    []Scope  `json:"scopes"`
	Resources []string `json:"resources,omitempty"`
	Queues    []string `json:"queues,omitempty"`
	Kinds     []string `json:"kinds,omitempty"`
	Holders   []string `json:"holders,omitempty"`

	hash [sha256.Size]byte // of the secret
}

// tokenSpec is a Token as a tokens file writes it: the secret itself
// ("token") or its SHA-256 in hex ("sha256"), so that the file need not
// hold the secret.
type tokenSpec struct {
	Name      string   `json:"name"`
	Token     string   `json:"token,omitempty"`
	SHA256    string   `json:"sha256,omitempty"`
	Scopes    []Scope  `json:"scopes"`
	Resources []string `json:"resources,omitempty"`
	Queues    []string `json:"queues,omitempty"`
	Kinds     []string `json:"kinds,omitempty"`
	Holders   []string `json:"holders,omitempty"`
}

// ParseTokens reads a JSON array of tokens:
//
//	[{"name": "dashboard", "token": "…", "scopes": ["read"]},
//	 {"name": "billing", "sha256": "…", "scopes": ["produce", "work"],
//	  "queues": ["billing"], "holders": ["billing/"]}]
//
// Each needs a name (unique), a secret of at least MinTokenBytes (or its
// SHA-256), and one or more scopes; the prefix lists are optional.
func ParseTokens(data []byte) ([]Token, error) {
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	var specs []tokenSpec
	if err := dec.Decode(&specs); err != nil {
		return nil, fmt.Errorf("tokens: %w; write a JSON array of {\"name\", \"token\" or \"sha256\", \"scopes\", and optional \"resources\", \"queues\", \"kinds\", \"holders\"}", err)
	}
	var (
		tokens []Token
		errs   []error
		names  = map[string]bool{}
		hashes = map[[sha256.Size]byte]bool{}
	)
	for i, s := range specs {
		where := fmt.Sprintf("tokens[%d]", i)
		if s.Name != "" {
			where += " (" + s.Name + ")"
		}
		if err := name.Check(where+" name", s.Name); err != nil {
			errs = append(errs, err)
		} else if names[s.Name] {
			errs = append(errs, fmt.Errorf("%s: the name is given twice; name each token once", where))
		}
		names[s.Name] = true
		t := Token{Name: s.Name, Scopes: s.Scopes, Resources: s.Resources, Queues: s.Queues, Kinds: s.Kinds, Holders: s.Holders}
		switch {
		case s.Token != "" && s.SHA256 != "":
			errs = append(errs, fmt.Errorf("%s: give the token or its sha256, not both", where))
		case s.Token != "":
			if err := CheckSecret(s.Token); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", where, err))
			}
			t.hash = sha256.Sum256([]byte(s.Token))
		case s.SHA256 != "":
			b, err := hex.DecodeString(s.SHA256)
			if err != nil || len(b) != sha256.Size {
				errs = append(errs, fmt.Errorf("%s: sha256 must be 64 hex digits (sha256sum of the token)", where))
			}
			copy(t.hash[:], b)
		default:
			errs = append(errs, fmt.Errorf("%s: no \"token\" nor \"sha256\": give the secret or its SHA-256", where))
		}
		if hashes[t.hash] {
			errs = append(errs, fmt.Errorf("%s: the same secret as another token; give each token its own", where))
		}
		hashes[t.hash] = true
		if len(s.Scopes) == 0 {
			errs = append(errs, fmt.Errorf("%s: no scopes; give some of %s", where, scopeList()))
		}
		for _, sc := range s.Scopes {
			if !slices.Contains(AllScopes, sc) {
				errs = append(errs, fmt.Errorf("%s: unknown scope %q; use some of %s", where, sc, scopeList()))
			}
		}
		for field, prefixes := range map[string][]string{"resources": s.Resources, "queues": s.Queues, "kinds": s.Kinds, "holders": s.Holders} {
			for _, p := range prefixes {
				if p == "" || len(p) > name.MaxBytes {
					errs = append(errs, fmt.Errorf("%s: %s has the prefix %q; a prefix is 1 to %d bytes", where, field, p, name.MaxBytes))
				}
			}
		}
		tokens = append(tokens, t)
	}
	if len(specs) == 0 {
		errs = append(errs, errors.New("tokens: the list is empty; give at least one token"))
	}
	return tokens, errors.Join(errs...)
}

func scopeList() string {
	names := make([]string, len(AllScopes))
	for i, s := range AllScopes {
		names[i] = string(s)
	}
	return strings.Join(names, ", ")
}

// CheckSecret refuses a token too short to be a secret.
func CheckSecret(secret string) error {
	if len(secret) < MinTokenBytes {
		return fmt.Errorf("the token is %d bytes long; give one of at least %d (e.g. openssl rand -hex 32)", len(secret), MinTokenBytes)
	}
	return nil
}

// FullToken is the one token of --api-token: every scope, no prefixes.
func FullToken(secret string) Token {
	return Token{Name: "api-token", Scopes: []Scope{ScopeAdmin}, hash: sha256.Sum256([]byte(secret))}
}

// may reports whether the token has scope s (or admin).
func (t *Token) may(s Scope) bool {
	return slices.Contains(t.Scopes, ScopeAdmin) || slices.Contains(t.Scopes, s)
}

// within reports whether v begins with one of prefixes, or prefixes is empty.
func within(prefixes []string, v string) bool {
	if len(prefixes) == 0 {
		return true
	}
	for _, p := range prefixes {
		if strings.HasPrefix(v, p) {
			return true
		}
	}
	return false
}

// tokens is the server's set of tokens. Its lookup compares the hash of a
// presented secret with every token's, in time that does not depend on
// which (if any) matches.
type tokens []Token

func (ts tokens) find(secret string) *Token {
	h := sha256.Sum256([]byte(secret))
	var found *Token
	for i := range ts {
		if subtle.ConstantTimeCompare(h[:], ts[i].hash[:]) == 1 {
			found = &ts[i]
		}
	}
	return found
}

func (ts tokens) named(n string) *Token {
	for i := range ts {
		if ts[i].Name == n {
			return &ts[i]
		}
	}
	return nil
}

// principalKey holds the request's token in its context.
type principalKey struct{}

// principal is the token a request came with; nil when the server has no
// tokens (every request may do everything).
func principal(r *http.Request) *Token {
	t, _ := r.Context().Value(principalKey{}).(*Token)
	return t
}

func withPrincipal(r *http.Request, t *Token) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), principalKey{}, t))
}

// need is a route that asks for scope s of the request's token.
func need(s Scope, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if t := principal(r); t != nil && !t.may(s) {
			encode(w, http.StatusForbidden, errorBody{Error: fmt.Sprintf("the token %q may not %s: it has the scopes %v, and this needs %q (or admin)",
				t.Name, scopeDoes[s], t.Scopes, s)})
			return
		}
		h.ServeHTTP(w, r)
	})
}

var scopeDoes = map[Scope]string{
	ScopeRead: "read", ScopeLease: "take or give up leases", ScopeProduce: "insert, cancel or retry tasks, or change schedules",
	ScopeWork: "work tasks", ScopeAdmin: "start or stop the generator",
}

// mayLease refuses a lease operation on resource as holder that the
// request's token's prefixes do not allow.
func mayLease(r *http.Request, resource, holder string) error {
	t := principal(r)
	switch {
	case t == nil:
		return nil
	case !within(t.Resources, resource):
		return forbiddenf("the token %q may not hold %q: its resources begin with %q", t.Name, resource, t.Resources)
	case !within(t.Holders, holder):
		return forbiddenf("the token %q may not act as the holder %q: its holders begin with %q", t.Name, holder, t.Holders)
	}
	return nil
}

// mayTask refuses an operation on a task of queue and kind (and, when not
// empty, processor and lock) that the request's token's prefixes do not
// allow.
func mayTask(r *http.Request, queue, kind, processor, lock string) error {
	t := principal(r)
	switch {
	case t == nil:
		return nil
	case !within(t.Queues, queue):
		return forbiddenf("the token %q may not touch tasks of the queue %q: its queues begin with %q", t.Name, queue, t.Queues)
	case !within(t.Kinds, kind):
		return forbiddenf("the token %q may not touch tasks of the kind %q: its kinds begin with %q", t.Name, kind, t.Kinds)
	case processor != "" && !within(t.Holders, processor):
		return forbiddenf("the token %q may not act as the processor %q: its holders begin with %q", t.Name, processor, t.Holders)
	case lock != "" && !within(t.Resources, lock):
		return forbiddenf("the token %q may not take the lock %q: its resources begin with %q", t.Name, lock, t.Resources)
	}
	return nil
}

// mayNames refuses a claim for queues and kinds, any of them (none named:
// all) beyond the token's prefixes: a token bounded to some queues or kinds
// claims by naming them.
func mayNames(r *http.Request, queues, kinds []string, processor string) error {
	t := principal(r)
	if t == nil {
		return nil
	}
	if len(t.Queues) > 0 && len(queues) == 0 {
		return forbiddenf("the token %q may work only the queues beginning with %q: name them in \"queues\"", t.Name, t.Queues)
	}
	if len(t.Kinds) > 0 && len(kinds) == 0 {
		return forbiddenf("the token %q may work only the kinds beginning with %q: name them in \"kinds\"", t.Name, t.Kinds)
	}
	for _, q := range queues {
		if !within(t.Queues, q) {
			return forbiddenf("the token %q may not work the queue %q: its queues begin with %q", t.Name, q, t.Queues)
		}
	}
	for _, k := range kinds {
		if !within(t.Kinds, k) {
			return forbiddenf("the token %q may not work the kind %q: its kinds begin with %q", t.Name, k, t.Kinds)
		}
	}
	if !within(t.Holders, processor) {
		return forbiddenf("the token %q may not act as the processor %q: its holders begin with %q", t.Name, processor, t.Holders)
	}
	return nil
}

// mayRead reports whether the request's token may read a task of queue and
// kind (lists leave out the others).
func mayRead(r *http.Request, queue, kind string) bool {
	t := principal(r)
	return t == nil || (within(t.Queues, queue) && within(t.Kinds, kind))
}

// ---- The dashboard's session ------------------------------------------------

// sessionTTL is how long a sign-in lasts.
const sessionTTL = 12 * time.Hour

// A session cookie names its token and its expiry, signed with a key made
// from the token's own secret: any replica with the same tokens can check
// it, none can forge it without the secret, and the cookie holds neither
// the secret nor anything that leads to it. A session ends at its expiry,
// when its token is removed or changed, or at sign-out (the browser drops
// the cookie).
func sessionValue(t *Token, expires time.Time) string {
	var exp [8]byte
	binary.BigEndian.PutUint64(exp[:], uint64(expires.Unix()))
	msg := append([]byte(t.Name+"\x00"), exp[:]...)
	return base64.RawURLEncoding.EncodeToString(msg) + "." + base64.RawURLEncoding.EncodeToString(sessionMAC(t, msg))
}

func sessionMAC(t *Token, msg []byte) []byte {
	key := sha256.Sum256(append([]byte("leasehold session\x00"), t.hash[:]...))
	m := hmac.New(sha256.New, key[:])
	m.Write(msg)
	return m.Sum(nil)
}

// sessionToken returns the token of a session cookie's value, nil when it
// is not one of ours, was altered, or expired.
func (ts tokens) sessionToken(value string, now time.Time) *Token {
	msgPart, macPart, ok := strings.Cut(value, ".")
	if !ok {
		return nil
	}
	msg, err1 := base64.RawURLEncoding.DecodeString(msgPart)
	mac, err2 := base64.RawURLEncoding.DecodeString(macPart)
	if err1 != nil || err2 != nil || len(msg) < 9 {
		return nil
	}
	n, exp := string(msg[:len(msg)-9]), msg[len(msg)-8:]
	t := ts.named(n)
	if t == nil || !hmac.Equal(mac, sessionMAC(t, msg)) {
		return nil
	}
	if now.After(time.Unix(int64(binary.BigEndian.Uint64(exp)), 0)) {
		return nil
	}
	return t
}

// or is v, or def when v is empty.
func or(v, def string) string {
	if v == "" {
		return def
	}
	return v
}
