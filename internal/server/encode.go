package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/leasehold/leasehold/internal/name"
)

// maxBodyBytes bounds every request body; more is answered with 413.
const maxBodyBytes = 1 << 20

// maxNameBytes bounds resource, holder and processor names.
const maxNameBytes = 255

// badRequest is input the client must fix; its message says how.
type badRequest struct{ msg string }

func (e *badRequest) Error() string { return e.msg }

func badRequestf(format string, args ...any) error {
	return &badRequest{msg: fmt.Sprintf(format, args...)}
}

// encode writes v as the JSON response with the given status.
func encode(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	_ = enc.Encode(v) // the status is sent; a broken connection is the client's
}

// encodeFlushed is encode for an answer the handler must know was handed to the connection:
// it writes and flushes, and returns the error of either (a connection the client closed,
// when the server has seen it closed; a write that succeeds may still never be read). A
// writer that cannot flush (a wrapper of the caller's without Unwrap) counts as delivered.
func encodeFlushed(w http.ResponseWriter, status int, v any) error {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if err := json.NewEncoder(w).Encode(v); err != nil {
		return err
	}
	if err := http.NewResponseController(w).Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return err
	}
	return nil
}

// validator is a request body that checks itself after decoding.
type validator interface {
	validate() error
}

// decode reads the request body (see readBody) and parses it (see parseBody).
func decode[T validator](w http.ResponseWriter, r *http.Request) (T, error) {
	body, err := readBody(w, r)
	if err != nil {
		var zero T
		return zero, err
	}
	return parseBody[T](body)
}

// readBody reads the whole request body, refusing more than maxBodyBytes
// (an *http.MaxBytesError, answered 413; the server then closes the
// connection rather than read the rest).
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		return nil, decodeError(err)
	}
	return body, nil
}

// parseBody parses body, exactly one JSON value, into a new T, refusing
// unknown fields, trailing data, and a member given twice or as null (see
// checkMembers), then validates it. It is decode without the request: a
// function of the bytes alone, which the fuzz tests feed. Every error it
// returns is a *badRequest.
func parseBody[T validator](body []byte) (T, error) {
	var v T
	// encoding/json turns invalid UTF-8 into U+FFFD without a word: refuse
	// it here, or a name would be stored other than as it was sent.
	if !utf8.Valid(body) {
		return v, badRequestf("request body is not valid UTF-8; send UTF-8 encoded JSON")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		return v, decodeError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return v, badRequestf("request body has data after the JSON object; send exactly one JSON object")
	}
	// Nor may an escape decode to what PostgreSQL cannot store or Go would
	// quietly replace (\u0000, a lone surrogate). checkJSON needs valid
	// JSON, which the body now is.
	if err := checkJSON("request body", body, false); err != nil {
		return v, err
	}
	if err := checkMembers[T](body); err != nil {
		return v, err
	}
	return v, v.validate()
}

// optional is a field type whose absence asks for a default: opt[T]. Its
// valueType is the type of the value it holds, for messages.
type optional interface{ valueType() reflect.Type }

// member is what checkMembers knows of a field of a request object.
type member struct {
	name string // as the json tag names it
	// nullable fields take null as a value of their own: a json.RawMessage,
	// the client's own JSON (task_output, where null means "no result";
	// task_data, whose validator says it must be an object).
	nullable bool
	// optional members ask for a default when absent: a pointer or an
	// opt[T], unless its tag says required:"true" (an opt[T] whose
	// validator insists on it, such as a snooze's delay_seconds).
	optional bool
	kind     string // what to send instead of null: "an integer"
}

// membersCache holds the members of each request type checkMembers has seen.
var membersCache sync.Map // reflect.Type → []member

// membersOf returns the members of a request object of type t, or nil when
// t is not a struct of JSON fields (a type that decodes itself, such as
// jsonValue, whose parts are checked when decoded further).
func membersOf(t reflect.Type) []member {
	if ms, ok := membersCache.Load(t); ok {
		return ms.([]member)
	}
	unmarshaler := reflect.TypeFor[json.Unmarshaler]()
	var ms []member
	if t.Kind() == reflect.Struct && !reflect.PointerTo(t).Implements(unmarshaler) {
		for f := range t.Fields() {
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if !f.IsExported() || name == "-" {
				continue
			}
			if name == "" {
				name = f.Name
			}
			m := member{name: name, nullable: f.Type == reflect.TypeFor[json.RawMessage]()}
			value := f.Type
			if o, ok := reflect.Zero(f.Type).Interface().(optional); ok {
				m.optional, value = true, o.valueType()
			} else if f.Type.Kind() == reflect.Pointer {
				m.optional, value = true, f.Type.Elem()
			}
			if f.Tag.Get("required") == "true" {
				m.optional = false
			}
			m.kind = jsonKind(value.Kind().String())
			ms = append(ms, m)
		}
	}
	membersCache.Store(t, ms)
	return ms
}

// lookup returns the member a key of the body sets: encoding/json matches
// a key to a field's name exactly or, failing that, whatever its case, so
// that "Resource" sets resource too.
func lookup(ms []member, key string) (member, bool) {
	for _, m := range ms {
		if m.name == key {
			return m, true
		}
	}
	for _, m := range ms {
		if strings.EqualFold(m.name, key) {
			return m, true
		}
	}
	return member{}, false
}

// checkMembers refuses what encoding/json would quietly accept in raw, a
// JSON object decoded into a T: a member given twice, which it reads as
// the last one (a client's merge gone wrong, or a proxy's and a client's
// idea of the body disagreeing), and a null, which it reads as the member
// left out: leaving a member out is how a client asks for a default, and a
// null is far more likely an unset variable than that wish. A member that
// takes null as a value of its own (nullable) keeps it. Only the object's
// own members are checked: the values of task_data and task_output are
// the client's own JSON, stored and handed back as they are, duplicate
// keys and all; leasehold reads nothing in them but a sleep task's
// sleep_duration_seconds. raw must be valid JSON; a T that is not a struct
// of fields, or a raw that is not an object, passes.
func checkMembers[T any](raw []byte) error {
	ms := membersOf(reflect.TypeFor[T]())
	if ms == nil {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil
	}
	seen := make(map[string]string, len(ms)) // member name → the key that set it
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return decodeError(err)
		}
		key, _ := tok.(string)
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return decodeError(err)
		}
		m, ok := lookup(ms, key)
		if !ok {
			continue // unknown fields are refused by the decoder
		}
		switch first, twice := seen[m.name]; {
		case twice && first == key:
			return badRequestf("%q appears twice in the body; give each key once", key)
		case twice:
			return badRequestf("%q appears twice in the body (as %q and %q, which name the same field); give each key once", m.name, first, key)
		}
		seen[m.name] = key
		if !m.nullable && string(value) == "null" {
			if m.optional {
				return badRequestf("%q is null; leave it out for the default, or give %s", m.name, m.kind)
			}
			return badRequestf("%q is null; give %s", m.name, m.kind)
		}
	}
	return nil
}

// decodeError turns an encoding/json error into a message a user can act on.
func decodeError(err error) error {
	var (
		maxErr    *http.MaxBytesError
		syntaxErr *json.SyntaxError
		typeErr   *json.UnmarshalTypeError
	)
	switch {
	case errors.As(err, &maxErr):
		return err
	case errors.Is(err, io.EOF):
		return badRequestf("request body is empty; send a JSON object")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return badRequestf("request body is truncated JSON; send a complete JSON object")
	case errors.As(err, &syntaxErr):
		return badRequestf("request body is not valid JSON (at byte %d: %s); send a JSON object", syntaxErr.Offset, syntaxErr.Error())
	case errors.As(err, &typeErr):
		if typeErr.Field == "" {
			return badRequestf("request body must be a JSON object, not %s", typeErr.Value)
		}
		return badRequestf("field %q must be %s, not %s", typeErr.Field, jsonKind(typeErr.Type.Kind().String()), typeErr.Value)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		field := strings.TrimPrefix(err.Error(), "json: unknown field ")
		return badRequestf("unknown field %s; remove it (GET /api/openapi.json gives the fields of every request)", field)
	default:
		return badRequestf("request body could not be read as JSON: %v", err)
	}
}

func jsonKind(goKind string) string {
	switch goKind {
	case "int", "int32", "int64":
		return "an integer"
	case "string":
		return "a string"
	case "struct", "map":
		return "an object"
	case "slice":
		return "an array"
	case "bool":
		return "true or false"
	case "float32", "float64":
		return "a number"
	default:
		return "a " + goKind
	}
}

// firstError returns the first of a request's check results that is an
// error, the fields checked in the order a user reads them.
func firstError(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// checkName validates a name (a resource, holder, processor, kind, queue,
// unique key, lock or schedule name) by the one rule of internal/name.
func checkName(field, value string) error {
	if err := name.Check(strconv.Quote(field), value); err != nil {
		return badRequestf("%s", err)
	}
	return nil
}

// checkResource validates the resource of a lease (a task's or a
// schedule's lock included): a name, outside the reserved namespace, which
// only leasehold's own replicas acquire, renew and release (403).
func checkResource(field, value string) error {
	if err := checkName(field, value); err != nil {
		return err
	}
	if name.Reserved(value) {
		return forbiddenf("%q %q is in leasehold's reserved namespace %q, whose leases only leasehold's own replicas take (the reaper's, the scheduler's, each replica's); choose a resource outside it",
			field, value, name.ReservedPrefix)
	}
	return nil
}

// checkTTL validates an optional ttl_seconds.
func checkTTL(ttl *int64) error {
	if ttl != nil && (*ttl < 1 || *ttl > 3600) {
		return badRequestf(`"ttl_seconds" is %d; it must be between 1 and 3600`, *ttl)
	}
	return nil
}

// checkFence validates an optional fence.
func checkFence(fence *int64) error {
	if fence != nil && *fence < 1 {
		return badRequestf(`"fence" is %d; a fence is a positive integer from an acquisition`, *fence)
	}
	return nil
}

// pathID parses the {id} path value (see parseID).
func pathID(r *http.Request) (int64, error) { return parseID(r.PathValue("id")) }

// parseID parses an id: a positive integer, in digits only, with no sign
// and no leading zero, so that every id has one spelling.
func parseID(raw string) (int64, error) {
	id, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || id < 1 || strconv.FormatInt(id, 10) != raw {
		return 0, badRequestf("id %q is not a positive integer", raw)
	}
	return id, nil
}

// queryInt parses an optional integer query parameter within [lo, hi].
func queryInt(q url.Values, name string, def, lo, hi int64) (int64, error) {
	raw := q.Get(name)
	if raw == "" {
		return def, nil
	}
	v, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || v < lo || v > hi {
		return 0, badRequestf("query parameter %s=%q must be an integer between %d and %d", name, raw, lo, hi)
	}
	return v, nil
}

// queryName reads an optional query parameter that is (the start of) a
// resource name: what checkName allows, or empty. PostgreSQL would refuse
// invalid UTF-8 or a NUL with an error, and no name has a control character.
func queryName(q url.Values, name string) (string, error) {
	v := q.Get(name)
	switch {
	case len(v) > maxNameBytes:
		return "", badRequestf("query parameter %s is %d bytes long; the limit is %d bytes", name, len(v), maxNameBytes)
	case !utf8.ValidString(v):
		return "", badRequestf("query parameter %s is not valid UTF-8; percent-encode the UTF-8 bytes of the name", name)
	case strings.ContainsFunc(v, unicode.IsControl):
		return "", badRequestf("query parameter %s contains a control character, which no name has", name)
	}
	return v, nil
}

// discardBody reads a body the route does not use, up to the body limit:
// one over it is refused (413) as on every route.
func discardBody(w http.ResponseWriter, r *http.Request) error {
	if _, err := io.Copy(io.Discard, http.MaxBytesReader(w, r.Body, maxBodyBytes)); err != nil {
		var tooBig *http.MaxBytesError
		if !errors.As(err, &tooBig) {
			err = badRequestf("request body could not be read: %v", err)
		}
		return err
	}
	return nil
}
