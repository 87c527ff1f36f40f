// Command soak is leasehold's chaos soak: replicas under load and random
// faults, then their history checked against every guarantee (package
// chaos). It is the lab's, not the product's: the leasehold binary that
// ships carries no fault injection. "soak app" is one of the soak's
// applications on the Go library, which the soak starts.
//
//	go build -o bin/leasehold ./cmd/leasehold
//	go build -o bin/soak ./internal/lab/cmd/soak
//	bin/soak --duration 10m --report report.md
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/lab/chaos"
)

// runSoak is "soak": replicas of the leasehold binary on a PostgreSQL cluster of their own
// (with --standby, a primary and a standby that fail over), under load and random faults for
// --duration, then the history checked. It prints the report and fails when a guarantee was
// broken or the soak could not finish.
func runSoak(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find this program to start the soak's applications: %w", err)
	}
	leasehold := fs.String("leasehold", filepath.Join(filepath.Dir(exe), "leasehold"), "the leasehold `binary` the replicas and workers run")
	duration := fs.Duration("duration", time.Minute, "how long the load and the faults last (draining and checking come after)")
	replicas := fs.Int("replicas", 3, fmt.Sprintf("number of replicas, 1 to %d", maxReplicas))
	interval := fs.Duration("fault-interval", 5*time.Second, "mean pause between two faults")
	all := make([]string, len(chaos.AllKinds))
	for i, k := range chaos.AllKinds {
		all[i] = string(k)
	}
	standbyAll := make([]string, len(chaos.StandbyKinds))
	for i, k := range chaos.StandbyKinds {
		standbyAll[i] = string(k)
	}
	faults := fs.String("faults", strings.Join(all, ","), "the faults to draw from, comma-separated (with --standby the default is "+
		strings.Join(standbyAll, ",")+")")
	standby := fs.String("standby", "", "with `sync`, run PostgreSQL as a primary and a synchronous streaming standby, on one multi-host URL, "+
		"and add the fault failover (the primary stopped hard, the standby promoted, the old primary rebuilt as the standby; "+
		"at least one a minute) in place of db-restart")
	seed := fs.Uint64("seed", 0, "seed of the choice of faults, victims and pauses (0: a random one, printed)")
	ttl := fs.Duration("lease-ttl", 2*time.Second, "the replicas' lease TTL, whole seconds from 1s to 1m")
	drain := fs.Duration("drain-timeout", 2*time.Minute, "how long the replicas may take to finish every task once the load stops")
	report := fs.String("report", "", "also write the report to `FILE` as markdown")
	keep := fs.Bool("keep-cluster", false, "leave the soak's PostgreSQL running at the end, to look at the history")
	replicaLog := fs.String("replica-log", "", "write the replicas' logs to `FILE` (default: discarded)")
	replicaLevel := fs.String("replica-log-level", "warn", "the replicas' --log-level: debug, info, warn or error")
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	var errs []string
	if *duration <= 0 || *duration > 24*time.Hour {
		errs = append(errs, fmt.Sprintf("--duration %v must be above 0 and at most 24h, e.g. 10m", *duration))
	}
	if *replicas < 1 || *replicas > maxReplicas {
		errs = append(errs, fmt.Sprintf("--replicas %d must be between 1 and %d", *replicas, maxReplicas))
	}
	if *interval < 100*time.Millisecond || *interval > time.Hour {
		errs = append(errs, fmt.Sprintf("--fault-interval %v must be between 100ms and 1h, e.g. 5s", *interval))
	}
	switch *standby {
	case "", chaos.StandbySync:
	case "async":
		errs = append(errs, "--standby async is not supported: a failover then loses the last commits, and the checker reads "+
			"only the new primary's history; use --standby sync")
	default:
		errs = append(errs, fmt.Sprintf("--standby %q must be sync (or the flag left out, for a single cluster)", *standby))
	}
	faultsSet := false
	fs.Visit(func(f *flag.Flag) { faultsSet = faultsSet || f.Name == "faults" })
	kinds, err := chaos.ParseKinds(*faults)
	switch {
	case err != nil:
		errs = append(errs, "--faults: "+err.Error())
	case *standby != "" && !faultsSet:
		kinds = chaos.StandbyKinds
	case *standby != "" && slices.Contains(kinds, chaos.KindDBRestart):
		errs = append(errs, "--faults: db-restart restarts a single cluster; with --standby use failover")
	case *standby == "" && slices.Contains(kinds, chaos.KindFailover):
		errs = append(errs, "--faults: failover needs a standby to promote: add --standby sync")
	}
	if *ttl < time.Second || *ttl > time.Minute || *ttl%time.Second != 0 {
		errs = append(errs, fmt.Sprintf("--lease-ttl %v must be whole seconds between 1s and 1m, e.g. 2s", *ttl))
	}
	if *drain <= 0 {
		errs = append(errs, fmt.Sprintf("--drain-timeout %v must be above 0, e.g. 2m", *drain))
	}
	if level, err := zerolog.ParseLevel(*replicaLevel); err != nil || level < zerolog.DebugLevel || level > zerolog.ErrorLevel {
		errs = append(errs, fmt.Sprintf("--replica-log-level %q must be debug, info, warn or error", *replicaLevel))
	}
	// Files are checked now rather than after a soak of ten minutes.
	for name, path := range map[string]string{"--report": *report, "--replica-log": *replicaLog} {
		if path == "" {
			continue
		}
		if info, err := os.Stat(filepath.Dir(path)); err != nil || !info.IsDir() {
			errs = append(errs, fmt.Sprintf("%s %s: no directory %s to write it in", name, path, filepath.Dir(path)))
		}
	}
	if len(errs) > 0 {
		return usagef("%s", strings.Join(errs, "; "))
	}

	if info, err := os.Stat(*leasehold); err != nil || info.IsDir() {
		return usagef("--leasehold %s: no leasehold binary there; build it (go build -o bin/leasehold ./cmd/leasehold) and name it", *leasehold)
	}
	var output io.Writer
	if *replicaLog != "" {
		f, err := os.Create(*replicaLog)
		if err != nil {
			return fmt.Errorf("--replica-log: %w", err)
		}
		defer f.Close()
		output = f
	}
	log := zerolog.New(zerolog.ConsoleWriter{Out: stderr, TimeFormat: "15:04:05.000", NoColor: !terminal(stderr)}).
		With().Timestamp().Logger()

	rep, err := chaos.Run(ctx, chaos.Options{
		Binary:          *leasehold,
		AppBinary:       exe,
		Duration:        *duration,
		Replicas:        *replicas,
		FaultInterval:   *interval,
		Kinds:           kinds,
		Standby:         *standby,
		Seed:            *seed,
		LeaseTTL:        *ttl,
		DrainTimeout:    *drain,
		KeepCluster:     *keep,
		Log:             log,
		Output:          output,
		ReplicaLogLevel: *replicaLevel,
	})
	if err != nil {
		return err
	}
	if err := rep.WriteText(stdout); err != nil {
		return err
	}
	if *report != "" {
		if err := writeReport(*report, rep); err != nil {
			return err
		}
		log.Info().Msgf("report written to %s", *report)
	}
	switch {
	case rep.Interrupted:
		return errors.New("chaos soak interrupted before its end")
	case !rep.OK():
		return fmt.Errorf("chaos soak failed: %d violation(s), %d problem(s); see the report", len(rep.AllViolations()), len(rep.Problems))
	}
	return nil
}

// writeReport writes rep to path as markdown.
func writeReport(path string, rep *chaos.Report) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--report: %w", err)
	}
	if err := rep.WriteMarkdown(f); err != nil {
		f.Close()
		return fmt.Errorf("--report: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("--report: %w", err)
	}
	return nil
}

// terminal reports whether w is a terminal, where colours help; in a file they are noise.
func terminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	info, err := f.Stat()
	return err == nil && info.Mode()&os.ModeCharDevice != 0
}
