// Package apicheck loads leasehold's OpenAPI document with a Go OpenAPI
// library, as a Go client generator or validator would: the document the
// service serves at /api/openapi.json is the file it embeds,
// internal/server/openapi.json. It lives in the tool module so that the
// library it needs stays out of leasehold's go.mod.
package apicheck

import (
	"os"
	"regexp"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
)

const document = "../../internal/server/openapi.json"

// TestDocumentLoads: kin-openapi loads and validates the document, and
// every pattern in it compiles in Go's regexp (RE2), which reads neither
// \u escapes nor lookarounds.
func TestDocumentLoads(t *testing.T) {
	data, err := os.ReadFile(document)
	if err != nil {
		t.Fatal(err)
	}
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(data)
	if err != nil {
		t.Fatalf("kin-openapi cannot load the document: %v", err)
	}
	if err := doc.Validate(loader.Context); err != nil {
		t.Fatalf("kin-openapi finds the document invalid: %v", err)
	}
	if len(doc.Paths.Map()) < 20 {
		t.Fatalf("the document has %d paths; is it the whole document?", len(doc.Paths.Map()))
	}
	patterns := regexp.MustCompile(`"pattern":\s*"((?:[^"\\]|\\.)*)"`).FindAllSubmatch(data, -1)
	if len(patterns) == 0 {
		t.Fatal("no pattern in the document: is the search right?")
	}
	for _, m := range patterns {
		var p string
		if err := jsonUnquote(m[1], &p); err != nil {
			t.Fatalf("pattern %s: %v", m[1], err)
		}
		if _, err := regexp.Compile(p); err != nil {
			t.Errorf("pattern %q does not compile in Go (RE2): %v", p, err)
		}
	}
}
