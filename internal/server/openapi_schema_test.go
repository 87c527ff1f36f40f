package server_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"math/big"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// schemaValidator checks JSON values against the JSON Schema (2020-12)
// subset openapi.json uses: type (a name or an array of names, "null"
// among them), enum, const, properties, required, additionalProperties,
// items, minItems, maxItems, minLength, maxLength, pattern, minimum,
// maximum, format (date-time, int32, int64), oneOf and $ref to a place in
// the document. A schema with any other keyword is refused, not silently
// passed: the document cannot say more than the test checks.
type schemaValidator struct {
	// root is the whole document, where $refs point.
	root any
	// closed makes an object schema that lists properties and says nothing
	// of others refuse others. Responses are checked so: the document stays
	// open to fields a later server adds (a client must not break on them),
	// yet a field the server sends and the document does not name fails.
	closed bool
}

// annotations are keywords that describe and constrain nothing.
var annotations = map[string]bool{
	"description": true, "title": true, "summary": true, "example": true, "examples": true,
	"default": true, "deprecated": true, "readOnly": true, "writeOnly": true, "$comment": true,
}

// decodeJSON parses one JSON value, numbers kept as json.Number so that
// integers stay exact.
func decodeJSON(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, fmt.Errorf("data after the JSON value")
	}
	return v, nil
}

// resolve follows a JSON pointer ("#/components/schemas/Lease") from root.
func resolve(root any, ref string) (any, error) {
	rest, ok := strings.CutPrefix(ref, "#")
	if !ok {
		return nil, fmt.Errorf("$ref %q is not a pointer into this document", ref)
	}
	node := root
	if rest == "" {
		return node, nil
	}
	for _, tok := range strings.Split(strings.TrimPrefix(rest, "/"), "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		m, ok := node.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("$ref %q: %q is not in an object", ref, tok)
		}
		if node, ok = m[tok]; !ok {
			return nil, fmt.Errorf("$ref %q: no %q", ref, tok)
		}
	}
	return node, nil
}

// validate returns the first way v breaks schema, naming where in v.
func (s schemaValidator) validate(schema, v any) error {
	return s.check(schema, v, "$", 0)
}

func (s schemaValidator) check(schema, v any, at string, depth int) error {
	if depth > 64 {
		return fmt.Errorf("%s: schema nests too deep (a $ref loop?)", at)
	}
	switch sc := schema.(type) {
	case bool:
		if !sc {
			return fmt.Errorf("%s: no value is allowed here", at)
		}
		return nil
	case map[string]any:
		return s.checkObject(sc, v, at, depth)
	default:
		return fmt.Errorf("%s: schema is %T, not an object or a boolean", at, schema)
	}
}

func (s schemaValidator) checkObject(sc map[string]any, v any, at string, depth int) error {
	for k := range sc {
		if !annotations[k] && !slices.Contains(knownKeywords, k) {
			return fmt.Errorf("%s: schema keyword %q is not one the test's validator knows; teach it or say it otherwise", at, k)
		}
	}
	if f, ok := sc["format"]; ok && !slices.Contains([]any{"date-time", "int32", "int64"}, f) {
		return fmt.Errorf("%s: format %v is not one the test's validator knows", at, f)
	}
	if ref, ok := sc["$ref"].(string); ok {
		target, err := resolve(s.root, ref)
		if err != nil {
			return fmt.Errorf("%s: %w", at, err)
		}
		if err := s.check(target, v, at, depth+1); err != nil {
			return err
		}
	}
	if t, ok := sc["type"]; ok {
		if err := checkType(t, v, at); err != nil {
			return err
		}
	}
	if enum, ok := sc["enum"].([]any); ok && !slices.ContainsFunc(enum, func(e any) bool { return sameJSON(e, v) }) {
		return fmt.Errorf("%s: %s is not one of %s", at, show(v), show(enum))
	}
	if c, ok := sc["const"]; ok && !sameJSON(c, v) {
		return fmt.Errorf("%s: %s is not %s", at, show(v), show(c))
	}
	switch x := v.(type) {
	case string:
		if err := checkString(sc, x, at); err != nil {
			return err
		}
	case json.Number:
		if err := checkNumber(sc, x, at); err != nil {
			return err
		}
	case []any:
		if err := s.checkArray(sc, x, at, depth); err != nil {
			return err
		}
	case map[string]any:
		if err := s.checkProperties(sc, x, at, depth); err != nil {
			return err
		}
	}
	if one, ok := sc["oneOf"].([]any); ok {
		var matched []int
		var errs []string
		for i, branch := range one {
			if err := s.check(branch, v, at, depth+1); err != nil {
				errs = append(errs, err.Error())
				continue
			}
			matched = append(matched, i)
		}
		switch len(matched) {
		case 1:
		case 0:
			return fmt.Errorf("%s: matches none of oneOf: %s", at, strings.Join(errs, "; "))
		default:
			return fmt.Errorf("%s: matches oneOf's branches %v, not exactly one", at, matched)
		}
	}
	return nil
}

var knownKeywords = []string{
	"$ref", "type", "enum", "const", "properties", "required", "additionalProperties", "items",
	"minItems", "maxItems", "minLength", "maxLength", "pattern", "minimum", "maximum", "format", "oneOf",
	"dependentRequired",
}

// checkType checks v against a type name or an array of them.
func checkType(t, v any, at string) error {
	var names []any
	switch x := t.(type) {
	case string:
		names = []any{x}
	case []any:
		names = x
	default:
		return fmt.Errorf("%s: type is %s, not a name or an array of names", at, show(t))
	}
	for _, n := range names {
		if isType(n, v) {
			return nil
		}
	}
	return fmt.Errorf("%s: %s is not of type %s", at, show(v), show(t))
}

func isType(name, v any) bool {
	switch name {
	case "null":
		return v == nil
	case "boolean":
		_, ok := v.(bool)
		return ok
	case "string":
		_, ok := v.(string)
		return ok
	case "number":
		_, ok := v.(json.Number)
		return ok
	case "integer":
		n, ok := v.(json.Number)
		if !ok {
			return false
		}
		f, ok := bigNumber(n)
		return ok && f.IsInt()
	case "array":
		_, ok := v.([]any)
		return ok
	case "object":
		_, ok := v.(map[string]any)
		return ok
	}
	return false
}

func bigNumber(n json.Number) (*big.Float, bool) {
	f, ok := new(big.Float).SetPrec(256).SetString(n.String())
	return f, ok
}

// schemaNumber reads a number keyword of a schema.
func schemaNumber(sc map[string]any, key string) (*big.Float, bool) {
	n, ok := sc[key].(json.Number)
	if !ok {
		return nil, false
	}
	return bigNumber(n)
}

// schemaInt reads a non-negative integer keyword of a schema.
func schemaInt(sc map[string]any, key string) (int, bool) {
	n, ok := sc[key].(json.Number)
	if !ok {
		return 0, false
	}
	i, err := n.Int64()
	return int(i), err == nil
}

func checkString(sc map[string]any, s, at string) error {
	n := utf8.RuneCountInString(s)
	if lo, ok := schemaInt(sc, "minLength"); ok && n < lo {
		return fmt.Errorf("%s: %q is shorter than %d characters", at, s, lo)
	}
	if hi, ok := schemaInt(sc, "maxLength"); ok && n > hi {
		return fmt.Errorf("%s: a string of %d characters is longer than %d", at, n, hi)
	}
	if p, ok := sc["pattern"].(string); ok {
		re, err := regexp.Compile(ecmaPattern(p))
		if err != nil {
			return fmt.Errorf("%s: pattern %q: %w", at, p, err)
		}
		if !re.MatchString(s) {
			return fmt.Errorf("%s: %q does not match %s", at, s, p)
		}
	}
	if sc["format"] == "date-time" {
		if _, err := time.Parse(time.RFC3339Nano, s); err != nil {
			return fmt.Errorf("%s: %q is not an RFC 3339 date-time", at, s)
		}
	}
	return nil
}

// ecmaPattern writes a JSON Schema pattern, an ECMA-262 regular expression,
// in Go's syntax for what the two spell differently: a \uXXXX escape is
// \x{XXXX} to Go. The rest of what openapi.json uses (classes, ranges,
// anchors, \. and the like) is spelled alike.
func ecmaPattern(p string) string {
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		if p[i] != '\\' || i+1 == len(p) {
			b.WriteByte(p[i])
			continue
		}
		if p[i+1] == 'u' && i+6 <= len(p) {
			if _, err := strconv.ParseUint(p[i+2:i+6], 16, 16); err == nil {
				b.WriteString(`\x{` + p[i+2:i+6] + `}`)
				i += 5
				continue
			}
		}
		b.WriteString(p[i : i+2]) // another escape, \\ included, as it is
		i++
	}
	return b.String()
}

func checkNumber(sc map[string]any, n json.Number, at string) error {
	f, ok := bigNumber(n)
	if !ok {
		return fmt.Errorf("%s: %s is not a number", at, n)
	}
	if lo, ok := schemaNumber(sc, "minimum"); ok && f.Cmp(lo) < 0 {
		return fmt.Errorf("%s: %s is below the minimum %s", at, n, sc["minimum"])
	}
	if hi, ok := schemaNumber(sc, "maximum"); ok && f.Cmp(hi) > 0 {
		return fmt.Errorf("%s: %s is above the maximum %s", at, n, sc["maximum"])
	}
	if bits := map[any]uint{"int32": 32, "int64": 64}[sc["format"]]; bits > 0 {
		limit := new(big.Float).SetInt(new(big.Int).Lsh(big.NewInt(1), bits-1))
		if !f.IsInt() || f.Cmp(limit) >= 0 || f.Cmp(new(big.Float).Neg(limit)) < 0 {
			return fmt.Errorf("%s: %s is not an %v", at, n, sc["format"])
		}
	}
	return nil
}

func (s schemaValidator) checkArray(sc map[string]any, a []any, at string, depth int) error {
	if lo, ok := schemaInt(sc, "minItems"); ok && len(a) < lo {
		return fmt.Errorf("%s: %d items, fewer than %d", at, len(a), lo)
	}
	if hi, ok := schemaInt(sc, "maxItems"); ok && len(a) > hi {
		return fmt.Errorf("%s: %d items, more than %d", at, len(a), hi)
	}
	if items, ok := sc["items"]; ok {
		for i, item := range a {
			if err := s.check(items, item, fmt.Sprintf("%s[%d]", at, i), depth+1); err != nil {
				return err
			}
		}
	}
	return nil
}

func (s schemaValidator) checkProperties(sc map[string]any, o map[string]any, at string, depth int) error {
	if req, ok := sc["required"].([]any); ok {
		for _, name := range req {
			if _, ok := o[name.(string)]; !ok {
				return fmt.Errorf("%s: the required property %q is missing", at, name)
			}
		}
	}
	if deps, ok := sc["dependentRequired"].(map[string]any); ok {
		for _, name := range slices.Sorted(maps.Keys(deps)) {
			if _, present := o[name]; !present {
				continue
			}
			for _, need := range deps[name].([]any) {
				if _, ok := o[need.(string)]; !ok {
					return fmt.Errorf("%s: the property %q needs %q, which is missing", at, name, need)
				}
			}
		}
	}
	props, hasProps := sc["properties"].(map[string]any)
	additional, hasAdditional := sc["additionalProperties"]
	if !hasAdditional && hasProps && s.closed {
		additional, hasAdditional = false, true
	}
	// In the order of the names, so that the first error is always the same.
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k := range o {
			if !yield(k) {
				return
			}
		}
	}) {
		where := at + "." + name
		if p, ok := props[name]; ok {
			if err := s.check(p, o[name], where, depth+1); err != nil {
				return err
			}
			continue
		}
		if hasAdditional {
			if additional == false {
				return fmt.Errorf("%s: the property %q is not in the schema", at, name)
			}
			if err := s.check(additional, o[name], where, depth+1); err != nil {
				return err
			}
		}
	}
	return nil
}

// sameJSON compares two decoded JSON values, numbers by value.
func sameJSON(a, b any) bool {
	if x, ok := a.(json.Number); ok {
		y, ok := b.(json.Number)
		if !ok {
			return false
		}
		fx, okx := bigNumber(x)
		fy, oky := bigNumber(y)
		return okx && oky && fx.Cmp(fy) == 0
	}
	ja, errA := json.Marshal(a)
	jb, errB := json.Marshal(b)
	return errA == nil && errB == nil && bytes.Equal(ja, jb)
}

// show writes v short, for a message.
func show(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	if len(b) > 120 {
		return string(b[:120]) + "…"
	}
	return string(b)
}

// TestSchemaValidator: the validator the OpenAPI test relies on accepts
// what a schema allows and refuses what it does not, so that a passing
// conformance test means something.
func TestSchemaValidator(t *testing.T) {
	t.Parallel()
	root, err := decodeJSON([]byte(`{"components": {"schemas": {
		"Thing": {
			"type": "object",
			"properties": {
				"id": {"type": "integer", "format": "int64", "minimum": 1},
				"name": {"type": "string", "minLength": 1, "maxLength": 5},
				"state": {"type": "string", "enum": ["on", "off"]},
				"kind": {"type": "string", "const": "thing"},
				"at": {"type": ["string", "null"], "format": "date-time", "pattern": "Z$"},
				"tags": {"type": "array", "items": {"type": "string", "pattern": "^[^\\u0000-\\u001f\\\\]+$"}, "maxItems": 2},
				"ratio": {"type": "number", "maximum": 1},
				"any": {"description": "anything"}
			},
			"required": ["id", "name"],
			"additionalProperties": false
		},
		"Open": {"type": "object", "properties": {"a": {"type": "boolean"}}},
		"Either": {"oneOf": [{"$ref": "#/components/schemas/Thing"}, {"type": "array", "minItems": 1, "items": {"$ref": "#/components/schemas/Thing"}}]},
		"Overlap": {"oneOf": [{"type": "integer"}, {"type": "number"}]},
		"Small": {"type": "integer", "format": "int32"},
		"Odd": {"type": "string", "uniqueItems": true},
		"Mail": {"type": "string", "format": "email"}
	}}}`))
	if err != nil {
		t.Fatal(err)
	}
	schema := func(name string) any { return map[string]any{"$ref": "#/components/schemas/" + name} }
	for _, tc := range []struct {
		name, schema, value string
		closed              bool
		wantErr             string // empty: valid
	}{
		{"a full thing", "Thing", `{"id": 7, "name": "abc", "state": "on", "kind": "thing", "at": "2026-01-02T03:04:05.678Z", "tags": ["x"], "ratio": 0.5, "any": {"x": [1]}}`, false, ""},
		{"null where null is a type", "Thing", `{"id": 7, "name": "abc", "at": null}`, false, ""},
		{"an integer written 7.0", "Thing", `{"id": 7.0, "name": "abc"}`, false, ""},
		{"wrong type", "Thing", `{"id": "7", "name": "abc"}`, false, `$.id: "7" is not of type "integer"`},
		{"a fraction for an integer", "Thing", `{"id": 1.5, "name": "abc"}`, false, `$.id: 1.5 is not of type "integer"`},
		{"null where null is not a type", "Thing", `{"id": null, "name": "abc"}`, false, `$.id: null is not of type "integer"`},
		{"not an object", "Thing", `[]`, false, `$: [] is not of type "object"`},
		{"missing required", "Thing", `{"id": 7}`, false, `the required property "name" is missing`},
		{"extra property", "Thing", `{"id": 7, "name": "abc", "colour": "red"}`, false, `the property "colour" is not in the schema`},
		{"bad enum", "Thing", `{"id": 7, "name": "abc", "state": "maybe"}`, false, `"maybe" is not one of ["on","off"]`},
		{"bad const", "Thing", `{"id": 7, "name": "abc", "kind": "other"}`, false, `"other" is not "thing"`},
		{"below minimum", "Thing", `{"id": 0, "name": "abc"}`, false, "below the minimum"},
		{"above maximum", "Thing", `{"id": 1, "name": "abc", "ratio": 1.01}`, false, "above the maximum"},
		{"beyond int64", "Thing", `{"id": 9223372036854775808, "name": "abc"}`, false, "is not an int64"},
		{"beyond int32", "Small", `2147483648`, false, "is not an int32"},
		{"too short", "Thing", `{"id": 1, "name": ""}`, false, "shorter than 1"},
		{"too long (characters, not bytes)", "Thing", `{"id": 1, "name": "ééééé!"}`, false, "longer than 5"},
		{"not a date-time", "Thing", `{"id": 1, "name": "a", "at": "2026-01-02 03:04:05Z"}`, false, "not an RFC 3339 date-time"},
		{"pattern", "Thing", `{"id": 1, "name": "a", "at": "2026-01-02T03:04:05+01:00"}`, false, "does not match"},
		{"a bad item", "Thing", `{"id": 1, "name": "a", "tags": ["x", 2]}`, false, `$.tags[1]: 2 is not of type "string"`},
		{"a \\u escape in a pattern: allowed", "Thing", `{"id": 1, "name": "a", "tags": ["caf\u00e9 \u007f"]}`, false, ""},
		{"a \\u escape in a pattern: refused", "Thing", `{"id": 1, "name": "a", "tags": ["a\nb"]}`, false, "does not match"},
		{"an escaped backslash in a pattern", "Thing", `{"id": 1, "name": "a", "tags": ["a\\u0041"]}`, false, "does not match"},
		{"too many items", "Thing", `{"id": 1, "name": "a", "tags": ["x", "y", "z"]}`, false, "more than 2"},
		{"open object takes others", "Open", `{"a": true, "b": 1}`, false, ""},
		{"closed mode refuses others", "Open", `{"a": true, "b": 1}`, true, `the property "b" is not in the schema`},
		{"closed mode still checks the named", "Open", `{"a": 1}`, true, `$.a: 1 is not of type "boolean"`},
		{"oneOf: the object", "Either", `{"id": 1, "name": "a"}`, false, ""},
		{"oneOf: the array", "Either", `[{"id": 1, "name": "a"}]`, false, ""},
		{"oneOf: neither", "Either", `[]`, false, "matches none of oneOf"},
		{"oneOf: a bad item", "Either", `[{"id": 0, "name": "a"}]`, false, "matches none of oneOf"},
		{"oneOf: both", "Overlap", `3`, false, "not exactly one"},
		{"unknown keyword", "Odd", `"x"`, false, `schema keyword "uniqueItems" is not one the test's validator knows`},
		{"unknown format", "Mail", `"a@b.example"`, false, `format email is not one the test's validator knows`},
		{"a $ref nowhere", "Missing", `1`, false, `no "Missing"`},
	} {
		v, err := decodeJSON([]byte(tc.value))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		err = schemaValidator{root: root, closed: tc.closed}.validate(schema(tc.schema), v)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%s: %s against %s: %v, want valid", tc.name, tc.value, tc.schema, err)
		case tc.wantErr != "" && err == nil:
			t.Errorf("%s: %s against %s is valid, want an error containing %q", tc.name, tc.value, tc.schema, tc.wantErr)
		case tc.wantErr != "" && !strings.Contains(err.Error(), tc.wantErr):
			t.Errorf("%s: %s against %s: %v, want an error containing %q", tc.name, tc.value, tc.schema, err, tc.wantErr)
		}
	}
}
