package server_test

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// restDoc is the REST reference, whose route table names every operation.
const restDoc = "../../docs/reference/rest.md"

// routesHeading begins the section of the reference that holds the route
// table (other tables, such as the one of the lists' paging, name routes
// too).
const routesHeading = "## Routes"

// routeRow is a row of the reference's route table: its first cell is one
// operation, "`METHOD /path`", and nothing else.
var routeRow = regexp.MustCompile("^\\|\\s*`([A-Z]+) (/[^`\\s]*)`\\s*\\|")

// TestRESTDocMatchesOpenAPI keeps docs/reference/rest.md's route table and
// openapi.json in step: every operation of the document has exactly one row,
// every row names an operation of the document, and the rows are one table.
func TestRESTDocMatchesOpenAPI(t *testing.T) {
	t.Parallel()
	ops := openAPIOperations(t)
	rows := routeTableRows(t)

	for op := range ops {
		switch n := rows[op]; n {
		case 0:
			t.Errorf("docs/reference/rest.md has no row for %s, an operation of openapi.json: add one to its route table", op)
		case 1:
		default:
			t.Errorf("docs/reference/rest.md has %d rows for %s: give each operation one row", n, op)
		}
	}
	for op := range rows {
		if !ops[op] {
			t.Errorf("docs/reference/rest.md's route table names %s, which openapi.json does not describe: remove the row, or fix its method and path", op)
		}
	}
	if len(ops) < 40 {
		t.Errorf("openapi.json has %d operations; is it still read right?", len(ops))
	}
}

// openAPIOperations are the operations of openapi.json, as "METHOD /path".
func openAPIOperations(t *testing.T) map[string]bool {
	t.Helper()
	data, err := os.ReadFile("openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatalf("openapi.json: %v", err)
	}
	ops := map[string]bool{}
	for path, item := range doc.Paths {
		for method := range item {
			if slices.Contains([]string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}, method) {
				ops[strings.ToUpper(method)+" "+path] = true
			}
		}
	}
	return ops
}

// routeTableRows counts the rows of the reference's route table (in its
// section routesHeading) by the operation each names, and fails the test
// when they are not one table (consecutive lines).
func routeTableRows(t *testing.T) map[string]int {
	t.Helper()
	data, err := os.ReadFile(restDoc)
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]int{}
	first, last := -1, -1
	inRoutes := false
	for i, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "## ") {
			inRoutes = strings.TrimSpace(line) == routesHeading
		}
		if !inRoutes {
			continue
		}
		m := routeRow.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		if first < 0 {
			first = i
		} else if i != last+1 {
			t.Errorf("docs/reference/rest.md: the route row at line %d is not in the route table that starts at line %d; keep every route in one table", i+1, first+1)
		}
		last = i
		rows[m[1]+" "+m[2]]++
	}
	if first < 0 {
		t.Fatalf("docs/reference/rest.md has no route table (rows starting | `METHOD /path` |) under %q", routesHeading)
	}
	return rows
}
