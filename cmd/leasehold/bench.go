package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/leasehold/leasehold/internal/lab/bench"
	"github.com/leasehold/leasehold/internal/lab/localpg"
)

// countsFlag parses a flag of whole numbers separated by commas (nil when it is empty).
func countsFlag(flag, value, example string) ([]int, error) {
	if value == "" {
		return nil, nil
	}
	var out []int
	for _, s := range strings.Split(value, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			return nil, usagef("--%s %q must be whole numbers separated by commas, e.g. %s", flag, value, example)
		}
		out = append(out, n)
	}
	return out, nil
}

// runBench runs `leasehold bench`: the benchmark scenarios, each on a fresh database of its
// own beside DATABASE_URL's (or on the local PostgreSQL), printed as a table or as JSON.
func runBench(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("leasehold bench", flag.ContinueOnError)
	var (
		dbURL     = fs.String("database-url", getenv("DATABASE_URL"), "PostgreSQL URL; scenarios create databases beside its (env DATABASE_URL; default: the local PostgreSQL)")
		scenarios = fs.String("scenarios", strings.Join(bench.Scenarios, ","), "scenarios to run, comma-separated; also backlog (see --backlog), longpoll (long-poll claims, leasehold work; a few minutes), capacity (PostgreSQL's CPU and WAL per lease renewal, lease cycle, task and task heartbeat), river (drains beside River's, from outside and through the library; needs --river-peer), pickup (how soon an idle replica starts a task inserted over REST, and the library; --samples tasks) "+
			"keys (a library drain with every task on one of --keys-count keys of --keys-limit slots, the same with a rate on every key that never binds, and the same drain without keys, in rounds; --keys-* flags) "+
			"and claim-parts (what each part of a claim costs the server: the same drain by bare statements without a lease, then with triggers, then with a lease, then a fenced lease, then leasehold's own statement, in rounds; --parts-* flags)")
		duration  = fs.Duration("duration", 5*time.Second, "length of each timed measurement")
		clients   = fs.String("clients", "1,8,32", "concurrency levels of leases and baseline, comma-separated")
		tasks     = fs.Int("tasks", 10000, "tasks drain pre-inserts, and bulk-insert inserts each way")
		replicas  = fs.Int("replicas", 3, "in-process replicas of drain, steady and latency")
		workers   = fs.Int("workers", 4, "workers per replica")
		samples   = fs.Int("samples", 1000, "tasks latency inserts one at a time")
		rate      = fs.Int("steady-rate", 1000, "tasks per second steady offers")
		fanout    = fs.Int("fanout", 200, "websocket clients of fanout")
		asJSON    = fs.Bool("json", false, "print JSON instead of a table")
		processes = fs.Bool("processes", false, "drain also with each replica a process of this binary")
		backlog   = fs.String("backlog", "", "run the backlog scenario too, draining these pending counts, comma-separated (e.g. 10000,100000,500000)")
		blWorkers = fs.Int("backlog-workers", 100, "workers of backlog's one replica")
		waiters   = fs.Int("waiters", bench.DefaultWaiters, "claims longpoll keeps waiting while it times wake-ups")
		idleWait  = fs.Int("idle-waiters", bench.DefaultIdleWaiters, "claims longpoll holds waiting while it counts what they cost")
		idleHold  = fs.Duration("idle-hold", bench.DefaultIdleHold, "how long longpoll holds its idle waiters (and as long with none)")
		restWork  = fs.Int("rest-workers", bench.DefaultRESTWorkers, "longpoll's HTTP workers per replica, and the slots of each of its leasehold work processes")
		capLeases = fs.String("capacity-leases", "", "leases capacity holds and renews, comma-separated (default 1000,10000)")
		renewEvry = fs.Duration("renew-every", bench.DefaultRenewEvery, "how often capacity renews each lease it holds")
		riverPeer = fs.String("river-peer", "", "the River peer program river runs (build it: go build -C tools/riverpeer -o $PWD/bin/riverpeer .)")
		riverN    = fs.String("river-tasks", "", "pending counts river drains each way, comma-separated (default 30000,500000)")
		keysTasks = fs.Int("keys-tasks", bench.DefaultKeysTasks, "tasks keys drains in each of its three drains, each round")
		keysRound = fs.Int("keys-rounds", bench.DefaultKeysRounds, "rounds of keys, each a drain with keys, one with keys and a rate, and one without, in turn first")
		keysWork  = fs.Int("keys-workers", bench.DefaultKeysWorkers, "workers of the one Client of each keys drain")
		keysCount = fs.Int("keys-count", bench.DefaultKeysCount, "keys of keys's keyed drain: task i on key-<i mod keys-count>")
		keysLimit = fs.Int("keys-limit", bench.DefaultKeysLimit, "slots of each key of keys's keyed drain: at most this many of its tasks run at once")
		partsN    = fs.Int("parts-tasks", bench.DefaultPartsTasks, "tasks of each of claim-parts' drains")
		partsR    = fs.Int("parts-rounds", bench.DefaultPartsRounds, "rounds of claim-parts, each a drain of each of its five ways, in turn first")
		partsL    = fs.Int("parts-loops", bench.DefaultPartsLoops, "claimers of each of claim-parts' drains, each a statement at a time")
		partsB    = fs.Int("parts-batch", bench.DefaultPartsBatch, "tasks each claim-parts statement hands in and claims")
		standby   = fs.String("standby", "", "with `sync` or `async`, run on a local primary built for the run with a streaming standby of its own, "+
			"synchronous (every commit waits for the standby's flush) or asynchronous, removed after; not with --database-url")
	)
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	cfg := bench.Config{DatabaseURL: *dbURL, Duration: *duration, Tasks: *tasks, Replicas: *replicas,
		Workers: *workers, Samples: *samples, SteadyRate: *rate, Fanout: *fanout, Log: stderr,
		Waiters: *waiters, IdleWaiters: *idleWait, IdleHold: *idleHold, RESTWorkers: *restWork, RenewEvery: *renewEvry}
	for _, s := range strings.Split(*scenarios, ",") {
		if s = strings.TrimSpace(s); s != "" {
			cfg.Scenarios = append(cfg.Scenarios, s)
		}
	}
	var err error
	if cfg.Backlog, err = countsFlag("backlog", *backlog, "10000,100000,500000"); err != nil {
		return err
	}
	if cfg.RiverTasks, err = countsFlag("river-tasks", *riverN, "30000,500000"); err != nil {
		return err
	}
	if cfg.CapacityLeases, err = countsFlag("capacity-leases", *capLeases, "1000,10000"); err != nil {
		return err
	}
	if cfg.Clients, err = countsFlag("clients", *clients, "1,8,32"); err != nil {
		return err
	}
	// Counts given for an optional scenario ask for it.
	for name, given := range map[string]bool{"backlog": len(cfg.Backlog) > 0, "river": len(cfg.RiverTasks) > 0} {
		if given && !slices.Contains(cfg.Scenarios, name) {
			cfg.Scenarios = append(cfg.Scenarios, name)
		}
	}
	cfg.BacklogWorkers, cfg.RiverPeer = *blWorkers, *riverPeer
	cfg.KeysTasks, cfg.KeysRounds, cfg.KeysWorkers, cfg.KeysCount, cfg.KeysLimit = *keysTasks, *keysRound, *keysWork, *keysCount, *keysLimit
	cfg.PartsTasks, cfg.PartsRounds, cfg.PartsLoops, cfg.PartsBatch = *partsN, *partsR, *partsL, *partsB
	if *partsN <= 0 || *partsR <= 0 || *partsL <= 0 || *partsB <= 0 {
		return usagef("--parts-tasks, --parts-rounds, --parts-loops and --parts-batch must be above 0")
	}
	if *keysTasks <= 0 || *keysRound <= 0 || *keysWork <= 0 || *keysCount <= 0 || *keysLimit <= 0 {
		return usagef("--keys-tasks, --keys-rounds, --keys-workers, --keys-count and --keys-limit must be above 0")
	}
	if *waiters <= 0 || *idleWait <= 0 || *idleHold <= 0 || *restWork <= 0 || *renewEvry <= 0 {
		return usagef("--waiters, --idle-waiters, --idle-hold, --rest-workers and --renew-every must be above 0")
	}
	if *duration <= 0 || *tasks <= 0 || *replicas <= 0 || *workers <= 0 || *samples <= 0 || *rate <= 0 || *fanout <= 0 || *blWorkers <= 0 {
		return usagef("--duration, --tasks, --replicas, --workers, --samples, --steady-rate, --fanout and --backlog-workers must be above 0")
	}
	if err := cfg.Validate(); err != nil {
		return usageError{err}
	}
	switch {
	case *standby != "" && *standby != "sync" && *standby != "async":
		return usagef("--standby %q must be sync or async (or the flag left out, for the local PostgreSQL or --database-url)", *standby)
	case *standby != "" && cfg.DatabaseURL != "":
		return usagef("--standby builds a local primary and standby of its own; leave out --database-url (and DATABASE_URL) with it")
	}
	if slices.Contains(cfg.Scenarios, "longpoll") {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("find this binary for longpoll's leasehold work: %w", err)
		}
		cfg.Work = exe
	}
	if *processes || slices.Contains(cfg.Scenarios, "river") || slices.Contains(cfg.Scenarios, "pickup") {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("find this binary for its replica processes: %w", err)
		}
		cfg.Executable = exe
	}
	if *standby != "" {
		pair, err := localpg.NewPair(ctx, localpg.PairConfig{Synchronous: *standby == "sync", Log: stderr})
		if err != nil {
			return err
		}
		defer func() { _ = pair.Close(context.WithoutCancel(ctx)) }()
		cfg.DatabaseURL = pair.Primary().URL()
	}
	if cfg.DatabaseURL == "" {
		url, err := localpg.Ensure(ctx, stderr)
		if err != nil {
			return err
		}
		cfg.DatabaseURL = url
	}
	rep, err := bench.Run(ctx, cfg)
	if err != nil {
		return err
	}
	if *asJSON {
		return rep.WriteJSON(stdout)
	}
	return rep.WriteTable(stdout)
}
