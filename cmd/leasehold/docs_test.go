package main

import (
	"flag"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// configDoc is the configuration reference: one table of every flag of
// serve, demo and demo replica.
const configDoc = "../../docs/reference/configuration.md"

// proseDefaults are the flags whose default is not a fixed value (the
// flag's DefValue is empty and the value is worked out at start), with what
// the reference says instead.
var proseDefaults = map[string]string{
	"instance":            "`<hostname>-<pid>`", // the host's name and the process id
	"listen-database-url": "the database URL",   // --database-url's value
}

// Where a flag is defined, as the reference marks it in its description.
const (
	markDemoReplica = "`demo` and `demo replica` only."
	markDemo        = "`demo` only."
)

// configRowPattern is a row of the reference's flag table:
// | `--flag` | `ENV` or — | default | what it does |.
var configRowPattern = regexp.MustCompile("^\\|\\s*`--([a-z][a-z0-9-]*)`\\s*\\|")

// envInUsage finds the environment variable a flag's usage text names.
var envInUsage = regexp.MustCompile(`\(env ([A-Z][A-Z0-9_]*)[;)]`)

// backquoted finds the `values` of a table cell.
var backquoted = regexp.MustCompile("`([^`]*)`")

// definedFlag is a flag as the commands define it.
type definedFlag struct {
	env      string            // "" when it has none
	defaults map[string]string // command → DefValue
}

// commandFlags are the flags of serve, demo replica and demo, with no
// environment (so that the defaults are the code's).
func commandFlags(t *testing.T) map[string]*definedFlag {
	t.Helper()
	noEnv := func(string) string { return "" }
	sets := map[string]*flag.FlagSet{}
	for _, c := range []struct {
		name string
		kind replicaKind
		demo bool
	}{{"serve", productionReplica, false}, {"demo replica", demoReplica, false}, {"demo", demoReplica, true}} {
		fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
		configFlags(fs, noEnv, c.kind)
		if c.demo {
			demoFlags(fs)
		}
		sets[c.name] = fs
	}
	flags := map[string]*definedFlag{}
	for cmd, fs := range sets {
		fs.VisitAll(func(f *flag.Flag) {
			env := ""
			if m := envInUsage.FindStringSubmatch(f.Usage); m != nil {
				env = m[1]
			}
			d, ok := flags[f.Name]
			if !ok {
				d = &definedFlag{env: env, defaults: map[string]string{}}
				flags[f.Name] = d
			} else if d.env != env {
				t.Errorf("--%s names the variable %q in one command's usage and %q in another's", f.Name, d.env, env)
			}
			d.defaults[cmd] = fs.Lookup(f.Name).DefValue
		})
	}
	return flags
}

// documentedFlag is a row of the reference's table.
type documentedFlag struct {
	line                    int
	env, defaults, describe string
}

// configDocRows reads the reference's flag table by flag name, failing the
// test when a flag has two rows or the rows are not one table.
func configDocRows(t *testing.T) map[string]documentedFlag {
	t.Helper()
	data, err := os.ReadFile(configDoc)
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]documentedFlag{}
	first, last := -1, -1
	for i, line := range strings.Split(string(data), "\n") {
		m := configRowPattern.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		if first < 0 {
			first = i
		} else if i != last+1 {
			t.Errorf("%s:%d: the row of --%s is not in the flag table that starts at line %d; keep every flag in one table", configDoc, i+1, m[1], first+1)
		}
		last = i
		cells := strings.SplitN(strings.Trim(strings.TrimSpace(line), "|"), "|", 4)
		if len(cells) != 4 {
			t.Errorf("%s:%d: the row of --%s has %d cells, want 4: | `--flag` | `ENV` or — | default | what it does |", configDoc, i+1, m[1], len(cells))
			continue
		}
		if prev, dup := rows[m[1]]; dup {
			t.Errorf("%s:%d: --%s has a row already, at line %d; give each flag one row", configDoc, i+1, m[1], prev.line)
		}
		rows[m[1]] = documentedFlag{
			line: i + 1, env: strings.TrimSpace(cells[1]), defaults: strings.TrimSpace(cells[2]),
			describe: strings.TrimSpace(cells[3]),
		}
	}
	if first < 0 {
		t.Fatalf("%s has no flag table (rows starting | `--flag` |)", configDoc)
	}
	return rows
}

// TestConfigurationDocMatchesFlags keeps docs/reference/configuration.md and
// the flags in step, both ways: every flag of serve, demo and demo replica
// has one row, with its environment variable, its default and, for the
// demo's flags, a mark saying so; every row is a flag of theirs.
func TestConfigurationDocMatchesFlags(t *testing.T) {
	t.Parallel()
	defined := commandFlags(t)
	documented := configDocRows(t)

	for name, d := range defined {
		row, ok := documented[name]
		if !ok {
			t.Errorf("%s has no row for --%s: add | `--%s` | ... | to its table", configDoc, name, name)
			continue
		}
		at := func(format string, args ...any) {
			t.Helper()
			t.Errorf("%s:%d: --%s: "+format, append([]any{configDoc, row.line, name}, args...)...)
		}

		wantEnv := "—"
		if d.env != "" {
			wantEnv = "`" + d.env + "`"
		}
		if row.env != wantEnv {
			at("the env column says %s; the flag's usage names %s", row.env, wantEnv)
		}

		var values []string
		for _, v := range d.defaults {
			if v != "" && !slices.Contains(values, v) {
				values = append(values, v)
			}
		}
		slices.Sort(values)
		var shown []string
		for _, m := range backquoted.FindAllStringSubmatch(row.defaults, -1) {
			if !slices.Contains(shown, m[1]) {
				shown = append(shown, m[1])
			}
		}
		slices.Sort(shown)
		switch prose, isProse := proseDefaults[name]; {
		case isProse && len(values) > 0:
			at("the code now gives it the default %q; take it out of proseDefaults and document the value", values)
		case isProse:
			if row.defaults != prose {
				at("the default column says %q; want %q", row.defaults, prose)
			}
		case len(values) == 0:
			if row.defaults != "none" {
				at("the default column says %q; the flag has no default: say none", row.defaults)
			}
		case !slices.Equal(shown, values):
			at("the default column shows %q; the code's defaults are %q (each in backquotes)", shown, values)
		}

		anchor := `<a id="--` + name + `"></a>`
		describe, ok := strings.CutPrefix(row.describe, anchor)
		if !ok {
			at("the description does not start with its anchor %s", anchor)
		}
		_, inServe := d.defaults["serve"]
		_, inReplica := d.defaults["demo replica"]
		var mark string
		switch {
		case !inServe && inReplica:
			mark = markDemoReplica
		case !inServe:
			mark = markDemo
		}
		for _, m := range []string{markDemoReplica, markDemo} {
			if strings.HasPrefix(describe, m) && m != mark {
				at("the description starts %q, but the flag is defined by %q", m, slices.Sorted(maps.Keys(d.defaults)))
			}
		}
		if mark != "" && !strings.HasPrefix(describe, mark) {
			at("the description does not start %q: the flag is defined by %q only", mark, slices.Sorted(maps.Keys(d.defaults)))
		}
	}
	for name, row := range documented {
		if _, ok := defined[name]; !ok {
			t.Errorf("%s:%d: --%s is not a flag of serve, demo or demo replica: remove its row, or fix its name", configDoc, row.line, name)
		}
	}
	if len(defined) < 25 {
		t.Errorf("serve, demo and demo replica define %d flags; is configFlags still read right?", len(defined))
	}
}
