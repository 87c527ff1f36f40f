package restclient_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/leasehold/leasehold/internal/restclient"
)

type statusError struct {
	method, path string
	status       int
	message      string
}

func (e *statusError) Error() string {
	return fmt.Sprintf("%s %s: %d %s", e.method, e.path, e.status, e.message)
}

// TestErrorsNameThePath: the error of a refused request names its method
// and its path as sent, leading slash included, with and without a path
// prefix in the base URL.
func TestErrorsNameThePath(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusRequestEntityTooLarge)
		fmt.Fprint(w, `{"error": "request body is over 1 MiB; send a smaller body"}`)
	}))
	defer srv.Close()
	for base, want := range map[string]string{srv.URL: "/api/tasks", srv.URL + "/": "/api/tasks", srv.URL + "/behind/proxy": "/behind/proxy/api/tasks"} {
		u, err := restclient.ParseBase(base)
		if err != nil {
			t.Fatal(err)
		}
		c := restclient.New(u, "", srv.Client(), func(method, path string, status int, message string) error {
			return &statusError{method, path, status, message}
		})
		_, err = c.Do(context.Background(), http.MethodPost, "/api/tasks", nil, struct{}{}, &struct{}{}, nil)
		se, ok := errors.AsType[*statusError](err)
		if !ok || se.path != want || se.status != http.StatusRequestEntityTooLarge || se.method != http.MethodPost {
			t.Errorf("base %s: %v; want POST %s 413", base, err, want)
		}
	}
}
