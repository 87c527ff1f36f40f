// Package web holds the browser page leasehold serves at /, embedded in
// the binary so that it needs no build step and no files beside the binary.
//
// The page is plain HTML, CSS and JavaScript modules: index.html at /, its
// script and styles under /static/. It reads the live stream at /ws and
// acts through the REST API.
package web

import (
	"embed"
	"net/http"
	"strings"
)

//go:embed static
var static embed.FS

// Handler serves the page at / and its assets under /static/.
func Handler() http.Handler {
	files := http.FileServerFS(static)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The assets change with the binary, and the embedded files carry no
		// modification time: ask the browser to check every time, so that a
		// new version is never mixed with an old script.
		w.Header().Set("Cache-Control", "no-cache")
		switch {
		case r.URL.Path == "/":
			http.ServeFileFS(w, r, static, "static/index.html")
		case strings.HasSuffix(r.URL.Path, "/"):
			http.NotFound(w, r) // no directory listings
		default:
			files.ServeHTTP(w, r)
		}
	})
}
