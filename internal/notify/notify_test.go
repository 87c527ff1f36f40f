package notify_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/notify"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// waitFor fails the test unless c delivers within a generous bound (the
// bound only keeps a broken test from hanging; it asserts no speed).
func waitFor[T any](t *testing.T, c <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(30 * time.Second):
		t.Fatalf("gave up waiting for %s", what)
		panic("unreachable")
	}
}

// TestReconnectAndResync cuts the LISTEN connection from the server side:
// the listener reconnects by itself, tells subscribers to resync, and
// delivers notifications again.
func TestReconnectAndResync(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	tdb := pgtest.New(t)
	cfg, err := pgx.ParseConfig(tdb.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = "notify-test-listener"
	l := notify.New(func(ctx context.Context) (*pgx.Conn, error) { return pgx.ConnectConfig(ctx, cfg) },
		zerolog.Nop(), notify.ChannelLease, "other")
	sub := l.Subscribe(notify.ChannelLease, 8)
	var wg sync.WaitGroup
	wg.Go(func() { _ = l.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()

	waitFor(t, sub.Resync(), "the first connect's resync")
	if !l.Connected() {
		t.Fatal("Connected() is false after the first resync")
	}
	send := func(payload string) {
		t.Helper()
		if _, err := tdb.Pool.Exec(ctx, `SELECT pg_notify($1, $2)`, notify.ChannelLease, payload); err != nil {
			t.Fatal(err)
		}
	}
	send("one")
	if n := waitFor(t, sub.C(), "a notification"); n.Payload != "one" || n.Channel != notify.ChannelLease {
		t.Fatalf("got %+v, want payload one on %s", n, notify.ChannelLease)
	}

	var killed int
	if err := tdb.Pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE application_name = 'notify-test-listener' AND datname = current_database()`).Scan(&killed); err != nil || killed != 1 {
		t.Fatalf("terminated %d listener backends, %v; want 1", killed, err)
	}
	waitFor(t, sub.Resync(), "the resync after reconnecting")
	if got := l.Reconnects(); got != 1 {
		t.Fatalf("Reconnects() = %d, want 1", got)
	}
	send("two")
	if n := waitFor(t, sub.C(), "a notification after reconnecting"); n.Payload != "two" {
		t.Fatalf("got %+v, want payload two", n)
	}
}

// TestSlowSubscriberGetsResync: a full subscriber is never waited on; it is
// told to resync instead, and other subscribers still get everything.
func TestSlowSubscriberGetsResync(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	tdb := pgtest.New(t)
	l := notify.New(func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, tdb.URL) },
		zerolog.Nop(), notify.ChannelLease)
	slow := l.Subscribe(notify.ChannelLease, 1)
	fast := l.Subscribe(notify.ChannelLease, 100)
	var wg sync.WaitGroup
	wg.Go(func() { _ = l.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()
	waitFor(t, slow.Resync(), "the first connect's resync")
	waitFor(t, fast.Resync(), "the first connect's resync")

	// Three notifications in one transaction arrive together.
	if _, err := tdb.Pool.Exec(ctx, `SELECT pg_notify($1, 'a'), pg_notify($1, 'b'), pg_notify($1, 'c')`, notify.ChannelLease); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"a", "b", "c"} {
		if n := waitFor(t, fast.C(), "notification "+want); n.Payload != want {
			t.Fatalf("fast subscriber got %q, want %q", n.Payload, want)
		}
	}
	waitFor(t, slow.Resync(), "the slow subscriber's resync")
	if n := waitFor(t, slow.C(), "the first notification"); n.Payload != "a" {
		t.Fatalf("slow subscriber got %q, want a", n.Payload)
	}
	slow.Close()
	fast.Close()
}
