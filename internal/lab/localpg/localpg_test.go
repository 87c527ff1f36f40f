package localpg

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestEnsureConcurrent brings the local cluster up (or finds it up) from two callers at once,
// which must agree on a URL that answers.
func TestEnsureConcurrent(t *testing.T) {
	t.Parallel()
	ctx := t.Context()

	var (
		wg   sync.WaitGroup
		urls [2]string
		errs [2]error
	)
	for i := range urls {
		wg.Go(func() { urls[i], errs[i] = Ensure(ctx, testLog{t}) })
	}
	wg.Wait()

	for i, err := range errs {
		if errors.Is(err, ErrNotInstalled) {
			t.Skip(err)
		}
		if err != nil {
			t.Fatalf("Ensure #%d: %v", i, err)
		}
	}
	if urls[0] != urls[1] {
		t.Errorf("the two calls disagree: got %q and %q", urls[0], urls[1])
	}
	for _, url := range urls {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatalf("connect to %s: %v", url, err)
		}
		var got int
		if err := conn.QueryRow(ctx, "SELECT 1").Scan(&got); err != nil {
			t.Errorf("SELECT 1: %v", err)
		} else if got != 1 {
			t.Errorf("SELECT 1: got %d, want 1", got)
		}
		if err := conn.Close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
	}

	// Once up, Ensure only connects: quick, and silent.
	var log bytes.Buffer
	start := time.Now()
	if _, err := Ensure(ctx, &log); err != nil {
		t.Fatalf("Ensure on a running cluster: %v", err)
	}
	t.Logf("Ensure on a running cluster took %v", time.Since(start))
	if log.Len() != 0 {
		t.Errorf("Ensure on a running cluster logged %q, want nothing", log.String())
	}
}

func TestPortFromEnv(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in      string
		want    int
		wantErr bool
	}{
		{"", DefaultPort, false},
		{"5433", 5433, false},
		{"0", 0, true},
		{"65536", 0, true},
		{"port", 0, true},
	} {
		got, err := portFromEnv(tc.in)
		if got != tc.want || (err != nil) != tc.wantErr {
			t.Errorf("portFromEnv(%q) = %d, %v; want %d, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestMajorOf(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"pg_ctl (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)\n": "15",
		"pg_ctl (PostgreSQL) 17.2\n":                           "17",
		"pg_ctl (PostgreSQL) 18devel\n":                        "18",
		"pg_ctl (PostgreSQL) 9.6.24\n":                         "9.6",
		"pg_ctl (PostgreSQL) 9\n":                              "",
		"something else\n":                                     "",
	} {
		got, ok := majorOf(in)
		if got != want || ok != (want != "") {
			t.Errorf("majorOf(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
}

func TestFindBinariesPicksHighestCompleteVersion(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	install := func(version string, programs ...string) {
		dir := filepath.Join(root, version, "bin")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, p := range programs {
			if err := os.WriteFile(filepath.Join(dir, p), []byte("#!/bin/sh\n"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	install("9.6", "initdb", "pg_ctl", "postgres")
	install("13", "initdb", "pg_ctl", "postgres")
	install("15", "initdb", "pg_ctl", "postgres")
	install("17", "pg_ctl") // client-only leftovers
	install("notes")

	noPath := func(string) (string, error) { return "", errors.New("not on PATH") }
	got, err := findBinaries(root, noPath)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(root, "15", "bin", "pg_ctl"); got.major != "15" || got.pgCtl != want {
		t.Errorf("got major %q, pg_ctl %q; want 15, %q", got.major, got.pgCtl, want)
	}

	if _, err := findBinaries(t.TempDir(), noPath); !errors.Is(err, ErrNotInstalled) {
		t.Errorf("with nothing installed: got %v, want ErrNotInstalled", err)
	}
}

// testLog sends Ensure's log to the test log.
type testLog struct{ t *testing.T }

func (w testLog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestProbeAsksASlowServerAgain: a server that listens but does not answer
// the first connection within probeTimeout (a loaded machine) is asked
// again, and found answering; a refused one still fails at once.
func TestProbeAsksASlowServerAgain(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url, err := Ensure(ctx, testLog{t})
	if errors.Is(err, ErrNotInstalled) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	var (
		mu       sync.Mutex
		accepted int
		held     []net.Conn
	)
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			_ = c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			accepted++
			first := accepted == 1
			held = append(held, c)
			mu.Unlock()
			if first {
				continue // listened, never answered
			}
			go func() {
				up, err := net.Dial("tcp", net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
				if err != nil {
					_ = c.Close()
					return
				}
				defer up.Close()
				go func() { _, _ = io.Copy(up, c) }()
				_, _ = io.Copy(c, up)
			}()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	if err := probe(ctx, URL(port, Database)); err != nil {
		t.Fatalf("probe of a server whose first connection went unanswered: %v; want it asked again and found answering", err)
	}
	mu.Lock()
	n := accepted
	mu.Unlock()
	if n < 2 {
		t.Errorf("the server saw %d connection(s); want the unanswered one and another", n)
	}

	_ = ln.Close()
	err = probe(ctx, URL(port, Database))
	if err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("probe of a closed port: %v; want a refused connection's error, not a timeout", err)
	}
}
