package server

import (
	_ "embed"
	"net/http"
)

// openAPIDocument is the OpenAPI 3.1 document of every route (openapi.json,
// kept true by openapi_test.go, which drives the real server against it).
//
//go:embed openapi.json
var openAPIDocument []byte

// handleOpenAPI serves GET /api/openapi.json: the document, as it was built
// into the binary.
func handleOpenAPI() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(openAPIDocument) // a broken connection is the client's
	})
}
