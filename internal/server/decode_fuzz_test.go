package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/leasehold/leasehold/internal/name"
)

// The fuzz targets of the request decoders and validators: each input is
// either refused with a *badRequest whose message says where the problem
// is, or accepted as a value that keeps every rule of the API and
// survives a round trip (encoded and parsed again, it is the same).
// `go test` runs the seeds below and testdata/fuzz; the fuzz task of the
// Taskfile runs each target for a few seconds.

// wantBadRequest fails the test unless err is a *badRequest with a message
// fit for the API's error body: one line of valid UTF-8 that names where
// the problem is, in one of the words the decoders use.
func wantBadRequest(t *testing.T, input any, err error, where ...string) {
	t.Helper()
	var bad *badRequest
	if !errors.As(err, &bad) {
		t.Fatalf("input %q: error %v (%T), want a *badRequest (400)", input, err, err)
	}
	msg := bad.msg
	if msg == "" || !utf8.ValidString(msg) || strings.ContainsAny(msg, "\r\n") {
		t.Fatalf("input %q: message %q, want one non-empty line of UTF-8", input, msg)
	}
	for _, w := range where {
		if strings.Contains(msg, w) {
			return
		}
	}
	t.Fatalf("input %q: message %q names none of %q", input, msg, where)
}

// bodyWhere are the words that say where in a body the problem is: the
// body itself, or a field by its quoted name.
var bodyWhere = []string{"request body", `"`, "the array", "item "}

// wantName checks an accepted name against the rule (internal/name, which
// has tests of its own): 1 to 255 bytes of UTF-8 in NFC, without control or
// format characters, not blank.
func wantName(t *testing.T, field, v string) {
	t.Helper()
	if v == "" || len(v) > maxNameBytes || !utf8.ValidString(v) || strings.ContainsFunc(v, unicode.IsControl) || name.Check(field, v) != nil {
		t.Fatalf("%s %q was accepted; want 1 to 255 bytes of UTF-8 in NFC without control or format characters, not blank", field, v)
	}
}

func wantTTL(t *testing.T, ttl *int64) {
	t.Helper()
	if ttl != nil && (*ttl < 1 || *ttl > 3600) {
		t.Fatalf("ttl_seconds %d was accepted; want 1..3600", *ttl)
	}
}

func wantFence(t *testing.T, fence *int64) {
	t.Helper()
	if fence != nil && *fence < 1 {
		t.Fatalf("fence %d was accepted; want a positive integer", *fence)
	}
}

// fuzzBody parses body as a T: a refusal must be a *badRequest naming the
// problem; an accepted value must pass check and survive a round trip.
func fuzzBody[T validator](t *testing.T, body []byte, check func(T)) {
	t.Helper()
	v, err := parseBody[T](body)
	if err != nil {
		wantBadRequest(t, body, err, bodyWhere...)
		return
	}
	check(v)
	enc, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("body %q: accepted %+v does not encode: %v", body, v, err)
	}
	again, err := parseBody[T](enc)
	if err != nil {
		t.Fatalf("body %q: accepted as %+v, but its encoding %s is refused: %v", body, v, enc, err)
	}
	if enc2, _ := json.Marshal(again); !bytes.Equal(enc, enc2) {
		t.Fatalf("body %q: round trip changed %s into %s", body, enc, enc2)
	}
}

// leaseSeeds are lease bodies, valid and not, that the mutator starts from.
var leaseSeeds = []string{
	`{"resource":"report:nightly","holder":"replica-b"}`,
	`{"resource":"r","holder":"h","ttl_seconds":30}`,
	`{"resource":"r","holder":"h","ttl_seconds":3600,"fence":42}`,
	`{"resource":"r","holder":"h","fence":1}`,
	`{"resource":"r","holder":"h","ttl_seconds":0}`,
	`{"resource":"r","holder":"h","ttl_seconds":3601}`,
	`{"resource":"r","holder":"h","ttl_seconds":1.5}`,
	`{"resource":"r","holder":"h","fence":-1}`,
	`{"resource":"","holder":"h"}`,
	`{"resource":"caf\u00e9 \ud83d\ude00","holder":"h"}`,
	`{"resource":"a\u0000b","holder":"h"}`,
	`{"resource":"\ud800","holder":"h"}`,
	`{"resource":"tab\there","holder":"h"}`,
	"{\"resource\":\"\xff\",\"holder\":\"h\"}",
	`{"resource":"r","holder":"h","color":"red"}`,
	`{"resource":"r","holder":"h"} {}`,
	`{"resource":"r","holder":`,
	`"\`,
	`{"resource":"\u12`,
	`[{"resource":"r","holder":"h"}]`,
	`null`, ``, `  `,
	`{"resource":"` + strings.Repeat("r", 256) + `","holder":"h"}`,
	`{"resource":"r","holder":"h","ttl_seconds":null}`,
	`{"resource":"r","holder":"h","fence":null}`,
	`{"resource":"r","holder":"h","ttl_seconds":5,"ttl_seconds":60}`,
	`{"resource":"r","holder":"h","Holder":"h2"}`,
	`{"resource":"r","holder":"h","holder":"h"}`,
}

// FuzzDecodeLease feeds one body to the decoders of POST /api/leases, PUT
// /api/leases/renew and DELETE /api/leases/release (and /api/leases/{id}).
func FuzzDecodeLease(f *testing.F) {
	for _, s := range leaseSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		fuzzBody(t, body, func(q acquireRequest) {
			wantName(t, "resource", q.Resource)
			wantName(t, "holder", q.Holder)
			wantTTL(t, q.TTLSeconds)
		})
		fuzzBody(t, body, func(q renewRequest) {
			wantName(t, "resource", q.Resource)
			wantName(t, "holder", q.Holder)
			wantTTL(t, q.TTLSeconds)
			wantFence(t, q.Fence)
		})
		fuzzBody(t, body, func(q releaseRequest) {
			wantName(t, "resource", q.Resource)
			wantName(t, "holder", q.Holder)
			wantFence(t, q.Fence)
		})
	})
}

// FuzzDecodeSession feeds bodies to the decoder of POST /api/session: any
// JSON object with at most a string "token", given once, is accepted.
func FuzzDecodeSession(f *testing.F) {
	for _, s := range []string{
		`{"token":"s3cret"}`, `{}`, `{"token":""}`, `{"token":null}`, `{"token":7}`,
		`{"token":"a","user":"b"}`, `{"token":"\u0000"}`, `{"token":"\udfff"}`, `["s3cret"]`, `"s3cret"`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		fuzzBody(t, body, func(q sessionRequest) {
			if strings.ContainsRune(q.Token, 0) {
				t.Fatalf("body %q: token %q holds a NUL", body, q.Token)
			}
		})
	})
}

// FuzzDecodeTaskOp feeds one body to the decoders of POST /api/tasks/next
// and PUT /api/tasks/{id}/heartbeat, /complete and /fail.
func FuzzDecodeTaskOp(f *testing.F) {
	for _, s := range []string{
		`{"processor":"replica-a/w2"}`,
		`{"processor":"p","fence":43}`,
		`{"processor":"p","fence":43,"task_output":{"ok":true}}`,
		`{"processor":"p","task_output":null}`,
		`{"processor":"p","task_output":[1,"two",{"3":4.5e6}]}`,
		`{"processor":"p","task_output":1e999999}`,
		`{"processor":"p","task_output":"\u0000"}`,
		`{"processor":"p","fence":2,"error":"boom\n\tat main.go:12"}`,
		`{"processor":"p","error":"   "}`,
		`{"processor":"p","error":"` + strings.Repeat("e", maxErrorBytes+1) + `"}`,
		`{"processor":"p","error":"nul\u0000"}`,
		`{"processor":"","fence":1}`,
		`{"processor":"p","fence":0}`,
		`{"processor":"p","fence":"1"}`,
		`{"processor":"p","task_output":}`,
		`{"processor":"p"}]`,
		`{"processor":"p","fence":null}`,
		`{"processor":"p","error":"x","retry_in_seconds":null}`,
		`{"processor":"p","processor":"q"}`,
		`{"processor":"p","task_output":{"a":1,"a":2}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		fuzzBody(t, body, func(q claimRequest) { wantName(t, "processor", q.Processor) })
		fuzzBody(t, body, func(q heartbeatRequest) {
			wantName(t, "processor", q.Processor)
			wantFence(t, q.Fence)
		})
		fuzzBody(t, body, func(q completeRequest) {
			wantName(t, "processor", q.Processor)
			wantFence(t, q.Fence)
			if !json.Valid(q.TaskOutput) {
				t.Fatalf("task_output %q was accepted; want a JSON value", q.TaskOutput)
			}
		})
		fuzzBody(t, body, func(q failRequest) {
			wantName(t, "processor", q.Processor)
			wantFence(t, q.Fence)
			if strings.TrimSpace(q.Error) == "" || len(q.Error) > maxErrorBytes || strings.ContainsRune(q.Error, 0) {
				t.Fatalf("error %q was accepted; want 1 to 4096 bytes, not blank, no NUL", q.Error)
			}
		})
	})
}

// FuzzDecodeNewTasks feeds bodies to the decoder of POST /api/tasks: one
// task object or an array of them.
func FuzzDecodeNewTasks(f *testing.F) {
	for _, s := range []string{
		`{"task_data":{"sleep_duration_seconds":5}}`,
		`{"task_data":{},"scheduled_at":"2030-01-02T15:04:05Z","max_attempts":3}`,
		`{"task_data":{"a":[1,2,{"b":null}]},"scheduled_at":"2030-01-02T15:04:05.123456789+01:00"}`,
		`[{"task_data":{"n":1}},{"task_data":{"n":2},"max_attempts":100}]`,
		`[]`, `[1]`, `[{"task_data":{}}, 2]`, `[[]]`,
		`{"task_data":null}`, `{"task_data":[1]}`, `{"task_data":"x"}`, `{}`,
		`{"task_data":{"n":1e131072}}`, `{"task_data":{"n":0.` + strings.Repeat("0", 16383) + `1}}`,
		`{"task_data":{"s":"\u0000"}}`, `{"task_data":{"s":"\ud83d"}}`,
		`{"task_data":{},"scheduled_at":"0000-12-31T23:59:59Z"}`,
		`{"task_data":{},"scheduled_at":"10000-01-01T00:00:00Z"}`,
		`{"task_data":{},"scheduled_at":"tomorrow"}`,
		`{"task_data":{},"max_attempts":0}`, `{"task_data":{},"max_attempts":101}`,
		`{"task_data":{},"priority":1}`,
		`{"task_data":{},"max_attempts":null}`, `{"task_data":{},"scheduled_at":null}`,
		`{"task_data":{"a":1,"a":2}}`, `{"task_data":{},"kind":"a","kind":"b"}`,
		`[{"task_data":{}},{"task_data":{},"task_data":{}}]`,
		` [ {"task_data" : { } } ] `,
		`{"tAsk_dAtA":{"&":0}}`, `{"task_data":{"<":">"}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		nts, batch, err := parseNewTasks(body)
		if err != nil {
			wantBadRequest(t, body, err, bodyWhere...)
			return
		}
		trimmed := bytes.TrimSpace(body)
		if batch != (trimmed[0] == '[') {
			t.Fatalf("body %q: batch %v, want it to say whether the body is an array", body, batch)
		}
		if len(nts) < 1 || len(nts) > maxTasksPerRequest || !batch && len(nts) != 1 {
			t.Fatalf("body %q: %d tasks (batch %v)", body, len(nts), batch)
		}
		items := make([]map[string]any, len(nts))
		for i, nt := range nts {
			if !json.Valid(nt.TaskData) || nt.TaskData[0] != '{' {
				t.Fatalf("body %q: task %d: task_data %q is not a JSON object", body, i, nt.TaskData)
			}
			if checkJSON("task_data", nt.TaskData, true) != nil {
				t.Fatalf("body %q: task %d: task_data %q holds what PostgreSQL cannot store", body, i, nt.TaskData)
			}
			if nt.MaxAttempts < 0 || nt.MaxAttempts > maxAttemptsLimit {
				t.Fatalf("body %q: task %d: max_attempts %d", body, i, nt.MaxAttempts)
			}
			item := map[string]any{"task_data": nt.TaskData}
			if !nt.ScheduledAt.IsZero() {
				if nt.ScheduledAt.Location() != time.UTC || nt.ScheduledAt.Before(scheduleMin) || nt.ScheduledAt.After(scheduleMax) {
					t.Fatalf("body %q: task %d: scheduled_at %v, want UTC within years 1..9999", body, i, nt.ScheduledAt)
				}
				item["scheduled_at"] = nt.ScheduledAt.Format(time.RFC3339Nano)
			}
			if nt.MaxAttempts != 0 {
				item["max_attempts"] = nt.MaxAttempts
			}
			items[i] = item
		}
		// Round trip: the tasks written back as a request are the same tasks.
		// Written without encoding/json's HTML escaping, which would turn
		// task_data's "&" into "\u0026": the same JSON, other bytes.
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if batch {
			err = enc.Encode(items)
		} else {
			err = enc.Encode(items[0])
		}
		if err != nil {
			t.Fatal(err)
		}
		again := buf.Bytes()
		nts2, batch2, err := parseNewTasks(again)
		if err != nil || batch2 != batch || len(nts2) != len(nts) {
			t.Fatalf("body %q: accepted, but written back as %s: %d tasks, batch %v, %v", body, again, len(nts2), batch2, err)
		}
		for i := range nts {
			a, b := nts[i], nts2[i]
			var ca, cb bytes.Buffer
			_ = json.Compact(&ca, a.TaskData)
			_ = json.Compact(&cb, b.TaskData)
			if !bytes.Equal(ca.Bytes(), cb.Bytes()) || !a.ScheduledAt.Equal(b.ScheduledAt) || a.MaxAttempts != b.MaxAttempts {
				t.Fatalf("body %q: task %d changed in a round trip: %+v, then %+v", body, i, a, b)
			}
		}
	})
}

// FuzzQuery feeds a query string to the parsers of the lease lists
// (?prefix=&limit=&after_id=), the lease history (?resource=&after=&limit=)
// and the task lists (?limit=&after_id=).
func FuzzQuery(f *testing.F) {
	for _, s := range []string{
		"", "limit=10", "limit=10000", "limit=10001", "limit=0", "limit=-1", "limit=1e3", "limit=+5", "limit=007",
		"after_id=0", "after_id=4611686018427387904", "after_id=4611686018427387905", "after_id=x",
		"prefix=report:", "prefix=%FF", "prefix=%00", "prefix=a%0Ab", "prefix=" + strings.Repeat("p", 256),
		"resource=r&after=5&limit=2", "resource=%C3%A9", "limit=5&limit=50000", "limit=%20", "a=b;c=d", "%zz",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		q, _ := url.ParseQuery(raw) // as r.URL.Query(): bad pairs are dropped
		// An accepted number is the one given, or the default when none is.
		wantInt := func(name string, got, def int64) {
			t.Helper()
			want := def
			if v := q.Get(name); v != "" {
				want, _ = strconv.ParseInt(v, 10, 64)
			}
			if got != want {
				t.Fatalf("query %q: %s = %d, want %d", raw, name, got, want)
			}
		}
		if p, err := listParams(q, "all"); err != nil {
			wantBadRequest(t, raw, err, "query parameter prefix", "query parameter limit", "query parameter after_id")
		} else {
			wantQueryName(t, raw, "prefix", p.Prefix)
			if p.Limit < 1 || p.Limit > 10000 || p.AfterID < 0 || p.AfterID > 1<<62 {
				t.Fatalf("query %q: accepted %+v", raw, p)
			}
			wantInt("limit", int64(p.Limit), 1000)
			wantInt("after_id", p.AfterID, 0)
			again, err := listParams(url.Values{
				"prefix": {p.Prefix}, "limit": {strconv.Itoa(int(p.Limit))}, "after_id": {strconv.FormatInt(p.AfterID, 10)},
			}, "all")
			if err != nil || again != p {
				t.Fatalf("query %q: %+v, written back: %+v, %v", raw, p, again, err)
			}
		}
		if p, err := eventsParams(q); err != nil {
			wantBadRequest(t, raw, err, "query parameter resource", "query parameter after", "query parameter limit")
		} else {
			wantQueryName(t, raw, "resource", p.Resource)
			if p.Limit < 1 || p.Limit > 10000 || p.AfterID < 0 || p.AfterID > 1<<62 {
				t.Fatalf("query %q: accepted %+v", raw, p)
			}
			wantInt("limit", int64(p.Limit), 1000)
			wantInt("after", p.AfterID, 0)
		}
		if tp, err := taskListParams(q); err != nil {
			wantBadRequest(t, raw, err, "query parameter limit", "query parameter after_id", "query parameter state", "query parameter kind", "query parameter queue")
		} else {
			after, limit := tp.AfterID, tp.Limit
			if limit < 1 || limit > maxTaskLimit || after < 0 || after > 1<<62 {
				t.Fatalf("query %q: accepted after_id %d, limit %d", raw, after, limit)
			}
			wantInt("limit", int64(limit), defaultTaskLimit)
			wantInt("after_id", after, 0)
		}
	})
}

func wantQueryName(t *testing.T, raw, name, v string) {
	t.Helper()
	if len(v) > maxNameBytes || !utf8.ValidString(v) || strings.ContainsFunc(v, unicode.IsControl) {
		t.Fatalf("query %q: %s %q was accepted; no name is like that", raw, name, v)
	}
}

// FuzzParseID feeds the {id} of /api/leases/{id} and /api/tasks/{id}/...:
// exactly the decimal spelling of a positive int64 is accepted.
func FuzzParseID(f *testing.F) {
	for _, s := range []string{"1", "42", "0", "-1", "+1", "01", "1.0", "1e3", " 1", "9223372036854775807", "9223372036854775808", "", "renew", "٣"} {
		f.Add(s, int64(len(s)))
	}
	f.Fuzz(func(t *testing.T, raw string, n int64) {
		id, err := parseID(raw)
		if err != nil {
			wantBadRequest(t, raw, err, "id ")
		} else if id < 1 || strconv.FormatInt(id, 10) != raw {
			t.Fatalf("id %q was accepted as %d", raw, id)
		}
		if n >= 1 {
			if got, err := parseID(strconv.FormatInt(n, 10)); err != nil || got != n {
				t.Fatalf("id %d: parsed as %d, %v", n, got, err)
			}
		}
	})
}

// FuzzCheckJSON feeds valid JSON to checkJSON, the guard against what
// PostgreSQL cannot store and Go would silently replace. Without a literal
// U+FFFD in the input, encoding/json is an oracle for the strings: it
// decodes \u0000 to a NUL and an unpaired surrogate escape to U+FFFD, and
// checkJSON must refuse exactly those.
func FuzzCheckJSON(f *testing.F) {
	for _, s := range []string{
		`{}`, `"a"`, `"\u0000"`, `"\\u0000"`, `"\ud83d\ude00"`, `"\ud83d"`, `"\ude00"`, `"\ud83d\u0041"`, `"\ud83dx"`,
		`{"\u0000":1}`, `["\uDBFF\uDFFF", "\uD800\uDC00"]`, `1e131071`, `1e131072`, `-0.0e-16383`, `1.5e-16383`,
		`[0.` + strings.Repeat("0", 16384) + `]`, `"\\\"\u0041"`, `123456789012345678901234567890`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		if !utf8.Valid(raw) || !json.Valid(raw) {
			return // parseBody refuses these before checkJSON sees them
		}
		strictErr := checkJSON("body", raw, false)
		if strictErr != nil {
			wantBadRequest(t, raw, strictErr, "body")
		}
		if numErr := checkJSON("body", raw, true); numErr != nil {
			wantBadRequest(t, raw, numErr, "body")
		} else if strictErr != nil {
			t.Fatalf("%q: refused without numbers (%v) but accepted with them", raw, strictErr)
		}
		if bytes.Contains(raw, []byte("\uFFFD")) || bytes.Contains(bytes.ToLower(raw), []byte(`\ufffd`)) {
			return
		}
		var v any
		if err := json.Unmarshal(raw, &v); err != nil {
			return // deeper than encoding/json goes
		}
		lossy := false
		walkStrings(v, func(s string) {
			lossy = lossy || strings.ContainsRune(s, 0) || strings.ContainsRune(s, utf8.RuneError)
		})
		if lossy != (strictErr != nil) {
			t.Fatalf("%q: checkJSON says %v, but the decoded strings lossy=%v", raw, strictErr, lossy)
		}
	})
}

// walkStrings calls fn with every string, keys included, of a decoded value.
func walkStrings(v any, fn func(string)) {
	switch v := v.(type) {
	case string:
		fn(v)
	case []any:
		for _, e := range v {
			walkStrings(e, fn)
		}
	case map[string]any:
		for k, e := range v {
			fn(k)
			walkStrings(e, fn)
		}
	}
}
