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
	"github.com/leasehold/leasehold/internal/restclient"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/internal/worker"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/task"
)

const taskUsage = `leasehold task: add, look at, cancel and retry tasks over the REST API

usage:
  leasehold task add    --data JSON [--kind K] [--queue Q] [--priority N] [--unique-key K]
                        [--lock R [--lock-limit K]] [--ttl D] [--scheduled-at T] [--max-attempts N] [--json]
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
	defaultTaskLimit = 100 // the server's default page
	maxAttempts      = 100
	maxNameBytes     = 255 // kinds, queues, unique keys, locks, processors, schedules
	// maxErrorBytes bounds a text that lands in a task's last_error: a
	// failure's error, a cancellation's reason.
	maxErrorBytes = worker.MaxErrorBytes
)

// rest returns the REST client of the task, schedule and work commands
// (the library's, internal/restclient), whose transport keeps up to conns
// idle connections, and a function that closes them, for when the command
// is done. timeout bounds each request; one that waits on the server gets
// its wait on top. A bad --url is a usage error.
func (c *clientFlags) rest(conns int, timeout time.Duration) (*restclient.Client, func(), error) {
	u, err := restclient.ParseBase(c.url)
	if err != nil {
		return nil, nil, usagef("--url: %w", err)
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConnsPerHost = max(conns, 2)
	hc := &http.Client{Transport: transport, Timeout: timeout}
	return restclient.New(u, c.token, hc, func(method, path string, status int, message string) error {
		return &leasehold.StatusError{Method: method, Path: path, StatusCode: status, Message: message}
	}), transport.CloseIdleConnections, nil
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
	lockLimit := fs.Int("lock-limit", 0, "with --lock: up to this many tasks of the lock run at once, each on a slot of its own (1 to 1000; the lock's limit if it has none yet)")
	ttl := fs.String("ttl", "", "the TTL of the task's leases, whole seconds from 1s to 1h (default the server's --lease-ttl)")
	scheduledAt := fs.String("scheduled-at", "", "when the task falls due, RFC 3339, e.g. 2030-01-02T15:04:05Z (default now)")
	attempts := fs.String("max-attempts", "", "attempts before the task is dead, 1 to 100 (default 5)")
	asJSON := fs.Bool("json", false, "print the task as the API's JSON instead of a table")
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	var errs []error
	nt := taskstore.NewTask{Kind: *kind, Queue: *queue, UniqueKey: *uniqueKey, Lock: *lock, LockLimit: *lockLimit}
	if flagSet(fs, "lock-limit") && (*lock == "" || *lockLimit < 1 || *lockLimit > lease.MaxSlots) {
		errs = append(errs, fmt.Errorf("--lock-limit %d needs a --lock and must be from 1 to %d, e.g. --lock imports:acme --lock-limit 3", *lockLimit, lease.MaxSlots))
	}
	switch d, err := jsonObjectFlag("data", *data, "the task's task_data"); {
	case err != nil:
		errs = append(errs, err)
	case d == nil:
		errs = append(errs, errors.New(`--data is required: the task's task_data as a JSON object, e.g. --data '{"n": 5}'`))
	default:
		nt.TaskData = d
	}
	errs = append(errs, checkNameFlags(fs, map[string]string{"kind": *kind, "queue": *queue, "unique-key": *uniqueKey, "lock": *lock})...)
	var err error
	if nt.Priority, err = priorityFlag(*priority); err != nil {
		errs = append(errs, err)
	}
	if nt.TTL, err = taskTTLFlag(*ttl); err != nil {
		errs = append(errs, err)
	}
	if *scheduledAt != "" {
		at, err := time.Parse(time.RFC3339Nano, *scheduledAt)
		if err != nil || at.Year() < 1 || at.Year() > 9999 {
			errs = append(errs, fmt.Errorf("--scheduled-at %q must be an RFC 3339 time, e.g. 2030-01-02T15:04:05Z", *scheduledAt))
		}
		nt.ScheduledAt = at
	}
	if nt.MaxAttempts, err = maxAttemptsFlag(*attempts); err != nil {
		errs = append(errs, err)
	}
	if err := joinUsage(errs); err != nil {
		return err
	}
	api, done, err := cf.rest(2, requestTimeout)
	if err != nil {
		return err
	}
	defer done()
	var raw json.RawMessage
	ins, err := restclient.Tasks{C: api.Keeping(&raw)}.InsertOne(ctx, nt)
	if err != nil {
		return cf.describe(err)
	}
	if t := ins.Task; ins.Duplicate { // a unique key another task holds: nothing inserted
		fmt.Fprintf(stderr, "nothing inserted: task %d (%s) of kind %s holds the unique key %q already\n", t.ID, t.State, t.Kind, t.UniqueKey)
	}
	return printTasks(stdout, *asJSON, raw, []task.Task{ins.Task})
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

// priorityFlag is --priority: -32768 to 32767; 0 when not given.
func priorityFlag(raw string) (int16, error) {
	if raw == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(raw, 10, 16)
	if err != nil {
		return 0, fmt.Errorf("--priority %q must be an integer between -32768 and 32767 (lower runs first)", raw)
	}
	return int16(n), nil
}

// taskTTLFlag is --ttl, the TTL of a task's leases, in whole seconds.
func taskTTLFlag(raw string) (time.Duration, error) {
	if raw == "" {
		return 0, nil
	}
	return durationFlag("ttl", raw, time.Second, time.Hour, true, "30s")
}

// maxAttemptsFlag is --max-attempts: 1 to 100.
func maxAttemptsFlag(raw string) (int32, error) {
	if raw == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(raw, 10, 32)
	if err != nil || n < 1 || n > maxAttempts {
		return 0, fmt.Errorf("--max-attempts %q must be an integer between 1 and %d", raw, maxAttempts)
	}
	return int32(n), nil
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
	api, done, err := cf.rest(2, requestTimeout)
	if err != nil {
		return err
	}
	defer done()
	var raw json.RawMessage
	tasks := restclient.Tasks{C: api.Keeping(&raw)}
	var t task.Task
	switch cmd {
	case "cancel":
		if !flagGiven(fs, "reason") {
			reason = ""
		}
		t, err = tasks.Cancel(ctx, id, reason)
	case "retry":
		t, err = tasks.Retry(ctx, id)
	default:
		t, err = tasks.Get(ctx, id)
	}
	switch {
	case errors.Is(err, task.ErrNotFound):
		return fmt.Errorf("no task has ID %d; list them with leasehold task list", id)
	case errors.Is(err, task.ErrNotCancellable), errors.Is(err, task.ErrNotRetryable), errors.Is(err, task.ErrUniqueKeyTaken):
		return exitStatus{exitRefused, refusal(ctx, restclient.Tasks{C: api}, cmd, id, err)}
	case err != nil:
		return cf.describe(err)
	}
	return printTasks(stdout, *asJSON, raw, []task.Task{t})
}

// refusal words the server's refusal (409) to cancel or retry task id:
// the state the task is in, when it can be read, and what the command
// takes; else the refusal's own sentence.
func refusal(ctx context.Context, tasks restclient.Tasks, cmd string, id int64, err error) error {
	verb := map[string]string{"cancel": "cancelled", "retry": "retried"}[cmd]
	t, gerr := tasks.Get(ctx, id)
	switch {
	case gerr != nil:
		return fmt.Errorf("task %d cannot be %s: %w", id, verb, err)
	case errors.Is(err, task.ErrUniqueKeyTaken):
		return fmt.Errorf("task %d cannot be retried: another task of kind %s holds its unique key %q (%w)", id, t.Kind, t.UniqueKey, err)
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
	var (
		f    restclient.ListFilter
		errs []error
	)
	switch *state {
	case "":
	case task.StatePending, task.StateRunning, task.StateDone, task.StateDead, task.StateCancelled:
		f.State = *state
	default:
		errs = append(errs, fmt.Errorf("--state %q must be pending, running, done, dead or cancelled", *state))
	}
	errs = append(errs, checkNameFlags(fs, map[string]string{"kind": *kind, "queue": *queue})...)
	f.Kind, f.Queue = *kind, *queue
	pageSize := defaultTaskLimit
	if *limit != "" {
		n, err := strconv.Atoi(*limit)
		if err != nil || n < 1 || n > restclient.MaxListLimit {
			errs = append(errs, fmt.Errorf("--limit %q must be an integer between 1 and %d", *limit, restclient.MaxListLimit))
		}
		f.Limit, pageSize = n, n
	}
	if *after != "" {
		n, err := strconv.ParseInt(*after, 10, 64)
		if err != nil || n < 0 {
			errs = append(errs, fmt.Errorf("--after-id %q must be a task ID, a non-negative integer", *after))
		}
		f.AfterID = n
	}
	if err := joinUsage(errs); err != nil {
		return err
	}
	api, done, err := cf.rest(2, requestTimeout)
	if err != nil {
		return err
	}
	defer done()
	tasks, raw, err := restclient.Tasks{C: api}.Page(ctx, f)
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
