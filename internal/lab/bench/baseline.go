package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
)

// runBaseline runs pgbench's simple-update script (-N: one UPDATE, one SELECT and one INSERT
// per transaction, no contended rows) at each of the lease scenario's concurrencies on a
// fresh database: the rate of durable commits this machine and server can do, the ceiling
// of any commit-per-operation service.
func runBaseline(ctx context.Context, c Config, _ []Result) ([]Result, error) {
	pgbench, err := findPgbench()
	if err != nil {
		return []Result{{Scenario: "baseline", Case: "pgbench -N", Note: err.Error()}}, nil
	}
	d, err := newDB(ctx, c.DatabaseURL, 2)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	d.Pool.Close() // pgbench brings its own connections
	if out, err := exec.CommandContext(ctx, pgbench, "-i", "-q", "-s", "1", d.URL).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("pgbench -i: %w\n%s", err, out)
	}
	var results []Result
	for _, n := range c.Clients {
		secs := max(1, int(c.Duration.Seconds()))
		args := []string{"-N", "-n", "-c", strconv.Itoa(n), "-j", strconv.Itoa(min(n, runtime.NumCPU())), "-T", strconv.Itoa(secs), d.URL}
		out, err := exec.CommandContext(ctx, pgbench, args...).CombinedOutput()
		if err != nil {
			return nil, fmt.Errorf("pgbench %s: %w\n%s", strings.Join(args[:len(args)-1], " "), err, out)
		}
		tps, err := parseTPS(out)
		if err != nil {
			return nil, err
		}
		results = append(results, Result{Scenario: "baseline", Case: "pgbench -N (simple update)", Clients: n, Value: tps, Unit: "tps"})
	}
	return results, nil
}

// findPgbench finds pgbench on PATH or among Debian's server packages, newest first.
func findPgbench() (string, error) {
	if p, err := exec.LookPath("pgbench"); err == nil {
		return p, nil
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pgbench")
	if len(matches) == 0 {
		return "", errors.New("pgbench not found (it comes with the PostgreSQL server package, e.g. postgresql-15 on Debian; or put it on PATH): no baseline")
	}
	slices.SortFunc(matches, func(a, b string) int { return versionOf(b) - versionOf(a) })
	return matches[0], nil
}

func versionOf(path string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(path))))
	return v
}

// parseTPS reads "tps = 2799.123456 (without initial connection time)" from pgbench's output.
func parseTPS(out []byte) (float64, error) {
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "tps = "); ok {
			num, _, _ := strings.Cut(rest, " ")
			return strconv.ParseFloat(num, 64)
		}
	}
	return 0, fmt.Errorf("no tps in pgbench's output:\n%s", out)
}
