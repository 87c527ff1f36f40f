package server_test

import (
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"mime"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// openAPIDoc is openapi.json, decoded (numbers as json.Number).
type openAPIDoc struct {
	root map[string]any
	// ops are the operations by "METHOD /path/{param}".
	ops map[string]map[string]any
	// methods are the methods of each path, upper case.
	methods map[string][]string
}

var httpMethods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

func loadOpenAPI(t *testing.T, data []byte) *openAPIDoc {
	t.Helper()
	v, err := decodeJSON(data)
	if err != nil {
		t.Fatalf("openapi.json is not JSON: %v", err)
	}
	root, ok := v.(map[string]any)
	if !ok {
		t.Fatal("openapi.json is not a JSON object")
	}
	d := &openAPIDoc{root: root, ops: map[string]map[string]any{}, methods: map[string][]string{}}
	paths, _ := root["paths"].(map[string]any)
	for path, item := range paths {
		for method, op := range item.(map[string]any) {
			if !slices.Contains(httpMethods, method) {
				t.Errorf("paths[%q] has %q, which is not an operation; parameters belong to the operations here", path, method)
				continue
			}
			m := strings.ToUpper(method)
			d.ops[m+" "+path] = op.(map[string]any)
			d.methods[path] = append(d.methods[path], m)
		}
		slices.Sort(d.methods[path])
	}
	return d
}

// deref follows $ref until it reaches an object that is not a reference.
func (d *openAPIDoc) deref(t *testing.T, node any) map[string]any {
	t.Helper()
	for range 10 {
		m, ok := node.(map[string]any)
		if !ok {
			t.Fatalf("openapi.json: %s is not an object", show(node))
		}
		ref, ok := m["$ref"].(string)
		if !ok {
			return m
		}
		if node, ok = mustResolve(t, d.root, ref).(map[string]any); !ok {
			t.Fatalf("openapi.json: $ref %q is not an object", ref)
		}
	}
	t.Fatalf("openapi.json: $ref chain too long at %s", show(node))
	return nil
}

func mustResolve(t *testing.T, root any, ref string) any {
	t.Helper()
	v, err := resolve(root, ref)
	if err != nil {
		t.Fatalf("openapi.json: %v", err)
	}
	return v
}

// operation returns the operation key names ("POST /api/leases").
func (d *openAPIDoc) operation(t *testing.T, key string) map[string]any {
	t.Helper()
	op, ok := d.ops[key]
	if !ok {
		t.Fatalf("openapi.json has no operation %s", key)
	}
	return op
}

// parameters returns the operation's parameters, resolved.
func (d *openAPIDoc) parameters(t *testing.T, op map[string]any) []map[string]any {
	t.Helper()
	var ps []map[string]any
	list, _ := op["parameters"].([]any)
	for _, p := range list {
		ps = append(ps, d.deref(t, p))
	}
	return ps
}

// bodySchema returns the JSON schema of the operation's request body, and
// whether the body is required; nil when it takes none.
func (d *openAPIDoc) bodySchema(t *testing.T, op map[string]any) (schema any, required bool) {
	t.Helper()
	rb, ok := op["requestBody"]
	if !ok {
		return nil, false
	}
	body := d.deref(t, rb)
	media, ok := body["content"].(map[string]any)["application/json"].(map[string]any)
	if !ok {
		t.Fatalf("openapi.json: a request body that is not application/json: %s", show(body))
	}
	return media["schema"], body["required"] == true
}

// secured reports whether the operation needs credentials.
func (d *openAPIDoc) secured(op map[string]any) bool {
	sec, ok := op["security"].([]any)
	if !ok {
		sec, _ = d.root["security"].([]any)
	}
	return len(sec) > 0
}

// example is a request the document itself gives for the operation: its
// path with each path parameter's example, and its body's example.
func (d *openAPIDoc) example(t *testing.T, key string) exchange {
	t.Helper()
	op := d.operation(t, key)
	_, path, _ := strings.Cut(key, " ")
	for _, p := range d.parameters(t, op) {
		if p["in"] != "path" {
			continue
		}
		path = strings.ReplaceAll(path, "{"+p["name"].(string)+"}", fmt.Sprint(p["example"]))
	}
	x := exchange{op: key, path: path}
	if rb, ok := op["requestBody"]; ok {
		media := d.deref(t, rb)["content"].(map[string]any)["application/json"].(map[string]any)
		ex, ok := media["example"]
		if !ok {
			t.Fatalf("openapi.json: %s has a request body without an example", key)
		}
		b, err := json.Marshal(ex)
		if err != nil {
			t.Fatal(err)
		}
		x.body = string(b)
	}
	return x
}

// TestOpenAPIDocumentsEveryRoute: every route addRoutes registers has an
// operation in openapi.json and every operation is a route; and the
// document hangs together (its references resolve, its examples are valid,
// its path parameters are declared).
func TestOpenAPIDocumentsEveryRoute(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	doc := loadOpenAPI(t, data)
	if v := doc.root["openapi"]; v != "3.1.0" {
		t.Errorf("openapi is %v, want 3.1.0", v)
	}

	routes := registeredRoutes(t)
	documented := map[string]string{} // normalized key → the document's key
	for key := range doc.ops {
		documented[normalizeRoute(key)] = key
	}
	for pattern, key := range routes {
		if _, ok := documented[key]; !ok {
			t.Errorf("routes.go registers %q, which openapi.json does not describe (as %s)", pattern, key)
		}
	}
	registered := map[string]bool{}
	for _, key := range routes {
		registered[key] = true
	}
	for norm, key := range documented {
		if !registered[norm] {
			t.Errorf("openapi.json describes %s, which routes.go does not register", key)
		}
	}

	// Every reference resolves.
	walkJSON(doc.root, func(node map[string]any) {
		if ref, ok := node["$ref"].(string); ok {
			if _, err := resolve(doc.root, ref); err != nil {
				t.Error(err)
			}
		}
	})

	v := schemaValidator{root: doc.root}
	ids := map[string]string{}
	for key, op := range doc.ops {
		id, _ := op["operationId"].(string)
		if id == "" {
			t.Errorf("%s has no operationId", key)
		} else if other, dup := ids[id]; dup {
			t.Errorf("%s and %s share the operationId %q", key, other, id)
		}
		ids[id] = key
		responses, _ := op["responses"].(map[string]any)
		if len(responses) == 0 {
			t.Errorf("%s lists no responses", key)
		}
		for code, r := range responses {
			if _, err := strconv.Atoi(code); err != nil {
				t.Errorf("%s: response %q is not a status code (no \"default\": each status is listed)", key, code)
			}
			if desc, _ := doc.deref(t, r)["description"].(string); desc == "" {
				t.Errorf("%s: response %s has no description", key, code)
			}
		}
		// Path parameters: exactly those of the template, each with a valid example.
		_, path, _ := strings.Cut(key, " ")
		var inPath []string
		for _, m := range regexp.MustCompile(`\{([^}]+)\}`).FindAllStringSubmatch(path, -1) {
			inPath = append(inPath, m[1])
		}
		var declared []string
		for _, p := range doc.parameters(t, op) {
			name := p["name"].(string)
			if p["in"] == "path" {
				declared = append(declared, name)
				if p["required"] != true {
					t.Errorf("%s: path parameter %s must be required", key, name)
				}
			}
			if ex, ok := p["example"]; ok {
				if err := v.validate(p["schema"], ex); err != nil {
					t.Errorf("%s: the example of parameter %s: %v", key, name, err)
				}
			} else if p["in"] == "path" {
				t.Errorf("%s: path parameter %s has no example", key, name)
			}
		}
		slices.Sort(inPath)
		slices.Sort(declared)
		if !slices.Equal(inPath, declared) {
			t.Errorf("%s: the path has the parameters %v, the operation declares %v", key, inPath, declared)
		}
		if schema, _ := doc.bodySchema(t, op); schema != nil {
			media := doc.deref(t, op["requestBody"])["content"].(map[string]any)["application/json"].(map[string]any)
			if err := v.validate(schema, media["example"]); err != nil {
				t.Errorf("%s: the request body's example: %v", key, err)
			}
		}
	}
}

// walkJSON calls fn with every object in v.
func walkJSON(v any, fn func(map[string]any)) {
	switch x := v.(type) {
	case map[string]any:
		fn(x)
		for _, e := range x {
			walkJSON(e, fn)
		}
	case []any:
		for _, e := range x {
			walkJSON(e, fn)
		}
	}
}

// registeredRoutes reads the patterns addRoutes registers from routes.go
// (every mux.Handle and mux.HandleFunc call in it, the conditional ones
// included), each with its key as normalizeRoute writes it. A pattern that
// is not a string literal, or names no method, fails the test: the
// document could not be checked against it.
func registeredRoutes(t *testing.T) map[string]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "routes.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	routes := map[string]string{}
	for _, decl := range f.Decls {
		fn, ok := decl.(*ast.FuncDecl)
		if !ok || fn.Name.Name != "addRoutes" {
			continue
		}
		ast.Inspect(fn.Body, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || (sel.Sel.Name != "Handle" && sel.Sel.Name != "HandleFunc") || len(call.Args) == 0 {
				return true
			}
			lit, ok := call.Args[0].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				t.Errorf("routes.go: a route whose pattern is not a string literal (%T); write it out so that it can be checked against openapi.json", call.Args[0])
				return true
			}
			pattern, err := strconv.Unquote(lit.Value)
			if err != nil {
				t.Fatal(err)
			}
			method, path, ok := strings.Cut(pattern, " ")
			if !ok || !strings.HasPrefix(path, "/") {
				t.Errorf("routes.go: the pattern %q names no method; every route has one", pattern)
				return true
			}
			switch {
			case strings.HasSuffix(path, "/{$}"):
				path = strings.TrimSuffix(path, "{$}")
			case strings.HasSuffix(path, "/") && path != "/":
				path += "{file}" // a subtree: the document has one parameter for the rest
			}
			routes[pattern] = normalizeRoute(method + " " + path)
			return true
		})
	}
	if len(routes) == 0 {
		t.Fatal("routes.go: found no routes in addRoutes")
	}
	return routes
}

// normalizeRoute writes a route key with its parameters unnamed, so that
// "GET /api/leases/{id}" in routes.go and in the document compare equal
// whatever the parameters are called.
func normalizeRoute(key string) string {
	return regexp.MustCompile(`\{[^}]*\}`).ReplaceAllString(key, "{}")
}

// conformance sends requests to real servers and holds each exchange to
// openapi.json: the request to the documented parameters and body
// schemas, the response's status to those the operation lists, its
// headers and body to what the document says of that status.
type conformance struct {
	t   *testing.T
	doc *openAPIDoc
	// seen are the statuses each operation answered.
	seen map[string]map[string]bool
}

// exchange is one request and what the test expects of it.
type exchange struct {
	op     string   // the operation, as the document names it: "PUT /api/tasks/{id}/fail"
	path   string   // the path sent, with its query
	body   string   // the request body; empty for none
	header []string // key, value pairs
	// invalid marks bad input: the document's schemas must refuse the
	// request (its parameters or body) as the server does.
	invalid bool
	// unchecked leaves the request unchecked (an oversized body).
	unchecked bool
	// want is the status the test expects; 0 only checks it is documented.
	want int
}

// send makes the request on b and checks both sides of the exchange.
func (c *conformance) send(b bundle, x exchange) response {
	c.t.Helper()
	op := c.doc.operation(c.t, x.op)
	if !x.unchecked {
		c.checkRequest(op, x)
	}
	method, _, _ := strings.Cut(x.op, " ")
	r := b.do(c.t, method, x.path, x.body, x.header...)
	if x.want != 0 && r.status != x.want {
		c.t.Errorf("%s %s: got %s, want status %d", method, x.path, r, x.want)
	}
	c.checkResponse(x.op, op, r)
	return r
}

// checkRequest holds the request's path and query parameters and body to
// the operation's documentation.
func (c *conformance) checkRequest(op map[string]any, x exchange) {
	t := c.t
	t.Helper()
	_, template, _ := strings.Cut(x.op, " ")
	u, err := url.Parse(x.path)
	if err != nil {
		t.Fatal(err)
	}
	params := c.doc.parameters(t, op)
	param := func(in, name string) map[string]any {
		for _, p := range params {
			if p["in"] == in && p["name"] == name {
				return p
			}
		}
		return nil
	}
	v := schemaValidator{root: c.doc.root}
	var problems []string
	check := func(what string, schema, value any) {
		if err := v.validate(schema, value); err != nil {
			problems = append(problems, what+": "+err.Error())
		}
	}

	got, want := strings.Split(u.Path, "/"), strings.Split(template, "/")
	if len(got) != len(want) {
		t.Fatalf("%s does not match the path of %s", u.Path, x.op)
	}
	for i, seg := range want {
		name, isParam := strings.CutPrefix(seg, "{")
		if !isParam {
			if got[i] != seg {
				t.Fatalf("%s does not match the path of %s", u.Path, x.op)
			}
			continue
		}
		p := param("path", strings.TrimSuffix(name, "}"))
		if p == nil {
			t.Fatalf("%s: path parameter %s is not declared", x.op, seg)
		}
		check("path parameter "+seg, p["schema"], paramValue(p["schema"], got[i]))
	}
	for name, values := range u.Query() {
		p := param("query", name)
		if p == nil {
			t.Errorf("%s: the test sends the query parameter %q, which the document does not list", x.op, name)
			continue
		}
		for _, value := range values {
			check("query parameter "+name, p["schema"], paramValue(p["schema"], value))
		}
	}
	schema, required := c.doc.bodySchema(t, op)
	switch {
	case x.body != "" && schema == nil:
		t.Errorf("%s: the test sends a body, and the document says it takes none", x.op)
	case x.body != "":
		body, err := decodeJSON([]byte(x.body))
		if err != nil {
			problems = append(problems, "body: not JSON: "+err.Error())
		} else {
			check("body", schema, body)
		}
	case required:
		problems = append(problems, "body: required, none sent")
	}

	switch {
	case !x.invalid && len(problems) > 0:
		t.Errorf("%s %s %s: the document refuses this request, which the test sends as valid: %s", x.op, x.path, x.body, strings.Join(problems, "; "))
	case x.invalid && len(problems) == 0:
		t.Errorf("%s %s %s: the document allows this request, which the server refuses as bad input; say what it refuses", x.op, x.path, x.body)
	}
}

// paramValue is the JSON value of a path or query parameter's text, as
// the server reads it by the parameter's schema.
func paramValue(schema any, raw string) any {
	if s, ok := schema.(map[string]any); ok && (s["type"] == "integer" || s["type"] == "number") {
		if v, err := decodeJSON([]byte(raw)); err == nil {
			if n, ok := v.(json.Number); ok {
				return n
			}
		}
	}
	return raw
}

// checkResponse holds r to what the operation key documents for its status.
func (c *conformance) checkResponse(key string, op map[string]any, r response) {
	c.t.Helper()
	code := strconv.Itoa(r.status)
	if c.seen[key] == nil {
		c.seen[key] = map[string]bool{}
	}
	c.seen[key][code] = true
	resp, ok := op["responses"].(map[string]any)[code]
	if !ok {
		c.t.Errorf("%s answered %s, a status the document does not list for it", key, r)
		return
	}
	c.checkAgainst(key+" "+code, resp, r)
}

// checkAgainst holds r to one documented response: its headers, its
// media type and its body's schema (closed: a field the server sends and
// the document does not name fails).
func (c *conformance) checkAgainst(what string, node any, r response) {
	t := c.t
	t.Helper()
	resp := c.doc.deref(t, node)
	v := schemaValidator{root: c.doc.root, closed: true}
	headers, _ := resp["headers"].(map[string]any)
	for name, h := range headers {
		h := c.doc.deref(t, h)
		value := r.header.Get(name)
		if value == "" {
			if h["required"] == true {
				t.Errorf("%s: no %s header, which the document requires: %s", what, name, r)
			}
			continue
		}
		if err := v.validate(h["schema"], paramValue(h["schema"], value)); err != nil {
			t.Errorf("%s: header %s: %q: %v", what, name, value, err)
		}
	}
	content, _ := resp["content"].(map[string]any)
	if len(content) == 0 {
		if len(r.body) > 0 {
			t.Errorf("%s: the document says there is no body, and there is: %s", what, r)
		}
		return
	}
	mt, _, err := mime.ParseMediaType(r.header.Get("Content-Type"))
	if err != nil {
		t.Errorf("%s: Content-Type %q: %v", what, r.header.Get("Content-Type"), err)
		return
	}
	media, ok := content[mt].(map[string]any)
	if !ok {
		t.Errorf("%s: Content-Type %s, which the document does not list (%v)", what, mt, slices.Sorted(maps.Keys(content)))
		return
	}
	if mt != "application/json" {
		if len(r.body) == 0 {
			t.Errorf("%s: an empty %s body", what, mt)
		}
		return
	}
	body, err := decodeJSON(r.body)
	if err != nil {
		t.Errorf("%s: the body is not JSON: %v: %s", what, err, r)
		return
	}
	if err := v.validate(media["schema"], body); err != nil {
		t.Errorf("%s: the body breaks the documented schema: %v\n%s", what, err, r)
	}
}

// checkComponent holds r to a response of components.responses (the
// answers of paths and methods the document has no operation for).
func (c *conformance) checkComponent(what, name string, r response) {
	c.t.Helper()
	c.checkAgainst(what, mustResolve(c.t, c.doc.root, "#/components/responses/"+name), r)
}

// noInput are the operations that take nothing a client could get wrong:
// no parameters, no body, no credentials, no rate limit. They answer no
// 4xx, so they declare none; a method their path does not have is the
// document's one 405 (components.responses.MethodNotAllowed).
var noInput = []string{"GET /healthz", "GET /readyz", "GET /metrics"}

// TestOpenAPIDeclaresClientErrors: every operation declares at least one
// 4xx answer, what a client that got its request wrong is told, except
// those that take no input (noInput), and those are held to taking none.
func TestOpenAPIDeclaresClientErrors(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	doc := loadOpenAPI(t, data)
	for _, key := range slices.Sorted(maps.Keys(doc.ops)) {
		op := doc.ops[key]
		var clientErrors []string
		for code := range op["responses"].(map[string]any) {
			if strings.HasPrefix(code, "4") {
				clientErrors = append(clientErrors, code)
			}
		}
		if slices.Contains(noInput, key) {
			if len(clientErrors) > 0 || len(doc.parameters(t, op)) > 0 || op["requestBody"] != nil || doc.secured(op) {
				t.Errorf("%s is listed as taking no input, but it has parameters, a body, credentials or the 4xx %v; take it out of noInput", key, clientErrors)
			}
			continue
		}
		if len(clientErrors) == 0 {
			t.Errorf("%s declares no 4xx answer; list what the handler answers a request it refuses", key)
		}
	}
}

// TestOpenAPINamePattern: every name the API reads (resource, holder,
// processor, kind, queue, unique_key, lock, a schedule's name, in a body,
// a path or a query) carries the API's name rule as its pattern: no
// control characters (C0, DEL and C1, what the server's check refuses),
// besides its length.
func TestOpenAPINamePattern(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	doc := loadOpenAPI(t, data)
	v := schemaValidator{root: doc.root}
	schemas := doc.root["components"].(map[string]any)["schemas"].(map[string]any)
	names := map[string]any{}
	for _, schema := range []string{"AcquireRequest", "RenewRequest", "ReleaseRequest", "NewTask", "ClaimRequest",
		"HeartbeatRequest", "CompleteRequest", "FailRequest", "SnoozeRequest", "RequeueRequest", "CancelRequest",
		"ScheduleRequest", "ScheduleReplaceRequest"} {
		props := schemas[schema].(map[string]any)["properties"].(map[string]any)
		for _, name := range []string{"resource", "holder", "processor", "kind", "queue", "unique_key", "lock", "name"} {
			if p, ok := props[name]; ok {
				names[schema+"."+name] = p
			}
		}
		for _, list := range []string{"kinds", "queues"} {
			if p, ok := props[list]; ok {
				names[schema+"."+list+"[]"] = p.(map[string]any)["items"]
			}
		}
	}
	if len(names) != 27 {
		t.Errorf("found %d names in the request schemas, want 27: %v", len(names), slices.Sorted(maps.Keys(names)))
	}
	params := doc.root["components"].(map[string]any)["parameters"].(map[string]any)
	for _, name := range []string{"Prefix", "EventResource", "TaskKind", "TaskQueue", "ScheduleName", "AfterName"} {
		names["?"+name] = params[name].(map[string]any)["schema"]
	}
	for _, where := range slices.Sorted(maps.Keys(names)) {
		schema := names[where]
		if _, ok := schema.(map[string]any)["pattern"]; !ok {
			t.Errorf("%s has no pattern; give it the no-control-characters rule", where)
			continue
		}
		for _, ok := range []string{"report:nightly", "replica-a/w2", "café ☕", "a b", strings.Repeat("n", 255)} {
			if err := v.validate(schema, ok); err != nil {
				t.Errorf("%s refuses the name %q: %v", where, ok, err)
			}
		}
		for _, bad := range []string{"a\nb", "tab\there", "nul\x00", "esc\x1b[0m", "del\x7f", "c1\u0085", "c1\u009f", "\r"} {
			if err := v.validate(schema, bad); err == nil {
				t.Errorf("%s accepts the name %q, which has a control character", where, bad)
			}
		}
	}
}
