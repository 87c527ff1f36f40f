package main

import (
	"context"
	"flag"
	"io"
	"log/slog"
	"time"

	"github.com/leasehold/leasehold/internal/lab/chaos"
)

// runApp is "soak app", which the soak starts: an application of a user's on the Go library
// (the embedded one on DATABASE_URL, the remote one on --url), running the workers of the
// soak's own kinds until SIGTERM.
func runApp(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	fs := flag.NewFlagSet("soak app", flag.ContinueOnError)
	name := fs.String("name", "", "the application's name: "+chaos.AppEmbedded+" or "+chaos.AppRemote)
	addr := fs.String("addr", "127.0.0.1:0", "where to answer GET /readyz")
	url := fs.String("url", "", "a leasehold service's URL: the application is remote, on its REST API")
	ttl := fs.Duration("task-ttl", 2*time.Second, "its tasks' lease TTL")
	grace := fs.Duration("shutdown-grace", time.Second, "how long a SIGTERM lets running tasks finish")
	level := fs.String("log-level", "warn", "what the client logs to stderr: debug, info, warn, error or none")
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	o := chaos.AppOptions{Name: *name, Addr: *addr, ServiceURL: *url, TaskTTL: *ttl, ShutdownGrace: *grace}
	if *level != "none" {
		var lv slog.Level
		if err := lv.UnmarshalText([]byte(*level)); err != nil {
			return usagef("--log-level %q must be debug, info, warn, error or none", *level)
		}
		o.Log = slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: lv}))
	}
	switch {
	case *name != chaos.AppEmbedded && *name != chaos.AppRemote:
		return usagef("--name %q must be %s or %s", *name, chaos.AppEmbedded, chaos.AppRemote)
	case *url == "":
		if o.DatabaseURL = getenv("DATABASE_URL"); o.DatabaseURL == "" {
			return usagef("the embedded application needs DATABASE_URL (or --url, for a remote one)")
		}
	}
	return chaos.RunApp(ctx, o)
}
