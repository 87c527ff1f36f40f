package schedule_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/schedule"
)

func ticks(t *testing.T, expr, zone, from string, n int) []string {
	t.Helper()
	s, err := schedule.Parse(expr, zone)
	if err != nil {
		t.Fatal(err)
	}
	at, err := time.Parse(time.RFC3339, from)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for range n {
		at = s.Next(at)
		out = append(out, at.Format(time.RFC3339))
	}
	return out
}

// TestNextAcrossDST: in a zone with changes of the clocks, a schedule ticks
// as cron(8) does: a local time skipped by the change forward runs at the
// change, one that happens twice when the clocks go back runs once, and a
// schedule with "*" hours runs every hour the clock shows.
func TestNextAcrossDST(t *testing.T) {
	for _, c := range []struct {
		name, expr, zone, from string
		want                   []string
	}{
		{"daily at 02:30 across the change forward (New York, 2027-03-14 02:00 → 03:00)", "30 2 * * *", "America/New_York", "2027-03-13T00:00:00Z",
			[]string{"2027-03-13T07:30:00Z", "2027-03-14T07:00:00Z", "2027-03-15T06:30:00Z"}},
		{"daily at 01:30 across the change back (New York, 2027-11-07 02:00 → 01:00)", "30 1 * * *", "America/New_York", "2027-11-06T00:00:00Z",
			[]string{"2027-11-06T05:30:00Z", "2027-11-07T05:30:00Z", "2027-11-08T06:30:00Z"}},
		{"daily at 09:00 in Berlin, winter then summer", "0 9 * * *", "Europe/Berlin", "2027-03-27T00:00:00Z",
			[]string{"2027-03-27T08:00:00Z", "2027-03-28T07:00:00Z", "2027-03-29T07:00:00Z"}},
		{"every hour at :00 in Berlin across the change back: every hour of the clock", "0 * * * *", "Europe/Berlin", "2027-10-30T23:30:00Z",
			[]string{"2027-10-31T00:00:00Z", "2027-10-31T01:00:00Z", "2027-10-31T02:00:00Z"}},
		{"at 02:15 and 02:45 across the change forward (Berlin, 2027-03-28 02:00 → 03:00): both at the change", "15,45 2 * * *", "Europe/Berlin", "2027-03-27T12:00:00Z",
			[]string{"2027-03-28T01:00:00Z", "2027-03-29T00:15:00Z", "2027-03-29T00:45:00Z"}},
		{"UTC has no change", "30 2 * * *", "", "2027-03-13T00:00:00Z",
			[]string{"2027-03-13T02:30:00Z", "2027-03-14T02:30:00Z", "2027-03-15T02:30:00Z"}},
		{"@every 90s", "@every 1m30s", "", "2027-03-13T00:00:00Z",
			[]string{"2027-03-13T00:01:30Z", "2027-03-13T00:03:00Z", "2027-03-13T00:04:30Z"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := ticks(t, c.expr, c.zone, c.from, len(c.want))
			if strings.Join(got, " ") != strings.Join(c.want, " ") {
				t.Errorf("ticks of %q in %q after %s:\n got %v\nwant %v", c.expr, c.zone, c.from, got, c.want)
			}
		})
	}
}

// TestParseRefuses: what Parse refuses, each with a message that says what
// to fix, and an error a caller can test.
func TestParseRefuses(t *testing.T) {
	for _, c := range []struct{ expr, zone, field, says string }{
		{"", "", "cron", "required"},
		{"61 * * * *", "", "cron", "not a cron expression"},
		{"* * * *", "", "cron", "not a cron expression"},
		{"* * * * * *", "", "cron", "not a cron expression"},
		{"@every 500ms", "", "cron", "whole number of seconds"},
		{"@every 1.5s", "", "cron", "whole number of seconds"},
		{"@every soon", "", "cron", "not a duration"},
		{"CRON_TZ=Europe/Berlin 0 9 * * *", "", "cron", `"zone"`},
		{"0 0 30 2 *", "", "cron", "never ticks"},
		{"0 9 * * *", "Mars/Olympus", "zone", "IANA"},
		{"0 9 * * *", "Local", "zone", "each replica's own zone"},
	} {
		_, err := schedule.Parse(c.expr, c.zone)
		var inv *schedule.InvalidError
		switch {
		case !errors.As(err, &inv) || !errors.Is(err, schedule.ErrInvalid):
			t.Errorf("Parse(%q, %q) = %v, want an *InvalidError", c.expr, c.zone, err)
		case inv.Field != c.field || !strings.Contains(inv.Reason, c.says):
			t.Errorf("Parse(%q, %q): field %q, %q; want field %q saying %q", c.expr, c.zone, inv.Field, inv.Reason, c.field, c.says)
		}
	}
	for _, ok := range []string{"*/5 * * * *", "@daily", "@hourly", "@every 1s", "0 9 * * mon-fri", "@every 1h30m"} {
		if _, err := schedule.Parse(ok, "Europe/Berlin"); err != nil {
			t.Errorf("Parse(%q): %v", ok, err)
		}
	}
}

// TestParamsValidate: the definition's other fields.
func TestParamsValidate(t *testing.T) {
	good := schedule.Params{Name: "n", Cron: "@hourly", Kind: "k"}
	for _, c := range []struct {
		edit  func(p *schedule.Params)
		field string
	}{
		{func(p *schedule.Params) { p.Name = "" }, "name"},
		{func(p *schedule.Params) { p.Kind = "" }, "kind"},
		{func(p *schedule.Params) { p.Name = "a\nb" }, "name"},
		{func(p *schedule.Params) { p.Queue = strings.Repeat("q", 256) }, "queue"},
		{func(p *schedule.Params) { p.Lock = "\u0085" }, "lock"},
		{func(p *schedule.Params) { p.Kind = "\xff" }, "kind"},
		{func(p *schedule.Params) { p.TaskData = json.RawMessage(`[1]`) }, "task_data"},
		{func(p *schedule.Params) { p.MaxAttempts = 101 }, "max_attempts"},
		{func(p *schedule.Params) { p.TTL = 1500 * time.Millisecond }, "ttl_seconds"},
	} {
		p := good
		c.edit(&p)
		var inv *schedule.InvalidError
		if err := p.Validate(); !errors.As(err, &inv) || inv.Field != c.field {
			t.Errorf("Validate(%+v) = %v, want an *InvalidError on %q", p, err, c.field)
		}
	}
	if err := good.Validate(); err != nil {
		t.Errorf("Validate(%+v): %v", good, err)
	}
}

// TestScheduleJSON: a schedule goes through its JSON and back unchanged.
func TestScheduleJSON(t *testing.T) {
	last := time.Date(2027, 1, 2, 3, 4, 5, 6e6, time.UTC)
	in := schedule.Schedule{
		Name: "n", Cron: "@hourly", Zone: "UTC", Kind: "k", TaskData: json.RawMessage(`{"a":1}`), Queue: "q",
		Priority: -3, Unique: true, Lock: "L", MaxAttempts: 7, TTLSeconds: 9, CreatedAt: last, UpdatedAt: last,
		NextTick: last.Add(time.Hour), LastTick: &last, MissedTicks: 4, SkippedTicks: 2,
		LastTask: &schedule.LastTask{ID: 12, State: "dead", ProcessedAt: &last, LastError: "boom"},
	}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out schedule.Schedule
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	b2, _ := json.Marshal(out)
	if string(b) != string(b2) {
		t.Errorf("round trip:\n%s\n%s", b, b2)
	}
	if !out.Same(schedule.Params{Name: "n", Cron: "@hourly", Kind: "k", TaskData: json.RawMessage(`{ "a": 1 }`), Queue: "q",
		Priority: -3, Unique: true, Lock: "L", MaxAttempts: 7, TTL: 9 * time.Second}) {
		t.Errorf("Same: false for the schedule's own definition")
	}
}
