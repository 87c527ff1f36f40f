package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/leasehold/leasehold"
)

// pickupEvery is how often pickup inserts a task: a steady trickle, each task into idle
// workers.
const pickupEvery = 15 * time.Millisecond

// pickupBuckets are the upper bounds of the distribution pickup prints.
var pickupBuckets = []time.Duration{
	500 * time.Microsecond, time.Millisecond, 2 * time.Millisecond, 5 * time.Millisecond,
	10 * time.Millisecond, 20 * time.Millisecond, 50 * time.Millisecond,
}

// runPickup measures how soon an idle replica starts a task, as a user sees it: Samples
// zero-work tasks, one every pickupEvery, each the only one pending, from the insert's
// answer (its commit acknowledged) to the task's start. Two ways: over REST into a
// `leasehold serve` process with the default roles and its workers (the worker role, 4
// workers), from its readiness on, the first tasks after its start included, to the
// claim's transaction (started_at, by the database clock: the same clock as this
// process's on one machine); and through the library, Insert into a Client of 4 workers
// in this process, to its handler's first instruction.
func runPickup(ctx context.Context, c Config, _ []Result) ([]Result, error) {
	var out []Result
	if c.Executable == "" {
		out = append(out, Result{Scenario: "pickup", Case: "a replica, REST insert",
			Note: "not measured: it needs a leasehold binary for its replica (Config.Executable; `leasehold bench` sets it)"})
	} else {
		rest, err := pickupREST(ctx, c)
		if err != nil {
			return nil, fmt.Errorf("pickup over REST: %w", err)
		}
		out = pickupResults("a replica (default roles and worker, 4 workers), REST insert, to the claim's start", rest)
	}
	lib, err := pickupLibrary(ctx, c)
	if err != nil {
		return nil, fmt.Errorf("pickup through the library: %w", err)
	}
	floor, err := commitLatency(ctx, c)
	if err != nil {
		return nil, fmt.Errorf("the durable commit's latency: %w", err)
	}
	out = append(out, pickupResults("the library (one Client of 4 workers), Insert, to the handler's start", lib)...)
	slices.Sort(floor)
	return append(out,
		Result{Scenario: "pickup", Case: "the floor: a one-row insert's durable commit, p50", Value: ms(percentile(floor, 50)), Unit: "ms",
			Note: fmt.Sprintf("%d commits, one every %v, on a session of its own: a claim is such a commit, which the task's start waits for", len(floor), pickupEvery)},
		Result{Scenario: "pickup", Case: "the floor: a one-row insert's durable commit, p99", Value: ms(percentile(floor, 99)), Unit: "ms"},
	), nil
}

// commitLatency times Samples one-row inserts, each its own durable transaction, one every
// pickupEvery: what any claim's commit costs on this server, the floor under a pickup.
func commitLatency(ctx context.Context, c Config) ([]time.Duration, error) {
	d, err := newDB(ctx, c.DatabaseURL, 2)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	if _, err := d.Pool.Exec(ctx, `CREATE TABLE commit_probe (id bigint GENERATED ALWAYS AS IDENTITY, at timestamptz DEFAULT now())`); err != nil {
		return nil, err
	}
	tick := time.NewTicker(pickupEvery)
	defer tick.Stop()
	out := make([]time.Duration, 0, c.Samples)
	for range c.Samples {
		start := time.Now()
		if _, err := d.Pool.Exec(ctx, `INSERT INTO commit_probe DEFAULT VALUES`); err != nil {
			return nil, err
		}
		out = append(out, time.Since(start))
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-tick.C:
		}
	}
	return out, nil
}

// pickupREST is pickup through a replica process.
func pickupREST(ctx context.Context, c Config) ([]time.Duration, error) {
	d, err := newDB(ctx, c.DatabaseURL, 4)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	s, err := startServe(ctx, c, d, "bench-pickup", "api,reaper,scheduler,worker")
	if err != nil {
		return nil, err
	}
	defer s.stop()
	body := []byte(`{"task_data":` + string(zeroWork) + `}`)
	tick := time.NewTicker(pickupEvery)
	defer tick.Stop()
	committed := make(map[int64]time.Time, c.Samples)
	for range c.Samples {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.base+"/api/tasks", bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, fmt.Errorf("POST /api/tasks: %w", err)
		}
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		resp.Body.Close()
		at := time.Now()
		var t struct {
			ID int64 `json:"id"`
		}
		if resp.StatusCode != http.StatusCreated || json.Unmarshal(msg, &t) != nil {
			return nil, fmt.Errorf("POST /api/tasks: %d %s", resp.StatusCode, msg)
		}
		committed[t.ID] = at
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-tick.C:
		}
	}
	if _, err := drainedIn(ctx, d, c.Samples, "the replica"); err != nil {
		return nil, err
	}
	started, err := startedAt(ctx, d)
	if err != nil {
		return nil, err
	}
	out := make([]time.Duration, 0, len(started))
	for _, s := range started {
		out = append(out, s.at.Sub(committed[s.id]))
	}
	return out, nil
}

// pickupLibrary is pickup through a Client in this process.
func pickupLibrary(ctx context.Context, c Config) ([]time.Duration, error) {
	d, err := newDB(ctx, c.DatabaseURL, 16)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	var mu sync.Mutex
	ran := make(map[int64]time.Time, c.Samples)
	workers := leasehold.NewWorkers()
	err = leasehold.AddWorker(workers, leasehold.WorkFunc[noop](func(_ context.Context, t *leasehold.Task[noop]) error {
		at := time.Now()
		mu.Lock()
		defer mu.Unlock()
		ran[t.ID] = at
		return nil
	}), leasehold.KindConfig{})
	if err != nil {
		return nil, err
	}
	client, err := leasehold.NewClient(d.Pool, leasehold.Config{ID: "bench-pickup", Workers: workers,
		Queues: map[string]leasehold.QueueConfig{"default": {MaxWorkers: 4}}})
	if err != nil {
		return nil, err
	}
	if err := client.Start(ctx); err != nil {
		return nil, err
	}
	defer func() { _ = client.Stop(context.WithoutCancel(ctx)) }()
	tick := time.NewTicker(pickupEvery)
	defer tick.Stop()
	committed := make([]struct {
		id int64
		at time.Time
	}, 0, c.Samples)
	for range c.Samples {
		res, err := client.Insert(ctx, noop{}, nil)
		if err != nil {
			return nil, err
		}
		committed = append(committed, struct {
			id int64
			at time.Time
		}{res.Task.ID, time.Now()})
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-tick.C:
		}
	}
	if _, err := drainedIn(ctx, d, c.Samples, "the library"); err != nil {
		return nil, err
	}
	mu.Lock()
	defer mu.Unlock()
	out := make([]time.Duration, 0, len(committed))
	for _, cm := range committed {
		out = append(out, ran[cm.id].Sub(cm.at))
	}
	return out, nil
}

// started is a task's claim: its transaction's start, by the database clock.
type started struct {
	id int64
	at time.Time
}

// startedAt reads each task's started_at, in the order inserted.
func startedAt(ctx context.Context, d *freshDB) ([]started, error) {
	rows, err := d.Pool.Query(ctx, `SELECT id, started_at FROM tasks ORDER BY id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []started
	for rows.Next() {
		var s started
		if err := rows.Scan(&s.id, &s.at); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// pickupResults are the percentiles, the distribution and the slowest pickups of lat (in
// insertion order).
func pickupResults(who string, lat []time.Duration) []Result {
	sorted := slices.Clone(lat)
	slices.Sort(sorted)
	r := func(what string, v time.Duration, note string) Result {
		return Result{Scenario: "pickup", Case: who + ": " + what, Value: ms(v), Unit: "ms", Note: note}
	}
	var dist []string
	if n := slices.IndexFunc(sorted, func(l time.Duration) bool { return l >= 0 }); n != 0 {
		if n < 0 {
			n = len(sorted)
		}
		dist = append(dist, fmt.Sprintf("<0 (claimed before the insert's answer arrived): %d", n))
	}
	from := time.Duration(0)
	for _, b := range append(slices.Clone(pickupBuckets), time.Duration(1<<62)) {
		n := 0
		for _, l := range sorted {
			if l >= from && l < b {
				n++
			}
		}
		label := fmt.Sprintf("<%v", b)
		if b == time.Duration(1<<62) {
			label = fmt.Sprintf("≥%v", from)
		}
		dist = append(dist, fmt.Sprintf("%s: %d", label, n))
		from = b
	}
	type slow struct {
		i int
		d time.Duration
	}
	var slowest []slow
	for i, l := range lat {
		slowest = append(slowest, slow{i + 1, l})
	}
	slices.SortFunc(slowest, func(a, b slow) int { return int(b.d - a.d) })
	var top []string
	for _, s := range slowest[:min(8, len(slowest))] {
		top = append(top, fmt.Sprintf("#%d %.1f ms", s.i, ms(s.d)))
	}
	return []Result{
		r("p50", percentile(sorted, 50), fmt.Sprintf("%d tasks, one every %v, from the insert's answer (its commit acknowledged)", len(lat), pickupEvery)),
		r("p99", percentile(sorted, 99), ""),
		r("max", sorted[len(sorted)-1], "the slowest (#n: the n-th inserted): "+strings.Join(top, ", ")),
		{Scenario: "pickup", Case: who + ": distribution", Value: float64(len(lat)), Unit: "tasks", Note: strings.Join(dist, ", ")},
	}
}
