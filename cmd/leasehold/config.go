package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/leasehold/leasehold/internal/server"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold/internal/retention"
)

// config is a replica's configuration: flag, then environment variable,
// then default.
type config struct {
	DatabaseURL  string
	Addr         string
	Instance     string
	Workers      int
	LeaseTTL     time.Duration
	Roles        []string
	APIToken     string
	SimCrashRate float64
	SimSpikeRate float64
	LogLevel     string
	LogFormat    string
	// ListenDatabaseURL is the URL of the LISTEN session and the
	// migrations when it is not DatabaseURL's (empty: DatabaseURL), so that
	// DatabaseURL may point at a transaction-mode pooler, which breaks both.
	ListenDatabaseURL string
	// GeneratorRate is the tasks per second the generator creates while
	// started; GeneratorSleepMin/Max bound each task's sleep.
	GeneratorRate     float64
	GeneratorSleepMin time.Duration
	GeneratorSleepMax time.Duration
	// ShutdownGrace is how long running tasks may finish after SIGTERM
	// before they are handed back to the queue.
	ShutdownGrace time.Duration
	// AllowedOrigins may open /ws, and make changing API requests, besides
	// the server's own origin.
	AllowedOrigins []string
	// Tokens are the tokens of --tokens-file (scopes and prefixes each),
	// read from TokensFile.
	Tokens     []server.Token
	TokensFile string
	// AllowedHosts are the names the server answers to besides those it
	// answers to by default (none by default with a token; without one,
	// localhost and the listen address).
	AllowedHosts []string
	// Insecure serves without a token on an address that is not loopback.
	Insecure bool
	// SecureCookie marks the dashboard's session cookie Secure.
	SecureCookie bool
	// StatementTimeout is PostgreSQL's statement_timeout on the sessions
	// of the replica's pool (zero: the server's own setting). Migrations
	// and the LISTEN session run without it.
	StatementTimeout time.Duration
	// RateLimit and RateBurst limit each client's API requests (zero rate,
	// the default: off); TrustedProxies may name the client in
	// X-Forwarded-For.
	RateLimit      float64
	RateBurst      int
	TrustedProxies []netip.Prefix
	// TaskRetention is how long a finished task is kept, and
	// LeaseHistoryRetention how long lease events and the rows of ended
	// leases are (0: forever); the elected reaper deletes older ones.
	TaskRetention         time.Duration
	LeaseHistoryRetention time.Duration
}

// The roles a replica may play. A production replica's are serveRoles;
// the demo's replicas add its sleep workers and its generator.
var (
	allRoles   = []string{"api", "worker", "generator", "reaper", "scheduler"}
	serveRoles = []string{"api", "reaper", "scheduler"}
	demoRoles  = allRoles
)

// replicaKind is what a configuration is for: a production replica
// (serve) or one of the demo's, which alone has simulated faults.
type replicaKind int

const (
	productionReplica replicaKind = iota
	demoReplica
)

// defaultAddr is where a replica listens unless told: loopback, so that a
// replica started without a token is not open to the network.
const defaultAddr = "127.0.0.1:8080"

// secured reports whether the replica asks every API request for a token.
func (c config) secured() bool { return c.APIToken != "" || len(c.Tokens) > 0 }

// checkExposure refuses to serve the API without a token on an address
// others can reach, unless the operator says --insecure.
func (c config) checkExposure() error {
	if c.secured() || c.Insecure || loopback(c.Addr) || !c.hasRole("api") {
		return nil // without the api role, only the probes and /metrics answer
	}
	return fmt.Errorf("--addr %s listens beyond this machine, and no API token is set: anyone who can reach the port could drive the API; "+
		"set --api-token (or --tokens-file), listen on loopback (--addr 127.0.0.1:8080), or pass --insecure to serve without a token anyway", c.Addr)
}

// loopback reports whether addr (host:port) listens on a loopback address
// only: 127.0.0.0/8, ::1 or localhost.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(strings.Trim(host, "[]"))
	return err == nil && ip.IsLoopback()
}

// allowedHosts are the names the replica answers to: nil (any) with a
// token and no --allowed-hosts; else the ones listed and, without a token,
// localhost, the loopback addresses and the listen address's host.
func (c config) allowedHosts() []string {
	if c.secured() && len(c.AllowedHosts) == 0 {
		return nil
	}
	hosts := slices.Clone(c.AllowedHosts)
	if !c.secured() {
		hosts = append(hosts, "localhost", "127.0.0.1", "::1")
		if h, _, err := net.SplitHostPort(c.Addr); err == nil && h != "" && h != "0.0.0.0" && h != "::" {
			hosts = append(hosts, h)
		}
	}
	return hosts
}

// hasRole reports whether the replica plays role.
func (c config) hasRole(role string) bool { return slices.Contains(c.Roles, role) }

// configFlags defines the replica flags on fs with defaults taken from the
// environment, and returns a function that validates and finishes the
// configuration after fs.Parse. A demo replica's roles default to the
// demo's, and it alone takes the simulated-fault rates (5 % of tasks
// crash, 10 % of heartbeats spike, unless told).
func configFlags(fs *flag.FlagSet, getenv func(string) string, kind replicaKind) func() (config, error) {
	env := func(name, def string) string {
		if v := getenv(name); v != "" {
			return v
		}
		return def
	}
	var (
		c                              config
		workers, ttl, roles, crash, sp string
		genRate, genSleep, grace       string
		origins, stmtTimeout           string
		rateLimit, rateBurst, proxies  string
	)
	var taskRetention, historyRetention string
	var tokensFile, hosts, insecure, secureCookie string
	fs.StringVar(&c.DatabaseURL, "database-url", getenv("DATABASE_URL"), "PostgreSQL URL (env DATABASE_URL)")
	fs.StringVar(&c.ListenDatabaseURL, "listen-database-url", getenv("LEASEHOLD_LISTEN_DATABASE_URL"), "PostgreSQL URL of the LISTEN session and the migrations, which a transaction-mode pooler breaks: straight to the server or through a session-mode pooler, on the same database as the database URL, which may then point at a transaction-mode pooler (env LEASEHOLD_LISTEN_DATABASE_URL; default: the database URL)")
	fs.StringVar(&c.Addr, "addr", env("LEASEHOLD_ADDR", defaultAddr), "listen address; one that is not loopback (:8080, 0.0.0.0:8080) needs an API token or --insecure (env LEASEHOLD_ADDR)")
	fs.StringVar(&c.Instance, "instance", getenv("LEASEHOLD_INSTANCE"), "instance id (env LEASEHOLD_INSTANCE; default <hostname>-<pid>)")
	fs.StringVar(&workers, "workers", env("LEASEHOLD_WORKERS", "4"), "the demo's sleep workers per replica, with the worker role (env LEASEHOLD_WORKERS)")
	fs.StringVar(&ttl, "lease-ttl", env("LEASEHOLD_LEASE_TTL", "30s"), "default lease TTL (env LEASEHOLD_LEASE_TTL)")
	defaultRoles := serveRoles
	if kind == demoReplica {
		defaultRoles = demoRoles
	}
	fs.StringVar(&roles, "roles", env("LEASEHOLD_ROLES", strings.Join(defaultRoles, ",")),
		"what this replica does, comma-separated: api (the REST API, the websocket and the dashboard; without it only /healthz, /readyz and /metrics), "+
			"reaper (expires leases, wakes workers, prunes history), scheduler (enqueues schedules' ticks), "+
			"worker (the demo's sleep workers) and generator (the demo's task generator) (env LEASEHOLD_ROLES)")
	fs.StringVar(&c.APIToken, "api-token", getenv("LEASEHOLD_API_TOKEN"), "require this Bearer token (at least 16 bytes), of every scope, on /api/* and /ws (env LEASEHOLD_API_TOKEN)")
	fs.StringVar(&tokensFile, "tokens-file", getenv("LEASEHOLD_TOKENS_FILE"), "a JSON file of tokens, each with its scopes (read, lease, produce, work, admin) and prefixes (docs/operations/security.md) (env LEASEHOLD_TOKENS_FILE)")
	fs.StringVar(&origins, "allowed-origins", getenv("LEASEHOLD_ALLOWED_ORIGINS"), "origins besides the server's own whose pages may open /ws and make changing requests, comma-separated, e.g. https://dash.example.com (env LEASEHOLD_ALLOWED_ORIGINS)")
	fs.StringVar(&hosts, "allowed-hosts", getenv("LEASEHOLD_ALLOWED_HOSTS"), "host names the server answers to (the Host header, without its port), comma-separated; without an API token it answers only to localhost, 127.0.0.1, ::1, its listen address and these (env LEASEHOLD_ALLOWED_HOSTS)")
	insecure, secureCookie = env("LEASEHOLD_INSECURE", "false"), env("LEASEHOLD_SECURE_COOKIE", "false")
	fs.Var((*boolText)(&insecure), "insecure", "serve without an API token on an address that is not loopback: anyone who can reach it may drive the API (env LEASEHOLD_INSECURE)")
	fs.Var((*boolText)(&secureCookie), "secure-cookie", "mark the dashboard's session cookie Secure: HTTPS is served by a proxy in front (env LEASEHOLD_SECURE_COOKIE)")
	crash, sp = "0", "0"
	if kind == demoReplica {
		fs.StringVar(&crash, "sim-crash-rate", env("LEASEHOLD_SIM_CRASH_RATE", "0.05"), "per task, the chance that a demo worker's replica exits abruptly mid-task (env LEASEHOLD_SIM_CRASH_RATE)")
		fs.StringVar(&sp, "sim-spike-rate", env("LEASEHOLD_SIM_SPIKE_RATE", "0.10"), "per heartbeat, the chance of a latency spike long enough to miss the lease (env LEASEHOLD_SIM_SPIKE_RATE)")
	}
	fs.StringVar(&genRate, "generator-rate", env("LEASEHOLD_GENERATOR_RATE", "2"), "tasks per second the generator creates while started (env LEASEHOLD_GENERATOR_RATE)")
	fs.StringVar(&genSleep, "generator-sleep", env("LEASEHOLD_GENERATOR_SLEEP", "1s-5s"), "range of a generated task's sleep, MIN-MAX (env LEASEHOLD_GENERATOR_SLEEP)")
	fs.StringVar(&grace, "shutdown-grace", env("LEASEHOLD_SHUTDOWN_GRACE", "10s"), "on SIGTERM, how long running tasks may finish before they are handed back (env LEASEHOLD_SHUTDOWN_GRACE)")
	fs.StringVar(&stmtTimeout, "statement-timeout", env("LEASEHOLD_STATEMENT_TIMEOUT", "5s"), "PostgreSQL statement_timeout of the replica's queries (migrations and LISTEN run without it); a statement cut short, like a database that cannot be reached, answers 503; an API request waits at most this plus the connect timeout (connect_timeout in the URL, default 5s) for the database; 0 keeps the server's setting (env LEASEHOLD_STATEMENT_TIMEOUT)")
	fs.StringVar(&rateLimit, "rate-limit", env("LEASEHOLD_RATE_LIMIT", "0"), "API requests a second each client (IPv4 address or IPv6 /64) may make once its burst is spent; 429 beyond, counted in leasehold_http_rate_limited_total; 0, the default, is no limit. Turn it on (e.g. 500) where clients you do not run reach the API: one host of workers or lease holders makes hundreds a second (env LEASEHOLD_RATE_LIMIT)")
	fs.StringVar(&rateBurst, "rate-burst", env("LEASEHOLD_RATE_BURST", "200"), "API requests a client may make at once while --rate-limit is on (env LEASEHOLD_RATE_BURST)")
	fs.StringVar(&proxies, "trusted-proxies", getenv("LEASEHOLD_TRUSTED_PROXIES"), "proxies (CIDRs or addresses, comma-separated) whose X-Forwarded-For names the client for the rate limit, e.g. 10.0.0.0/8 (env LEASEHOLD_TRUSTED_PROXIES)")
	fs.StringVar(&taskRetention, "task-retention", env("LEASEHOLD_TASK_RETENTION", "168h"), "how long a finished (done, dead or cancelled) task is kept before the reaper deletes it; 0 keeps tasks forever (env LEASEHOLD_TASK_RETENTION)")
	fs.StringVar(&historyRetention, "lease-history-retention", env("LEASEHOLD_LEASE_HISTORY_RETENTION", "168h"), "how long lease events, and the rows of released or expired leases, are kept before the reaper deletes them; 0 keeps them forever (env LEASEHOLD_LEASE_HISTORY_RETENTION)")
	fs.StringVar(&c.LogLevel, "log-level", env("LEASEHOLD_LOG_LEVEL", "info"), "debug, info, warn or error (env LEASEHOLD_LOG_LEVEL)")
	fs.StringVar(&c.LogFormat, "log-format", env("LEASEHOLD_LOG_FORMAT", "json"), "json or console (env LEASEHOLD_LOG_FORMAT)")

	return func() (config, error) {
		var errs []error
		n, err := strconv.Atoi(workers)
		if err != nil || n < 0 || n > 1024 {
			errs = append(errs, fmt.Errorf("--workers %q must be an integer between 0 and 1024", workers))
		}
		c.Workers = n
		d, err := time.ParseDuration(ttl)
		if err != nil || d < time.Second || d > time.Hour || d%time.Second != 0 {
			errs = append(errs, fmt.Errorf("--lease-ttl %q must be whole seconds between 1s and 1h, e.g. 30s", ttl))
		}
		c.LeaseTTL = d
		for _, r := range strings.Split(roles, ",") {
			r = strings.TrimSpace(r)
			if r == "" {
				continue
			}
			if !slices.Contains(allRoles, r) {
				errs = append(errs, fmt.Errorf("--roles: unknown role %q; use some of %s", r, strings.Join(allRoles, ",")))
			}
			c.Roles = append(c.Roles, r)
		}
		for _, o := range strings.Split(origins, ",") {
			if o = strings.TrimSpace(o); o != "" {
				c.AllowedOrigins = append(c.AllowedOrigins, o)
			}
		}
		for _, h := range strings.Split(hosts, ",") {
			if h = strings.TrimSpace(h); h != "" {
				c.AllowedHosts = append(c.AllowedHosts, h)
			}
		}
		for name, b := range map[string]struct {
			raw string
			to  *bool
		}{"--insecure": {insecure, &c.Insecure}, "--secure-cookie": {secureCookie, &c.SecureCookie}} {
			v, err := strconv.ParseBool(b.raw)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s %q must be true or false", name, b.raw))
			}
			*b.to = v
		}
		if c.APIToken != "" {
			if err := server.CheckSecret(c.APIToken); err != nil {
				errs = append(errs, fmt.Errorf("--api-token (env LEASEHOLD_API_TOKEN): %w", err))
			}
		}
		if c.TokensFile = tokensFile; tokensFile != "" {
			data, err := os.ReadFile(tokensFile)
			if err == nil {
				c.Tokens, err = server.ParseTokens(data)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("--tokens-file %s (env LEASEHOLD_TOKENS_FILE): %w", tokensFile, err))
			}
		}
		for name, raw := range map[string]string{"--sim-crash-rate": crash, "--sim-spike-rate": sp} {
			v, err := strconv.ParseFloat(raw, 64)
			if err != nil || v < 0 || v > 1 {
				errs = append(errs, fmt.Errorf("%s %q must be a number between 0 and 1", name, raw))
			}
			if name == "--sim-crash-rate" {
				c.SimCrashRate = v
			} else {
				c.SimSpikeRate = v
			}
		}
		if r, err := strconv.ParseFloat(genRate, 64); err != nil || r <= 0 || r > 10000 {
			errs = append(errs, fmt.Errorf("--generator-rate %q must be a number of tasks per second above 0 and at most 10000", genRate))
		} else {
			c.GeneratorRate = r
		}
		lo, hi, ok := strings.Cut(genSleep, "-")
		minSleep, err1 := time.ParseDuration(lo)
		maxSleep, err2 := time.ParseDuration(hi)
		if !ok || err1 != nil || err2 != nil || minSleep < 0 || minSleep > maxSleep || maxSleep <= 0 || maxSleep > time.Hour {
			errs = append(errs, fmt.Errorf("--generator-sleep %q must be a range MIN-MAX of durations within 0..1h with MAX above 0, e.g. 1s-5s", genSleep))
		} else {
			c.GeneratorSleepMin, c.GeneratorSleepMax = minSleep, maxSleep
		}
		if g, err := time.ParseDuration(grace); err != nil || g < 0 || g > 10*time.Minute {
			errs = append(errs, fmt.Errorf("--shutdown-grace %q must be a duration between 0s and 10m, e.g. 10s", grace))
		} else {
			c.ShutdownGrace = g
		}
		if d, err := time.ParseDuration(stmtTimeout); err != nil || d < 0 || d > time.Hour || d%time.Millisecond != 0 {
			errs = append(errs, fmt.Errorf("--statement-timeout %q must be 0 (off) or whole milliseconds up to 1h, e.g. 5s", stmtTimeout))
		} else {
			c.StatementTimeout = d
		}
		if r, err := strconv.ParseFloat(rateLimit, 64); err != nil || math.IsNaN(r) || r < 0 || r > 1e6 {
			errs = append(errs, fmt.Errorf("--rate-limit %q must be requests a second between 0 (off) and 1000000, e.g. 500", rateLimit))
		} else {
			c.RateLimit = r
		}
		if b, err := strconv.Atoi(rateBurst); err != nil || b < 0 || b > 1000000 {
			errs = append(errs, fmt.Errorf("--rate-burst %q must be a whole number of requests between 0 and 1000000, e.g. 200", rateBurst))
		} else {
			c.RateBurst = b
		}
		for _, r := range []struct {
			flag, raw string
			to        *time.Duration
		}{{"--task-retention", taskRetention, &c.TaskRetention}, {"--lease-history-retention", historyRetention, &c.LeaseHistoryRetention}} {
			d, err := time.ParseDuration(r.raw)
			if err != nil || d < 0 || retention.ValidateAge(d) != nil {
				errs = append(errs, fmt.Errorf("%s %q must be 0 (keep forever) or a duration of at least 1m, e.g. 168h for a week", r.flag, r.raw))
				continue
			}
			*r.to = d
		}
		for _, p := range strings.Split(proxies, ",") {
			if p = strings.TrimSpace(p); p == "" {
				continue
			}
			prefix, err := netip.ParsePrefix(p)
			if err != nil {
				addr, aerr := netip.ParseAddr(p)
				if aerr != nil {
					errs = append(errs, fmt.Errorf("--trusted-proxies: %q is neither a CIDR (10.0.0.0/8) nor an address (10.0.0.1)", p))
					continue
				}
				prefix = netip.PrefixFrom(addr.Unmap(), addr.Unmap().BitLen())
			}
			c.TrustedProxies = append(c.TrustedProxies, prefix.Masked())
		}
		if c.ListenDatabaseURL != "" {
			if _, err := pgxpool.ParseConfig(c.ListenDatabaseURL); err != nil {
				errs = append(errs, fmt.Errorf("--listen-database-url (env LEASEHOLD_LISTEN_DATABASE_URL): %w; give a URL such as postgres://user:pass@host:5432/db", err))
			}
		}
		if c.LogFormat != "json" && c.LogFormat != "console" {
			errs = append(errs, fmt.Errorf("--log-format %q must be json or console", c.LogFormat))
		}
		if c.Instance == "" {
			c.Instance = hostPID()
		}
		if err := c.checkExposure(); err != nil {
			errs = append(errs, err)
		}
		return c, joinUsage(errs)
	}
}

// hostPID is "<hostname>-<pid>": a name unique among the live processes of
// a fleet, the default of --instance and of exec's --holder.
func hostPID() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s-%d", host, os.Getpid())
}

// flagError turns an error of flag.FlagSet.Parse into a usage error: -h
// (the usage was printed) into errUsage.
func flagError(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return errUsage
	}
	return usageError{err}
}

// parse parses args into fs, turning -h and flag errors into errUsage.
func parse(fs *flag.FlagSet, args []string, stderr io.Writer) error {
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		return flagError(err)
	}
	if fs.NArg() > 0 {
		return usagef("unexpected arguments %q", fs.Args())
	}
	return nil
}

// boolText is a boolean flag kept as its text (checked after parsing, like
// the other flags, so that a bad LEASEHOLD_* value is a usage error too):
// --flag alone is true.
type boolText string

func (b *boolText) String() string { return string(*b) }

func (b *boolText) Set(v string) error {
	*b = boolText(v)
	return nil
}

// IsBoolFlag lets the flag stand alone (flag.Value's boolFlag).
func (b *boolText) IsBoolFlag() bool { return true }
