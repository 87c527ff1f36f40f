package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
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
	"sync"
	"time"

	"github.com/leasehold/leasehold/internal/demo/frontdoor"
	"github.com/leasehold/leasehold/internal/demo/supervise"
	"github.com/leasehold/leasehold/internal/lab/checker"
	"github.com/leasehold/leasehold/task"
)

// requestTimeout bounds one request to a replica: a paused one answers nothing.
const requestTimeout = 3 * time.Second

// replica is one supervised "leasehold demo replica" process, across its restarts.
type replica struct {
	name string
	// command: a `leasehold work` process, with no address to ask whether it is
	// ready and no connection to the database of its own.
	command bool

	mu      sync.Mutex
	addr    string        // while a process runs; "" otherwise
	started time.Time     // when the current (or last) process started
	exited  chan struct{} // closed when the current process exits
	exitErr error         // what Wait returned for the last process
	exits   []time.Time   // when each process that ended was seen to end
}

// running returns the replica's address, or "" while no process of it runs.
func (r *replica) running() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.addr
}

// startedAt returns when the current process started. The leases and tasks of an earlier
// process of the replica carry the same names, so that is how the soak tells them apart.
func (r *replica) startedAt() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.started
}

// current returns the channel closed when the current process exits.
func (r *replica) current() chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.exited
}

// lastExit returns what Wait returned for the last process.
func (r *replica) lastExit() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.exitErr
}

// child is r for the supervisor: "leasehold demo replica" on a free port of 127.0.0.1 (a new one at
// each start) with the simulated faults on, the soak's TTL and the database by environment.
func (s *soak) child(r *replica, b *frontdoor.Backend) supervise.Child {
	var addr string // of the start under way; Command, Started and Exited run one at a time
	return supervise.Child{
		Name: r.name,
		Command: func() (*exec.Cmd, error) {
			port, err := freePort()
			if err != nil {
				return nil, err
			}
			addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
			cmd := exec.Command(s.opts.Binary, "demo", "replica",
				"--addr", addr,
				"--instance", r.name,
				"--workers", strconv.Itoa(workers),
				"--lease-ttl", s.opts.LeaseTTL.String(),
				"--shutdown-grace", shutdownGrace.String(),
				"--roles", "api,worker,generator,reaper,scheduler",
				"--generator-rate", generatorRate,
				"--generator-sleep", generatorSleep,
				"--sim-crash-rate", simCrashRate,
				"--sim-spike-rate", simSpikeRate,
				"--log-level", s.opts.ReplicaLogLevel,
				"--log-format", "console",
			)
			// The replicas' configuration is the above, not whatever LEASEHOLD_* the soak
			// runs under (an API token would lock the soak out).
			cmd.Env = append(environWithout(os.Environ(), "DATABASE_URL", "LEASEHOLD_"), "DATABASE_URL="+s.dbURL)
			return cmd, nil
		},
		Started: func(int) {
			r.start(addr)
			b.SetAddr(addr)
		},
		Exited: func(err error) {
			b.SetAddr("")
			r.exit(err)
		},
	}
}

// start records that a process of r started, listening on addr.
func (r *replica) start(addr string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.addr, r.started = addr, time.Now()
	r.exited = make(chan struct{})
}

// exit records that r's process exited with err.
func (r *replica) exit(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.addr, r.exitErr = "", err
	r.exits = append(r.exits, time.Now())
	close(r.exited)
}

// exitsAs returns the exits of r's processes, for the checker: each held
// its leases as r's name.
func (r *replica) exitsAs() []checker.Exit {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]checker.Exit, len(r.exits))
	for i, at := range r.exits {
		out[i] = checker.Exit{Holder: r.name, At: at}
	}
	return out
}

// appChild is an application of the soak (app.go) for the supervisor: "soak app", on the
// database (embedded) or on the front door (remote).
func (s *soak) appChild(r *replica) supervise.Child {
	var addr string
	return supervise.Child{
		Name: r.name,
		Command: func() (*exec.Cmd, error) {
			port, err := freePort()
			if err != nil {
				return nil, err
			}
			addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
			args := []string{"app", "--name", r.name, "--addr", addr,
				"--task-ttl", s.opts.LeaseTTL.String(), "--shutdown-grace", shutdownGrace.String(),
				"--log-level", s.opts.ReplicaLogLevel}
			env := environWithout(os.Environ(), "DATABASE_URL", "LEASEHOLD_")
			if r.name == AppEmbedded {
				env = append(env, "DATABASE_URL="+s.dbURL)
			} else {
				args = append(args, "--url", s.doorURL)
			}
			cmd := exec.Command(s.opts.AppBinary, args...)
			cmd.Env = env
			return cmd, nil
		},
		Started: func(int) { r.start(addr) },
		Exited:  r.exit,
	}
}

// workChild is a `leasehold work` process of the soak for the supervisor: on the front
// door, its slots named after r, running shellScript. It has no address: it counts as
// running from its start.
func (s *soak) workChild(r *replica) supervise.Child {
	return supervise.Child{
		Name: r.name,
		Command: func() (*exec.Cmd, error) {
			cmd := exec.Command(s.opts.Binary, "work", "--url", s.doorURL, "--processor", r.name,
				"--kind", KindShell, "--queue", task.DefaultQueue, "--queue", pausedQueue, "--concurrency", strconv.Itoa(workSlots),
				"--shutdown-grace", shutdownGrace.String(), "--kill-grace", shutdownGrace.String(),
				"--log-level", s.opts.ReplicaLogLevel,
				"--", "/bin/sh", "-c", shellScript)
			cmd.Env = environWithout(os.Environ(), "DATABASE_URL", "LEASEHOLD_")
			return cmd, nil
		},
		Started: func(int) { r.start("(no address)") },
		Exited:  r.exit,
	}
}

// startFrontDoor serves the front door over the replicas on a port of 127.0.0.1.
func (s *soak) startFrontDoor() (*http.Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("chaos: the front door: %w", err)
	}
	s.doorURL = "http://" + ln.Addr().String()
	srv := &http.Server{Handler: frontdoor.New(s.backends, s.log), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return srv, nil
}

// members are the supervised processes: the replicas, then the applications.
func (s *soak) members() []*replica { return append(slices.Clone(s.replicas), s.apps...) }

// environWithout returns env without the variables whose names start with one of prefixes.
func environWithout(env []string, prefixes ...string) []string {
	out := make([]string, 0, len(env))
next:
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		for _, p := range prefixes {
			if strings.HasPrefix(name, p) {
				continue next
			}
		}
		out = append(out, kv)
	}
	return out
}

// freePort returns a TCP port of 127.0.0.1 that was free a moment ago; should another
// process take it first, the replica fails to listen and is restarted on another.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	return port, ln.Close()
}

// waitReady waits until every replica has answered GET /readyz with 200.
func (s *soak) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	ready := map[string]bool{}
	for {
		for _, r := range s.members() {
			if addr := r.running(); addr != "" && !ready[r.name] && r.command {
				ready[r.name] = true
			} else if addr != "" && !ready[r.name] {
				status, err := s.call(ctx, addr, http.MethodGet, "/readyz", nil, nil)
				ready[r.name] = err == nil && status == http.StatusOK
			}
		}
		if len(ready) == len(s.members()) && !containsFalse(ready) {
			s.log.Info().Int("replicas", len(s.replicas)).Int("applications", len(s.apps)).Msg("chaos: every replica and application is ready")
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("chaos: replicas not ready within %v (ready: %v); see their logs", readyTimeout, ready)
		case <-tick.C:
		}
	}
}

func containsFalse(m map[string]bool) bool {
	for _, v := range m {
		if !v {
			return true
		}
	}
	return false
}

// setGenerator switches the generator on or off through the API of any replica, trying
// others until one answers 202 or ctx ends.
func (s *soak) setGenerator(ctx context.Context, on bool) error {
	path := "/api/generator/stop"
	if on {
		path = "/api/generator/start"
	}
	for {
		var err error
		addr := s.anyReplica(rand.N(len(s.replicas)))
		if addr == "" {
			err = errors.New("no replica is running")
		} else {
			var status int
			status, err = s.call(ctx, addr, http.MethodPost, path, nil, nil)
			if err == nil && status == http.StatusAccepted {
				s.log.Info().Msgf("chaos: POST %s: 202", path)
				return nil
			}
			if err == nil {
				err = fmt.Errorf("POST %s: %d", path, status)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("POST %s: %w (last: %w)", path, ctx.Err(), err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// anyReplica returns the address of a running replica, looking from the i-th on; "" when
// none runs.
func (s *soak) anyReplica(i int) string {
	for range s.replicas {
		if addr := s.replicas[i%len(s.replicas)].running(); addr != "" {
			return addr
		}
		i++
	}
	return ""
}

// call sends a request with body (JSON, unless nil) to the replica at addr and decodes a
// successful answer into out (unless nil). It returns the status; an error when no answer
// came or out could not be decoded.
func (s *soak) call(ctx context.Context, addr, method, path string, body, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+addr+path, rd)
	if err != nil {
		return 0, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := s.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	if err != nil {
		return res.StatusCode, err
	}
	if out != nil && res.StatusCode < 300 {
		if err := json.Unmarshal(data, out); err != nil {
			return res.StatusCode, fmt.Errorf("%s %s: %d with %.200q: %w", method, path, res.StatusCode, data, err)
		}
	}
	return res.StatusCode, nil
}
