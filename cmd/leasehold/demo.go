package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/demo"
	"github.com/leasehold/leasehold/internal/demo/frontdoor"
	"github.com/leasehold/leasehold/internal/demo/supervise"
	"github.com/leasehold/leasehold/internal/lab/localpg"
	"github.com/leasehold/leasehold/schema"
)

// Settings of the demo.
const (
	maxReplicas = 26 // replica-a … replica-z
	// demoLeaseTTL is the replicas' default lease TTL (task leases included) unless the user
	// names one: short, so that a killed replica's tasks visibly move on within seconds.
	demoLeaseTTL = "5s"
	// replicaGrace is how long a replica has to stop after SIGTERM: its workers' grace for
	// running tasks (10 s) and the release of its leases.
	replicaGrace = 20 * time.Second
	// chaosShortest and chaosLongest bound the pause between two kills of --chaos.
	chaosShortest, chaosLongest = 5 * time.Second, 20 * time.Second
)

// runDemo is what "go tool task run" runs: a local PostgreSQL unless DATABASE_URL is set,
// the migrations, the generator switched on, N replicas as child processes of this binary
// (restarted when they exit, as a hosting platform would) and a round-robin front door over
// them on --addr. When ctx ends it stops the front door, then the replicas, then the local
// PostgreSQL if it started it.
//
// "leasehold demo replica [flags]" is one of those replicas: serve with the
// demo's roles (its sleep workers and generator too) and its simulated
// faults, which a production replica (serve) has not.
func runDemo(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "replica" {
		return runReplica(ctx, "leasehold demo replica", demoReplica, args[1:], getenv, stderr)
	}
	fs := flag.NewFlagSet("leasehold demo", flag.ContinueOnError)
	finish := configFlags(fs, getenv, demoReplica)
	replicas, chaos := demoFlags(fs)
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	c, err := finish()
	if err != nil {
		return err
	}
	if *replicas < 1 || *replicas > maxReplicas {
		return usagef("--replicas %d must be between 1 and %d", *replicas, maxReplicas)
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if !given["log-format"] && getenv("LEASEHOLD_LOG_FORMAT") == "" {
		c.LogFormat = "console"
	}
	ttl := c.LeaseTTL.String()
	if !given["lease-ttl"] && getenv("LEASEHOLD_LEASE_TTL") == "" {
		ttl = demoLeaseTTL
	}
	logCfg := c
	logCfg.Instance = "demo"
	log, err := newLogger(logCfg, stderr)
	if err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find this program to start the replicas: %w", err)
	}

	if c.DatabaseURL == "" {
		url, started, err := localpg.EnsureStarted(ctx, stderr)
		if err != nil {
			return err
		}
		c.DatabaseURL = url
		if started {
			defer func() {
				stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
				defer cancel()
				if err := localpg.Stop(stopCtx, stderr); err != nil {
					log.Error().Err(err).Msg("stop the local PostgreSQL")
				}
			}()
		} else {
			log.Info().Msg("using the local PostgreSQL that was already running (it stays up)")
		}
	}
	if err := prepareDatabase(ctx, c.DatabaseURL); err != nil {
		return err
	}

	// The front door's address is taken before any replica starts, so that a busy port
	// fails at once.
	ln, err := net.Listen("tcp", c.Addr)
	if err != nil {
		return fmt.Errorf("front door: listen on %s: %w (pick another with --addr)", c.Addr, err)
	}

	backends := make([]*frontdoor.Backend, *replicas)
	children := make([]supervise.Child, *replicas)
	for i := range children {
		name := "replica-" + string(rune('a'+i))
		backends[i] = frontdoor.NewBackend(name, "")
		children[i] = replicaChild(exe, name, c, ttl, backends[i], log)
	}
	proxy := frontdoor.New(backends, log)
	srv := &http.Server{
		Handler:           proxy,
		ReadHeaderTimeout: 5 * time.Second,
		IdleTimeout:       120 * time.Second,
		// No read or write timeout: websockets last, and the replicas bound their requests.
	}
	sup := &supervise.Supervisor{
		Output:      stderr,
		Log:         log,
		ExitReasons: map[int]string{demo.CrashStatus: "simulated crash"},
		Grace:       replicaGrace,
	}

	// The replicas stop after the front door: supCtx ends only once it is closed.
	supCtx, stopReplicas := context.WithCancel(context.WithoutCancel(ctx))
	defer stopReplicas()
	supDone := make(chan error, 1)
	go func() { supDone <- sup.Run(supCtx, children) }()
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	log.Info().Str("addr", ln.Addr().String()).Int("replicas", *replicas).Bool("chaos", *chaos).
		Msgf("front door on http://%s (dashboard at /) over %d replicas; Ctrl-C stops everything", displayAddr(ln.Addr()), *replicas)

	chaosDone := make(chan struct{})
	if *chaos {
		go func() {
			defer close(chaosDone)
			runChaos(supCtx, sup, backends, log)
		}()
	} else {
		close(chaosDone)
	}

	select {
	case <-ctx.Done():
		log.Info().Msg("stopping: the front door, then the replicas")
		err = nil
	case err = <-serveErr:
		err = fmt.Errorf("front door: %w", err)
		log.Error().Err(err).Msg("stopping the replicas")
	case err = <-supDone:
		// Run returns before supCtx ends only when the children are unusable: a bug.
		_ = srv.Close()
		return err
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	if serr := srv.Shutdown(shutdownCtx); serr != nil {
		_ = srv.Close()
	}
	cancel()
	stopReplicas()
	<-chaosDone
	if rerr := <-supDone; err == nil {
		err = rerr
	}
	proxy.CloseIdleConnections()
	log.Info().Msg("all replicas stopped")
	return err
}

// demoFlags defines the demo's own flags on fs, those it has besides a
// replica's (configFlags): how many replicas, and whether to kill them.
func demoFlags(fs *flag.FlagSet) (replicas *int, chaos *bool) {
	replicas = fs.Int("replicas", 3, fmt.Sprintf("number of replicas, 1 to %d", maxReplicas))
	chaos = fs.Bool("chaos", false, "kill -9 a random replica every 5 to 20 s (it is restarted) to watch failover")
	return replicas, chaos
}

// prepareDatabase applies the migrations once, before the replicas start (each would, too,
// but one at a time is quieter), and switches the generator on.
func prepareDatabase(ctx context.Context, url string) error {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return fmt.Errorf("database URL: %w", err)
	}
	defer pool.Close()
	if _, err := schema.Migrate(ctx, pool); err != nil {
		return err
	}
	return demo.NewState(pool).Set(ctx, true, "demo")
}

// replicaChild is the supervised replica called name: "leasehold demo replica" on a free port of
// 127.0.0.1 (a new one at each start), behind backend while it runs.
func replicaChild(exe, name string, c config, ttl string, backend *frontdoor.Backend, log zerolog.Logger) supervise.Child {
	var addr string // of the current start; Command, Started and Exited run one at a time
	return supervise.Child{
		Name: name,
		Command: func() (*exec.Cmd, error) {
			port, err := freePort()
			if err != nil {
				return nil, err
			}
			addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
			cmd := exec.Command(exe, "demo", "replica",
				"--addr", addr,
				"--instance", name,
				"--workers", strconv.Itoa(c.Workers),
				"--lease-ttl", ttl,
				"--roles", strings.Join(c.Roles, ","),
				"--sim-crash-rate", strconv.FormatFloat(c.SimCrashRate, 'g', -1, 64),
				"--sim-spike-rate", strconv.FormatFloat(c.SimSpikeRate, 'g', -1, 64),
				"--generator-rate", strconv.FormatFloat(c.GeneratorRate, 'g', -1, 64),
				"--generator-sleep", c.GeneratorSleepMin.String()+"-"+c.GeneratorSleepMax.String(),
				"--shutdown-grace", c.ShutdownGrace.String(),
				"--statement-timeout", c.StatementTimeout.String(),
				"--rate-limit", strconv.FormatFloat(c.RateLimit, 'g', -1, 64),
				"--rate-burst", strconv.Itoa(c.RateBurst),
				"--task-retention", c.TaskRetention.String(),
				"--lease-history-retention", c.LeaseHistoryRetention.String(),
				// The front door adds X-Forwarded-For: each browser counts as itself.
				"--trusted-proxies", "127.0.0.1/32,::1/128",
				"--log-level", c.LogLevel,
				"--log-format", c.LogFormat,
			)
			// Secrets go by environment, not on the command line where ps shows them;
			// the names the front door is reached by and the tokens' file too.
			cmd.Env = append(withoutEnv(os.Environ(), "DATABASE_URL", "LEASEHOLD_LISTEN_DATABASE_URL", "LEASEHOLD_API_TOKEN", "LEASEHOLD_TOKENS_FILE",
				"LEASEHOLD_ALLOWED_HOSTS", "LEASEHOLD_ALLOWED_ORIGINS", "LEASEHOLD_SECURE_COOKIE"),
				"DATABASE_URL="+c.DatabaseURL, "LEASEHOLD_LISTEN_DATABASE_URL="+c.ListenDatabaseURL, "LEASEHOLD_API_TOKEN="+c.APIToken, "LEASEHOLD_TOKENS_FILE="+c.TokensFile,
				"LEASEHOLD_ALLOWED_HOSTS="+strings.Join(append(c.AllowedHosts, frontHost(c.Addr)...), ","),
				"LEASEHOLD_ALLOWED_ORIGINS="+strings.Join(c.AllowedOrigins, ","),
				"LEASEHOLD_SECURE_COOKIE="+strconv.FormatBool(c.SecureCookie))
			return cmd, nil
		},
		Started: func(int) {
			backend.SetAddr(addr)
			log.Debug().Str("child", name).Str("addr", addr).Msgf("%s behind the front door at %s", name, addr)
		},
		Exited: func(error) { backend.SetAddr("") },
	}
}

// runChaos kills a random running replica with SIGKILL every chaosShortest to chaosLongest until ctx
// ends; the supervisor restarts it.
func runChaos(ctx context.Context, sup *supervise.Supervisor, backends []*frontdoor.Backend, log zerolog.Logger) {
	for {
		wait := chaosShortest + rand.N(chaosLongest-chaosShortest)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		name := backends[rand.N(len(backends))].Name()
		pid, err := sup.Kill(name)
		if err != nil {
			log.Info().Err(err).Msgf("chaos: %s is down already; sparing it", name)
			continue
		}
		log.Warn().Str("child", name).Int("pid", pid).Time("at", time.Now()).
			Msgf("chaos: kill -9 %s pid=%d", name, pid)
	}
}

// freePort returns a TCP port of 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	return port, ln.Close()
}

// withoutEnv returns env without the named variables.
func withoutEnv(env []string, names ...string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if !slices.Contains(names, name) {
			out = append(out, kv)
		}
	}
	return out
}

// displayAddr is addr as a person would type it into a browser: localhost for an address
// that listens on every interface.
func displayAddr(addr net.Addr) string {
	if tcp, ok := addr.(*net.TCPAddr); ok && tcp.IP.IsUnspecified() {
		return net.JoinHostPort("localhost", strconv.Itoa(tcp.Port))
	}
	return addr.String()
}

// frontHost is the host of the front door's address, which the replicas
// must answer to (the front door passes the browser's Host on), when it
// names one.
func frontHost(addr string) []string {
	if h, _, err := net.SplitHostPort(addr); err == nil && h != "" && h != "0.0.0.0" && h != "::" {
		return []string{h}
	}
	return nil
}
