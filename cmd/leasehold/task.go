package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/leasehold/leasehold/internal/name"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/apitime"
	"github.com/leasehold/leasehold/task"
)

const taskUsage = `leasehold task: add, look at, cancel and retry tasks over the REST API

usage:
  leasehold task add    --data JSON [--kind K] [--queue Q] [--priority N] [--unique-key K]
                        [--lock R] [--ttl D] [--scheduled-at T] [--max-attempts N] [--json]
  leasehold task get    ID [--json]
  leasehold task list   [--state S] [--kind K] [--queue Q] [--limit N] [--after-id ID] [--json]
  leasehold task cancel ID [--reason R] [--json]
  leasehold task retry  ID [--json]

Every command takes --url (env LEASEHOLD_URL, default http://localhost:8080) and
--api-token (env LEASEHOLD_API_TOKEN). Output is a table, or with --json the
API's JSON. Exit status: 0 done; 3 the server refused because of the task's
state (cancel: it is done, dead or cancelled already; retry: it is not dead or
cancelled, or another task of its kind holds its unique key); 1 any other
failure (no task has the ID, the server unreachable, 401, ...); 2 bad usage.
`

// exitRefused is the exit status of a task command the server refused
// because of the task's state (409): a normal outcome a script may expect,
// as the lease commands' 75 and 76 are.
const exitRefused = 3

// Limits of the task API that the commands check before sending.
const (
	maxTaskListLimit = 1000 // GET /api/tasks?limit=
	defaultTaskLimit = 100  // the server's default page
	maxAttempts      = 100
	maxNameBytes     = 255 // kinds, queues, unique keys, locks, processors, schedules
	// maxErrorBytes bounds a text that lands in a task's last_error: a
	// failure's error, a cancellation's reason.
	maxErrorBytes = 4096
	// maxAnswerBytes bounds what is read of one answer: a page of 1000
	// tasks with sizeable task_data fits.
	maxAnswerBytes = 64 << 20
)

// taskClient is the REST API of tasks and schedules (contract §3, §6 and
// §9) as the task, work and schedule commands call it. They do not go
// through the library's remote client: it has no task list and claims one
// queue at a time, and --json prints the API's own JSON, which this client
// keeps as it came.
type taskClient struct {
	base  *url.URL
	token string
	http  *http.Client
}

// taskClient returns a client of the server's task API whose transport
// keeps up to conns idle connections, and a function that closes them, for
// when the command is done. timeout bounds each request (0: only its
// context does). A bad --url is a usage error.
func (c *clientFlags) taskClient(conns int, timeout time.Duration) (*taskClient, func(), error) {
	// The library's checks of the URL, so that every command refuses the
	// same URLs with the same words.
	if _, err := leasehold.NewRemoteClient(leasehold.RemoteConfig{URL: c.url}, leasehold.Config{}); err != nil {
		return nil, nil, usagef("--url: %s", strings.TrimPrefix(err.Error(), leasehold.ErrInvalidConfig.Error()+": "))
	}
	u, err := url.Parse(c.url)
	if err != nil { // cannot happen: checked above
		return nil, nil, usagef("--url: %w", err)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	u.RawPath = ""
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConnsPerHost = max(conns, 2)
	return &taskClient{base: u, token: c.token, http: &http.Client{Transport: transport, Timeout: timeout}},
		transport.CloseIdleConnections, nil
}

// do sends one request and returns the status and body of the answer.
// An answer other than 2xx is a *leasehold.StatusError with the server's
// sentence, its body still returned for what it holds besides (a 409 of
// POST /api/schedules carries the schedule that holds the name); a request
// that got no answer, a *url.Error.
func (c *taskClient) do(ctx context.Context, method, path string, query url.Values, in any) (int, []byte, error) {
	u := c.base.JoinPath(path)
	u.RawQuery = query.Encode()
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return 0, nil, fmt.Errorf("%s %s: encode the request: %w", method, path, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		return 0, nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, nil, err // a *url.Error
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes))
	if err != nil {
		return 0, nil, &url.Error{Op: method, URL: u.String(), Err: fmt.Errorf("reading the answer (%d): %w", resp.StatusCode, err)}
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return resp.StatusCode, raw, nil
	}
	var eb struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(raw, &eb) != nil || eb.Error == "" {
		eb.Error = strings.TrimSpace(string(raw[:min(len(raw), 200)]))
	}
	return resp.StatusCode, raw, &leasehold.StatusError{Method: method, Path: u.Path, StatusCode: resp.StatusCode, Message: eb.Error}
}

// statusOf is the status of the answer that err is, 0 when it is none.
func statusOf(err error) int {
	var s *leasehold.StatusError
	if errors.As(err, &s) {
		return s.StatusCode
	}
	return 0
}

// decodeTask decodes one task of an answer.
func decodeTask(method, path string, raw []byte) (task.Task, error) {
	var t task.Task
	if err := json.Unmarshal(raw, &t); err != nil {
		return task.Task{}, fmt.Errorf("%s %s: the answer is not a task: %w", method, path, err)
	}
	return t, nil
}

// oneTask sends a request whose answer is a task, and returns it with the
// answer's JSON.
func (c *taskClient) oneTask(ctx context.Context, method, path string, in any) (task.Task, []byte, int, error) {
	status, raw, err := c.do(ctx, method, path, nil, in)
	if err != nil {
		return task.Task{}, nil, status, err
	}
	t, err := decodeTask(method, path, raw)
	return t, raw, status, err
}

// listTasks is GET /api/tasks with filters and keyset paging.
func (c *taskClient) listTasks(ctx context.Context, q url.Values) ([]task.Task, []byte, error) {
	_, raw, err := c.do(ctx, http.MethodGet, "/api/tasks", q, nil)
	if err != nil {
		return nil, nil, err
	}
	var ts []task.Task
	if err := json.Unmarshal(raw, &ts); err != nil {
		return nil, nil, fmt.Errorf("GET /api/tasks: the answer is not a list of tasks: %w", err)
	}
	return ts, raw, nil
}

// runTask is "leasehold task <command>".
func runTask(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, taskUsage)
		return errUsage
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "add":
		return runTaskAdd(ctx, rest, getenv, stdout, stderr)
	case "get", "cancel", "retry":
		return runTaskOne(ctx, cmd, rest, getenv, stdout, stderr)
	case "list":
		return runTaskList(ctx, rest, getenv, stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, taskUsage)
		return nil
	default:
		fmt.Fprint(stderr, taskUsage)
		return usagef("unknown task command %q; use add, get, list, cancel or retry", cmd)
	}
}

// checkFlagName checks the value of a name flag (kind, queue, unique key,
// lock, processor) as the API's name rules have it: 1 to 255 bytes of
// UTF-8, no control characters.
func checkFlagName(flagName, v string) error { return checkNameValue("--"+flagName, v) }

// checkNameValue checks a name by the one rule of the API (internal/name);
// what names it in the error ("--kind", "the schedule name").
func checkNameValue(what, v string) error { return name.Check(what, v) }

// newTaskBody is the body of POST /api/tasks: what is not given is left out,
// for the server's defaults.
type newTaskBody struct {
	TaskData    json.RawMessage `json:"task_data"`
	Kind        string          `json:"kind,omitempty"`
	Queue       string          `json:"queue,omitempty"`
	Priority    *int64          `json:"priority,omitempty"`
	UniqueKey   string          `json:"unique_key,omitempty"`
	TTLSeconds  int64           `json:"ttl_seconds,omitempty"`
	ScheduledAt string          `json:"scheduled_at,omitempty"`
	MaxAttempts int64           `json:"max_attempts,omitempty"`
	Lock        string          `json:"lock,omitempty"`
}

// runTaskAdd is "leasehold task add": one task, POST /api/tasks.
func runTaskAdd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("leasehold task add", flag.ContinueOnError)
	cf := addClientFlags(fs, getenv)
	data := fs.String("data", "", `the task's task_data, a JSON object, e.g. '{"n": 5}' (required)`)
	kind := fs.String("kind", "", "the task's kind: which workers run it (default the server's: sleep, the demo's kind)")
	queue := fs.String("queue", "", "the task's queue (default: default)")
	priority := fs.String("priority", "", "lower runs first among due tasks, -32768 to 32767 (default 0)")
	uniqueKey := fs.String("unique-key", "", "insert nothing when a task of the kind, not cancelled, holds this key already (its task is shown)")
	lock := fs.String("lock", "", "a resource whose lease the task holds while it runs: it is claimed only when that lease is free (default: none)")
	ttl := fs.String("ttl", "", "the TTL of the task's leases, whole seconds from 1s to 1h (default the server's --lease-ttl)")
	scheduledAt := fs.String("scheduled-at", "", "when the task falls due, RFC 3339, e.g. 2030-01-02T15:04:05Z (default now)")
	attempts := fs.String("max-attempts", "", "attempts before the task is dead, 1 to 100 (default 5)")
	asJSON := fs.Bool("json", false, "print the task as the API's JSON instead of a table")
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	var errs []error
	body := newTaskBody{Kind: *kind, Queue: *queue, UniqueKey: *uniqueKey, Lock: *lock}
	switch d, err := jsonObjectFlag("data", *data, "the task's task_data"); {
	case err != nil:
		errs = append(errs, err)
	case d == nil:
		errs = append(errs, errors.New(`--data is required: the task's task_data as a JSON object, e.g. --data '{"n": 5}'`))
	default:
		body.TaskData = d
	}
	errs = append(errs, checkNameFlags(fs, map[string]string{"kind": *kind, "queue": *queue, "unique-key": *uniqueKey, "lock": *lock})...)
	var err error
	if body.Priority, err = priorityFlag(*priority); err != nil {
		errs = append(errs, err)
	}
	if body.TTLSeconds, err = taskTTLFlag(*ttl); err != nil {
		errs = append(errs, err)
	}
	if *scheduledAt != "" {
		at, err := time.Parse(time.RFC3339Nano, *scheduledAt)
		if err != nil || at.Year() < 1 || at.Year() > 9999 {
			errs = append(errs, fmt.Errorf("--scheduled-at %q must be an RFC 3339 time, e.g. 2030-01-02T15:04:05Z", *scheduledAt))
		}
		body.ScheduledAt = apitime.Format(at)
	}
	if body.MaxAttempts, err = maxAttemptsFlag(*attempts); err != nil {
		errs = append(errs, err)
	}
	if err := joinUsage(errs); err != nil {
		return err
	}
	client, done, err := cf.taskClient(2, requestTimeout)
	if err != nil {
		return err
	}
	defer done()
	t, raw, status, err := client.oneTask(ctx, http.MethodPost, "/api/tasks", body)
	if err != nil {
		return cf.describe(err)
	}
	if status == http.StatusOK { // a unique key another task holds: nothing inserted
		fmt.Fprintf(stderr, "nothing inserted: task %d (%s) of kind %s holds the unique key %q already\n", t.ID, t.State, t.Kind, t.UniqueKey)
	}
	return printTasks(stdout, *asJSON, raw, []task.Task{t})
}

// The checks of the flags that define a task, shared by task add and the
// schedule commands (whose flags define each task a schedule makes). Each
// returns the value for the request, the zero value when the flag is
// empty (the server's default), and a usage error's sentence.

// jsonObjectFlag is the value of a flag that holds a JSON object, what
// naming what it is; nil when raw is empty.
func jsonObjectFlag(name, raw, what string) (json.RawMessage, error) {
	d := bytes.TrimSpace([]byte(raw))
	switch {
	case len(d) == 0:
		return nil, nil
	case !json.Valid(d) || d[0] != '{':
		return nil, fmt.Errorf(`--%s %.60q must be a JSON object (%s), e.g. --%s '{"n": 5}'`, name, raw, what, name)
	}
	return d, nil
}

// priorityFlag is --priority: -32768 to 32767; nil when not given.
func priorityFlag(raw string) (*int64, error) {
	if raw == "" {
		return nil, nil
	}
	n, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || n < -32768 || n > 32767 {
		return nil, fmt.Errorf("--priority %q must be an integer between -32768 and 32767 (lower runs first)", raw)
	}
	return &n, nil
}

// taskTTLFlag is --ttl, the TTL of a task's leases, in whole seconds.
func taskTTLFlag(raw string) (int64, error) {
	if raw == "" {
		return 0, nil
	}
	d, err := durationFlag("ttl", raw, time.Second, time.Hour, true, "30s")
	return int64(d / time.Second), err
}

// maxAttemptsFlag is --max-attempts: 1 to 100.
func maxAttemptsFlag(raw string) (int64, error) {
	if raw == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || n < 1 || n > maxAttempts {
		return 0, fmt.Errorf("--max-attempts %q must be an integer between 1 and %d", raw, maxAttempts)
	}
	return n, nil
}

// checkNameFlags checks the name flags of fs that are set or were given
// (an empty one given is a mistake: leave it out for the default), in the
// order of their names.
func checkNameFlags(fs *flag.FlagSet, flags map[string]string) []error {
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(flags)) {
		if v := flags[name]; v != "" || flagGiven(fs, name) {
			if err := checkFlagName(name, v); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errs
}

// flagGiven reports whether the flag name was given on the command line.
func flagGiven(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// runTaskOne is get, cancel and retry: one task, named by its ID.
func runTaskOne(ctx context.Context, cmd string, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("leasehold task "+cmd, flag.ContinueOnError)
	cf := addClientFlags(fs, getenv)
	var reason string
	if cmd == "cancel" {
		fs.StringVar(&reason, "reason", "", "why, recorded as the task's last_error (default: cancelled)")
	}
	asJSON := fs.Bool("json", false, "print the task as the API's JSON instead of a table")
	pos, err := parseInterspersed(fs, args, stderr)
	if err != nil {
		return err
	}
	var id int64
	switch {
	case len(pos) == 0:
		return usagef("task %s needs a task ID, e.g. leasehold task %s 12", cmd, cmd)
	case len(pos) > 1:
		return usagef("task %s takes one task ID, not %q", cmd, pos)
	default:
		id, err = strconv.ParseInt(pos[0], 10, 64)
		if err != nil || id < 1 {
			return usagef("task ID %q must be a positive integer, e.g. leasehold task %s 12", pos[0], cmd)
		}
	}
	if flagGiven(fs, "reason") {
		if err := checkReason(reason); err != nil {
			return usageError{err}
		}
	}
	client, done, err := cf.taskClient(2, requestTimeout)
	if err != nil {
		return err
	}
	defer done()

	method, path := http.MethodGet, "/api/tasks/"+strconv.FormatInt(id, 10)
	var body any
	switch cmd {
	case "cancel":
		method, path = http.MethodPost, path+"/cancel"
		b := map[string]string{}
		if flagGiven(fs, "reason") {
			b["reason"] = reason
		}
		body = b
	case "retry":
		method, path, body = http.MethodPost, path+"/retry", struct{}{}
	}
	t, raw, _, err := client.oneTask(ctx, method, path, body)
	switch statusOf(err) {
	case 0:
		if err != nil {
			return cf.describe(err)
		}
	case http.StatusNotFound:
		return fmt.Errorf("no task has ID %d; list them with leasehold task list", id)
	case http.StatusConflict:
		return exitStatus{exitRefused, refusal(ctx, client, cmd, id, err)}
	default:
		return cf.describe(err)
	}
	return printTasks(stdout, *asJSON, raw, []task.Task{t})
}

// refusal words the server's refusal (409) to cancel or retry task id:
// the state the task is in, when it can be read, and what the command
// takes; else the server's own sentence.
func refusal(ctx context.Context, client *taskClient, cmd string, id int64, err error) error {
	var s *leasehold.StatusError
	errors.As(err, &s)
	verb := map[string]string{"cancel": "cancelled", "retry": "retried"}[cmd]
	t, _, _, gerr := client.oneTask(ctx, http.MethodGet, "/api/tasks/"+strconv.FormatInt(id, 10), nil)
	switch {
	case gerr != nil:
		return fmt.Errorf("task %d cannot be %s: %s", id, verb, s.Message)
	case cmd == "retry" && strings.Contains(s.Message, "unique key"):
		return fmt.Errorf("task %d cannot be retried: another task of kind %s holds its unique key %q (%s)", id, t.Kind, t.UniqueKey, s.Message)
	case cmd == "retry":
		return fmt.Errorf("task %d cannot be retried: it is %s, and only a dead or cancelled task can be", id, t.State)
	default:
		return fmt.Errorf("task %d cannot be cancelled: it is %s, and only a pending or running task can be", id, t.State)
	}
}

// checkReason checks a cancellation's --reason as the API does: at most
// 4096 bytes, no NUL.
func checkReason(r string) error {
	switch {
	case len(r) > maxErrorBytes:
		return fmt.Errorf("--reason is %d bytes long; the limit is %d", len(r), maxErrorBytes)
	case strings.ContainsRune(r, 0):
		return errors.New("--reason contains a NUL character; remove it")
	}
	return nil
}

// runTaskList is "leasehold task list": one page of tasks in id order.
func runTaskList(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("leasehold task list", flag.ContinueOnError)
	cf := addClientFlags(fs, getenv)
	state := fs.String("state", "", "only tasks in this state: pending, running, done, dead or cancelled (default: all)")
	kind := fs.String("kind", "", "only tasks of this kind")
	queue := fs.String("queue", "", "only tasks of this queue")
	limit := fs.String("limit", "", "at most this many tasks, 1 to 1000 (default the server's, 100)")
	after := fs.String("after-id", "", "only tasks with a greater ID: the next page after the last ID shown")
	asJSON := fs.Bool("json", false, "print a JSON array of the API's task objects instead of a table")
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	q := url.Values{}
	var errs []error
	switch *state {
	case "":
	case task.StatePending, task.StateRunning, task.StateDone, task.StateDead, task.StateCancelled:
		q.Set("state", *state)
	default:
		errs = append(errs, fmt.Errorf("--state %q must be pending, running, done, dead or cancelled", *state))
	}
	for _, f := range []struct{ name, v string }{{"kind", *kind}, {"queue", *queue}} {
		if f.v == "" && !flagGiven(fs, f.name) {
			continue
		}
		if err := checkFlagName(f.name, f.v); err != nil {
			errs = append(errs, err)
		}
		q.Set(f.name, f.v)
	}
	pageSize := defaultTaskLimit
	if *limit != "" {
		n, err := strconv.Atoi(*limit)
		if err != nil || n < 1 || n > maxTaskListLimit {
			errs = append(errs, fmt.Errorf("--limit %q must be an integer between 1 and %d", *limit, maxTaskListLimit))
		}
		q.Set("limit", *limit)
		pageSize = n
	}
	if *after != "" {
		n, err := strconv.ParseInt(*after, 10, 64)
		if err != nil || n < 0 {
			errs = append(errs, fmt.Errorf("--after-id %q must be a task ID, a non-negative integer", *after))
		}
		q.Set("after_id", *after)
	}
	if err := joinUsage(errs); err != nil {
		return err
	}
	client, done, err := cf.taskClient(2, requestTimeout)
	if err != nil {
		return err
	}
	defer done()
	tasks, raw, err := client.listTasks(ctx, q)
	if err != nil {
		return cf.describe(err)
	}
	if err := printTasks(stdout, *asJSON, raw, tasks); err != nil {
		return err
	}
	if n := len(tasks); !*asJSON && n > 0 && n == pageSize {
		fmt.Fprintf(stderr, "there may be more: the next page is leasehold task list --after-id %d\n", tasks[n-1].ID)
	}
	return nil
}

// printTasks writes tasks as a table, or with asJSON the API's JSON as it
// came (raw), on one line.
func printTasks(w io.Writer, asJSON bool, raw []byte, tasks []task.Task) error {
	if asJSON {
		return printJSON(w, raw)
	}
	return taskTable(w, tasks, time.Now())
}

// printJSON writes the API's JSON as it came (raw), on one line.
func printJSON(w io.Writer, raw []byte) error {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return fmt.Errorf("the server's answer is not JSON: %w", err)
	}
	b.WriteByte('\n')
	_, err := w.Write(b.Bytes())
	return err
}

// taskTable writes tasks as an aligned table; "-" stands for what is not
// set, and ages count to now.
func taskTable(w io.Writer, tasks []task.Task, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tKIND\tQUEUE\tPRIORITY\tATTEMPTS\tPROCESSOR\tFENCE\tLOCK\tSCHEDULE\tSCHEDULED_AT\tAGE\tLAST_ERROR")
	for _, t := range tasks {
		fence := "-"
		if t.Fence != 0 {
			fence = strconv.FormatInt(t.Fence, 10)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%d/%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n",
			t.ID, t.State, orDash(t.Kind), orDash(t.Queue), t.Priority, t.Attempts, t.MaxAttempts, orDash(t.Processor), fence,
			orDash(t.Lock), orDash(t.Schedule), apitime.Format(t.ScheduledAt), age(now.Sub(t.CreatedAt)),
			orDash(oneLine(t.LastError, lastErrorWidth)))
	}
	return tw.Flush()
}

// lastErrorWidth is how much of a task's last error its table row shows.
const lastErrorWidth = 60

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// printable is s with its control and format characters written as escapes
// (\u001b): what a task's error or a schedule's data holds is another
// program's text, which must not move the cursor, recolour or clear the
// terminal it is printed to, nor read right to left.
func printable(s string) string {
	if !strings.ContainsFunc(s, func(r rune) bool { return unicode.In(r, unicode.Cc, unicode.Cf) }) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if unicode.In(r, unicode.Cc, unicode.Cf) {
			fmt.Fprintf(&b, "\\u%04x", r)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// oneLine is s on one line (every run of white space one space, control
// characters escaped: printable), cut to
// at most width runes with an ellipsis.
func oneLine(s string, width int) string {
	s = printable(strings.Join(strings.Fields(s), " "))
	if utf8.RuneCountInString(s) <= width {
		return s
	}
	r := []rune(s)
	return string(r[:width-1]) + "…"
}

// age words a duration for a table: 42s, 5m3s, 2h7m, 3d4h.
func age(d time.Duration) string {
	d = max(d, 0).Round(time.Second)
	switch {
	case d < time.Minute:
		return d.String()
	case d < time.Hour:
		return fmt.Sprintf("%dm%ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh%dm", int(d.Hours()), int(d.Minutes())%60)
	default:
		return fmt.Sprintf("%dd%dh", int(d.Hours())/24, int(d.Hours())%24)
	}
}
