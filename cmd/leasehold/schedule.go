package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/leasehold/leasehold/internal/apitime"
	"github.com/leasehold/leasehold/internal/restclient"
	"github.com/leasehold/leasehold/schedule"
)

const scheduleUsage = `leasehold schedule: add, look at, replace and remove schedules over the REST API

usage:
  leasehold schedule add     NAME --cron EXPR --kind K [--data JSON] [--queue Q] [--priority N]
                             [--zone Z] [--lock R [--lock-limit K]] [--unique] [--max-attempts N] [--ttl D] [--json]
  leasehold schedule replace NAME --cron EXPR --kind K [the flags of add]
  leasehold schedule get     NAME [--json]
  leasehold schedule list    [--limit N] [--after-name NAME] [--json]
  leasehold schedule rm      NAME [--json]

A schedule makes one task per tick of its cron expression: five fields
(minute hour day-of-month month day-of-week), a descriptor such as @daily,
or @every with whole seconds (@every 30s), read in --zone (default UTC).
add of a name that exists with the same definition changes nothing (exit 0);
replace sets the whole definition, what is left out taking its default.

Every command takes --url (env LEASEHOLD_URL, default http://localhost:8080)
and --api-token (env LEASEHOLD_API_TOKEN). Output is a table, or with --json
the API's JSON. Exit status: 0 done; 3 add refused: a schedule of that name
exists with another definition (nothing changed); 1 any other failure (no
schedule has the name, the server unreachable, 401, ...); 2 bad usage,
a bad --cron or --zone included.
`

// Limits of the schedule API that the commands check before sending.
const maxScheduleListLimit = 10000 // GET /api/schedules?limit=, whose default is 1000

// defaultScheduleLimit is the server's page of GET /api/schedules.
const defaultScheduleLimit = 1000

// runSchedule is "leasehold schedule <command>".
func runSchedule(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, scheduleUsage)
		return errUsage
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "add", "replace":
		return runScheduleDefine(ctx, cmd, rest, getenv, stdout, stderr)
	case "get", "rm":
		return runScheduleOne(ctx, cmd, rest, getenv, stdout, stderr)
	case "list":
		return runScheduleList(ctx, rest, getenv, stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, scheduleUsage)
		return nil
	default:
		fmt.Fprint(stderr, scheduleUsage)
		return usagef("unknown schedule command %q; use add, replace, get, list or rm", cmd)
	}
}

// scheduleName is the one NAME among the positional arguments of the
// command cmd, checked as the API's name rules have it.
func scheduleName(cmd string, pos []string) (string, error) {
	example := map[string]string{
		"add": ` --cron "0 3 * * *" --kind report`, "replace": ` --cron "0 3 * * *" --kind report`,
	}[cmd]
	switch {
	case len(pos) == 0:
		return "", usagef("schedule %s needs the schedule's name, e.g. leasehold schedule %s nightly-report%s", cmd, cmd, example)
	case len(pos) > 1:
		return "", usagef("schedule %s takes one schedule name, not %q (quote a cron expression: --cron \"0 3 * * *\")", cmd, pos)
	}
	if err := checkNameValue("the schedule name", pos[0]); err != nil {
		return "", usageError{err}
	}
	return pos[0], nil
}

// checkCron checks --cron and --zone as the server will, so that a
// mistake is bad usage before anything is sent; the schedule package's
// sentence says what to fix, naming the flag.
func checkCron(expr, zone string) []error {
	var errs []error
	flagged := func(err error) error {
		var inv *schedule.InvalidError
		if errors.As(err, &inv) {
			return errors.New(strings.Replace(inv.Reason, strconv.Quote(inv.Field), "--"+inv.Field, 1))
		}
		return err
	}
	// Each checked on its own, so that a bad cron in a bad zone is told
	// both mistakes at once.
	if _, err := schedule.Parse(expr, ""); err != nil {
		errs = append(errs, flagged(err))
	}
	if zone != "" {
		if _, err := schedule.Parse("@daily", zone); err != nil {
			errs = append(errs, flagged(err))
		}
	}
	return errs
}

// runScheduleDefine is add (POST /api/schedules) and replace (PUT
// /api/schedules/{name}).
func runScheduleDefine(ctx context.Context, cmd string, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("leasehold schedule "+cmd, flag.ContinueOnError)
	cf := addClientFlags(fs, getenv)
	cron := fs.String("cron", "", `when it ticks: five fields, e.g. "0 3 * * *", a descriptor such as @daily, or "@every 30s" (required)`)
	zone := fs.String("zone", "", "the IANA time zone the cron fields are read in, e.g. Europe/Berlin (default UTC)")
	kind := fs.String("kind", "", "the kind of each task it makes: which workers run them (required)")
	data := fs.String("data", "", `the task_data of each task it makes, a JSON object, e.g. '{"report": "daily"}' (default {})`)
	queue := fs.String("queue", "", "the queue of each task it makes (default: default)")
	priority := fs.String("priority", "", "of each task it makes: lower runs first among due tasks, -32768 to 32767 (default 0)")
	lock := fs.String("lock", "", "a resource whose lease each task holds while it runs: it is claimed only when that lease is free (default: none)")
	lockLimit := fs.Int("lock-limit", 0, "with --lock: up to this many of its tasks run at once, each on a slot of the lock (1 to 1000; the lock's limit if it has none yet)")
	unique := fs.Bool("unique", false, "make no task for a tick while the previous task is pending or running (the tick is counted as skipped)")
	attempts := fs.String("max-attempts", "", "attempts before a task is dead, 1 to 100 (default 5)")
	ttl := fs.String("ttl", "", "the TTL of each task's leases, whole seconds from 1s to 1h (default the claiming server's --lease-ttl)")
	asJSON := fs.Bool("json", false, "print the schedule as the API's JSON instead of a table")
	pos, err := parseInterspersed(fs, args, stderr)
	if err != nil {
		return err
	}
	name, err := scheduleName(cmd, pos)
	if err != nil {
		return err
	}
	p := schedule.Params{Name: name, Cron: *cron, Zone: *zone, Kind: *kind, Queue: *queue, Unique: *unique, Lock: *lock, LockLimit: *lockLimit}
	var errs []error
	errs = append(errs, checkCron(*cron, *zone)...)
	if *kind == "" && !flagGiven(fs, "kind") {
		errs = append(errs, errors.New("--kind is required: the kind of task the schedule makes, which your workers run, e.g. --kind report"))
	}
	errs = append(errs, checkNameFlags(fs, map[string]string{"kind": *kind, "queue": *queue, "lock": *lock})...)
	if p.TaskData, err = jsonObjectFlag("data", *data, "the task_data of each task"); err != nil {
		errs = append(errs, err)
	}
	if p.Priority, err = priorityFlag(*priority); err != nil {
		errs = append(errs, err)
	}
	attemptsN, err := maxAttemptsFlag(*attempts)
	if err != nil {
		errs = append(errs, err)
	}
	p.MaxAttempts = int(attemptsN)
	if p.TTL, err = taskTTLFlag(*ttl); err != nil {
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
	schedules := restclient.Schedules{C: api.Keeping(&raw)}
	var (
		s       schedule.Schedule
		existed bool
	)
	if cmd == "replace" {
		s, err = schedules.Replace(ctx, p)
	} else {
		s, existed, err = schedules.Add(ctx, p)
	}
	if exists, ok := errors.AsType[*schedule.ExistsError](err); ok {
		return exitStatus{exitRefused, scheduleConflict(name, exists)}
	}
	if err != nil {
		return cf.describe(err)
	}
	if existed {
		fmt.Fprintf(stderr, "nothing changed: schedule %q exists already with this definition\n", name)
	}
	return printSchedule(stdout, *asJSON, raw, s)
}

// scheduleConflict words the refusal (409) of an add: the schedule that
// holds the name, and what to do instead.
func scheduleConflict(name string, exists *schedule.ExistsError) error {
	return fmt.Errorf("schedule %q was not added: %w; nothing changed: change it with leasehold schedule replace %s, or remove it with leasehold schedule rm %s",
		name, exists, name, name)
}

// runScheduleOne is get and rm: one schedule, named.
func runScheduleOne(ctx context.Context, cmd string, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("leasehold schedule "+cmd, flag.ContinueOnError)
	cf := addClientFlags(fs, getenv)
	asJSON := fs.Bool("json", false, "print the schedule as the API's JSON instead of a table")
	pos, err := parseInterspersed(fs, args, stderr)
	if err != nil {
		return err
	}
	name, err := scheduleName(cmd, pos)
	if err != nil {
		return err
	}
	api, done, err := cf.rest(2, requestTimeout)
	if err != nil {
		return err
	}
	defer done()
	var raw json.RawMessage
	schedules := restclient.Schedules{C: api.Keeping(&raw)}
	var s schedule.Schedule
	if cmd == "rm" {
		s, err = schedules.Delete(ctx, name)
	} else {
		s, err = schedules.Get(ctx, name)
	}
	switch {
	case errors.Is(err, schedule.ErrNotFound):
		return fmt.Errorf("no schedule is named %q; list them with leasehold schedule list", name)
	case err != nil:
		return cf.describe(err)
	}
	if cmd == "rm" && !*asJSON {
		_, err := fmt.Fprintf(stdout, "removed schedule %q (cron %q, kind %s); the tasks it made stay\n", s.Name, s.Cron, s.Kind)
		return err
	}
	return printSchedule(stdout, *asJSON, raw, s)
}

// runScheduleList is "leasehold schedule list": one page of schedules in
// name order.
func runScheduleList(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("leasehold schedule list", flag.ContinueOnError)
	cf := addClientFlags(fs, getenv)
	limit := fs.String("limit", "", fmt.Sprintf("at most this many schedules, 1 to %d (default the server's, %d)", maxScheduleListLimit, defaultScheduleLimit))
	after := fs.String("after-name", "", "only schedules whose names sort after this one: the next page after the last name shown")
	asJSON := fs.Bool("json", false, "print a JSON array of the API's schedule objects instead of a table")
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	var (
		errs       []error
		pageSize   = defaultScheduleLimit
		limitGiven int
	)
	if *limit != "" {
		n, err := strconv.Atoi(*limit)
		if err != nil || n < 1 || n > maxScheduleListLimit {
			errs = append(errs, fmt.Errorf("--limit %q must be an integer between 1 and %d", *limit, maxScheduleListLimit))
		}
		pageSize, limitGiven = n, n
	}
	if *after != "" || flagGiven(fs, "after-name") {
		errs = append(errs, checkNameFlags(fs, map[string]string{"after-name": *after})...)
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
	list, err := restclient.Schedules{C: api.Keeping(&raw)}.List(ctx, *after, limitGiven)
	if err != nil {
		return cf.describe(err)
	}
	if *asJSON {
		return printJSON(stdout, raw)
	}
	if err := scheduleTable(stdout, list); err != nil {
		return err
	}
	if n := len(list); n > 0 && n == pageSize {
		fmt.Fprintf(stderr, "there may be more: the next page is leasehold schedule list --after-name %q\n", list[n-1].Name)
	}
	return nil
}

// printSchedule writes one schedule as a table of its fields, by their
// names in the API, or with asJSON the API's JSON as it came (raw), on one
// line.
func printSchedule(w io.Writer, asJSON bool, raw []byte, s schedule.Schedule) error {
	if asJSON {
		return printJSON(w, raw)
	}
	return scheduleDetail(w, s, time.Now())
}

// taskDataWidth is how much of a schedule's task_data its table shows.
const taskDataWidth = 120

// scheduleDetail writes one schedule, a line per field; "-" stands for
// what is not set, and the next tick is also told from now.
func scheduleDetail(w io.Writer, s schedule.Schedule, now time.Time) error {
	next := apitime.Format(s.NextTick)
	if d := s.NextTick.Sub(now); d > 0 {
		next += " (in " + age(d) + ")"
	} else {
		next += " (due)"
	}
	lastTick := "-"
	if s.LastTick != nil {
		lastTick = apitime.Format(*s.LastTick)
	}
	lastError := "-"
	if s.LastTask != nil {
		lastError = orDash(oneLine(s.LastTask.LastError, lastErrorWidth))
	}
	ttl := "-"
	if s.TTLSeconds != 0 {
		ttl = strconv.Itoa(int(s.TTLSeconds))
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, f := range [][2]string{
		{"name", s.Name},
		{"cron", oneLine(s.Cron, maxNameBytes)},
		{"zone", s.Zone},
		{"kind", s.Kind},
		{"task_data", oneLine(string(s.TaskData), taskDataWidth)},
		{"queue", s.Queue},
		{"priority", strconv.Itoa(int(s.Priority))},
		{"unique", strconv.FormatBool(s.Unique)},
		{"lock", orDash(s.Lock)},
		{"max_attempts", strconv.Itoa(int(s.MaxAttempts))},
		{"ttl_seconds", ttl},
		{"next_tick", next},
		{"last_tick", lastTick},
		{"last_task", lastTask(s.LastTask)},
		{"last_error", lastError},
		{"missed_ticks", strconv.FormatInt(s.MissedTicks, 10)},
		{"skipped_ticks", strconv.FormatInt(s.SkippedTicks, 10)},
		{"created_at", apitime.Format(s.CreatedAt)},
		{"updated_at", apitime.Format(s.UpdatedAt)},
	} {
		fmt.Fprintf(tw, "%s\t%s\n", f[0], f[1])
	}
	return tw.Flush()
}

// lastTask words a schedule's last task: its ID and state.
func lastTask(t *schedule.LastTask) string {
	if t == nil {
		return "-"
	}
	return strconv.FormatInt(t.ID, 10) + " " + t.State
}

// scheduleTable writes schedules as an aligned table, a row each; "-"
// stands for what is not set. Columns are two spaces apart or more, and no
// cell holds two spaces in a row.
func scheduleTable(w io.Writer, list []schedule.Schedule) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tCRON\tZONE\tKIND\tNEXT_TICK\tLAST_TASK\tMISSED\tSKIPPED")
	for _, s := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\n",
			oneLine(s.Name, maxNameBytes), oneLine(s.Cron, maxNameBytes), s.Zone, oneLine(s.Kind, maxNameBytes),
			apitime.Format(s.NextTick), lastTask(s.LastTask), s.MissedTicks, s.SkippedTicks)
	}
	return tw.Flush()
}
