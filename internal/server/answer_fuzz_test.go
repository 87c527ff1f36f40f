package server_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/server"
)

// The bound FuzzTaskAnswerSize holds every answer to: answerFactor times
// the body that made it, and answerPerTask for each task's own fields.
const (
	answerFactor  = 10
	answerPerTask = 1024
)

// FuzzTaskAnswerSize posts task bodies to a real server on a real database
// and holds what the tasks then cost to read to the size of what made them:
// the answer to the insert and to a GET of each task is never more than a
// small factor of the body (plus a task object's own fields), whatever
// numbers, strings or nesting it holds.
func FuzzTaskAnswerSize(f *testing.F) {
	many := make([]string, 1000)
	for i := range many {
		many[i] = "1e131071"
	}
	for _, s := range []string{
		`{"task_data":{}}`, `{"task_data":{"n":1e30}}`, `{"task_data":{"n":1e33,"m":[1e33,1e33]}}`,
		`{"task_data":{"n":1e131071}}`, `{"task_data":{"n":[` + strings.Join(many, ",") + `]}}`,
		`[{"task_data":{"a":[1,1,1,1,1,1]}},{"task_data":{"b":"<&>"}}]`, `{"task_data":{"s":"\u00e9\ud83d\ude00"}}`,
		`{"task_data":{"n":0e1073741822,"m":1e-30}}`, `{"task_data":{"d":[[[[[[[[[[]]]]]]]]]]}}`,
	} {
		f.Add([]byte(s))
	}
	db := pgtest.New(f)
	srv := httptest.NewServer(server.NewServer(testDeps(db)))
	f.Cleanup(srv.Close)
	post := func(t *testing.T, body []byte) (int, []byte) {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+"/api/tasks", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, b
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		status, answer := post(t, body)
		if status != http.StatusCreated && status != http.StatusOK {
			return
		}
		var ids []struct {
			ID int64 `json:"id"`
		}
		if bytes.HasPrefix(bytes.TrimSpace(answer), []byte("[")) {
			_ = json.Unmarshal(answer, &ids)
		} else {
			ids = append(ids, struct {
				ID int64 `json:"id"`
			}{})
			_ = json.Unmarshal(answer, &ids[0])
		}
		limit := answerFactor*len(body) + answerPerTask*len(ids)
		if len(answer) > limit {
			t.Fatalf("a body of %d bytes made an answer of %d bytes, over %d: %.200q", len(body), len(answer), limit, body)
		}
		for _, id := range ids {
			res, err := http.Get(srv.URL + "/api/tasks/" + strconv.FormatInt(id.ID, 10))
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if one := answerFactor*len(body) + answerPerTask; len(got) > one {
				t.Fatalf("a body of %d bytes made a task whose GET answers %d bytes, over %d: %.200q", len(body), len(got), one, body)
			}
		}
	})
}
