package web

import (
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

// get answers a GET of path with h: the status, the headers and the body.
func get(h http.Handler, path string) (int, http.Header, string) {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code, rec.Header(), rec.Body.String()
}

func TestHandlerServesThePageAndEveryAssetItNames(t *testing.T) {
	t.Parallel()
	h := Handler()
	status, header, page := get(h, "/")
	if status != http.StatusOK || !strings.Contains(header.Get("Content-Type"), "text/html") {
		t.Fatalf("GET /: got %d %q, want 200 text/html", status, header.Get("Content-Type"))
	}
	if got := header.Get("Cache-Control"); got != "no-cache" {
		t.Errorf("GET / Cache-Control: got %q, want no-cache", got)
	}
	// The page's own references, and the modules' imports of each other.
	refs := regexp.MustCompile(`(?:src|href)="(/static/[^"]+)"`).FindAllStringSubmatch(page, -1)
	if len(refs) < 2 {
		t.Fatalf("the page names %d assets, want its script and its styles", len(refs))
	}
	imports := regexp.MustCompile(`from "\./([^"]+)"`)
	seen := map[string]bool{}
	for len(refs) > 0 {
		path := refs[0][1]
		refs = refs[1:]
		if seen[path] {
			continue
		}
		seen[path] = true
		status, header, body := get(h, path)
		if status != http.StatusOK {
			t.Errorf("GET %s: got %d, want 200", path, status)
			continue
		}
		if strings.HasSuffix(path, ".js") {
			if ct := header.Get("Content-Type"); !strings.Contains(ct, "javascript") {
				t.Errorf("GET %s: Content-Type %q, want JavaScript (modules need it)", path, ct)
			}
			for _, m := range imports.FindAllStringSubmatch(body, -1) {
				refs = append(refs, []string{"", "/static/" + m[1]})
			}
		}
	}
	if !seen["/static/stream.js"] || !seen["/static/charts.js"] {
		t.Errorf("assets reached from the page: %v, want the modules app.js imports too", seen)
	}
}

func TestHandlerListsNoDirectory(t *testing.T) {
	t.Parallel()
	for _, path := range []string{"/static/", "/static/nothing.js"} {
		if status, _, _ := get(Handler(), path); status != http.StatusNotFound {
			t.Errorf("GET %s: got %d, want 404", path, status)
		}
	}
}

// TestEveryElementTheScriptsNameIsOnThePage: each id a script looks up
// with $("…") is an element of the page, so that a renamed element cannot
// leave a script reading null.
func TestEveryElementTheScriptsNameIsOnThePage(t *testing.T) {
	t.Parallel()
	h := Handler()
	_, _, page := get(h, "/")
	lookup := regexp.MustCompile(`\$\("([A-Za-z0-9_-]+)"\)`)
	for _, script := range []string{"/static/app.js", "/static/tasks.js", "/static/schedules.js", "/static/flow.js"} {
		status, _, body := get(h, script)
		if status != http.StatusOK {
			t.Fatalf("GET %s: got %d, want 200", script, status)
		}
		ids := lookup.FindAllStringSubmatch(body, -1)
		if len(ids) == 0 {
			t.Errorf("%s looks up no element by id; the test's pattern is out of date", script)
		}
		for _, m := range ids {
			if !strings.Contains(page, `id="`+m[1]+`"`) {
				t.Errorf("%s looks up #%s, which the page does not have", script, m[1])
			}
		}
	}
}
