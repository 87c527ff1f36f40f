package chaos

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/leasehold/leasehold/internal/demo"
	"github.com/leasehold/leasehold/lease"
)

// slotKey is one of the soak's keys of k slots: tasks on it take a slot each
// (lock_limit), and slot clients take slots of it too, as leasehold exec --slots does.
type slotKey struct {
	name  string
	limit int
}

// slotKeys are the soak's keys of k slots: one of a single slot, a mutex whose holders
// are slots, and one of three. The soak never changes their limits.
var slotKeys = []slotKey{{name: "chaos:limit-1", limit: 1}, {name: "chaos:limit-3", limit: 3}}

// The load on the keys of k slots, modest beside the rest: about two tasks a second,
// a third of them on the key of one slot, and two slot clients.
const (
	slotClients = 2
	// slotTasksEvery: a batch of tasks every 600 ms to 1.8 s, all on one key, up to
	// one more than its limit, so that they contend for its slots with each other and
	// with the slot clients.
	slotTasksEvery = 600 * time.Millisecond
	// maxSlotTaskSleep bounds a slotted task's sleep: short enough that the key of
	// one slot keeps up.
	maxSlotTaskSleep = 400
	// slotClientRest is the least a slot client rests between two holdings: it rests
	// up to twice that.
	slotClientRest = 500 * time.Millisecond
)

// SlotStats are what became of the soak's use of one key of k slots; the checker's
// figures of its slots are in Check.SlotKeys, by key.
type SlotStats struct {
	Key   string
	Limit int
	// Created are its tasks the soak created over the API, answered 201; Tasks, all
	// of them at the end; Done, those done.
	Created, Tasks, Done int
	// Grants are the slot clients' acquisitions (201) of its slots.
	Grants int
}

// slotLimits are the soak's keys of k slots with their limits, for the checker.
func slotLimits() map[string]int {
	out := make(map[string]int, len(slotKeys))
	for _, k := range slotKeys {
		out[k.name] = k.limit
	}
	return out
}

// createSlotTasks creates tasks on the keys of k slots over the API of random replicas
// until ctx ends: a batch of 1 to limit+1 on one key (the key of three slots two times
// in three), each with lock_limit, of a kind that the replicas, the applications or the
// work processes run.
func (s *soak) createSlotTasks(ctx context.Context) {
	rng := rand.New(rand.NewPCG(s.opts.Seed, 6))
	type body struct {
		Kind        string `json:"kind"`
		TaskData    any    `json:"task_data"`
		Lock        string `json:"lock"`
		LockLimit   int    `json:"lock_limit"`
		TTLSeconds  int    `json:"ttl_seconds,omitempty"`
		MaxAttempts int    `json:"max_attempts,omitempty"`
	}
	s.postTasks(ctx, rng, slotTasksEvery, func() any {
		key := slotKeys[len(slotKeys)-1]
		if rng.IntN(3) == 0 {
			key = slotKeys[0]
		}
		batch := make([]body, 1+rng.IntN(key.limit+1))
		for i := range batch {
			b := body{Lock: key.name, LockLimit: key.limit}
			switch rng.IntN(3) {
			case 0:
				b.Kind, b.TaskData = demo.Kind, map[string]float64{"sleep_duration_seconds": float64(rng.IntN(maxSlotTaskSleep)) / 1000}
			case 1:
				b.Kind, b.TaskData = KindFlaky, FlakyArgs{SleepMS: rng.IntN(maxSlotTaskSleep), FailFirst: rng.IntN(4) == 0}
				b.MaxAttempts = appAttempts
			default:
				b.Kind, b.TaskData = KindShell, ShellArgs{SleepMS: rng.IntN(maxSlotTaskSleep), FailFirst: rng.IntN(4) == 0}
				b.TTLSeconds, b.MaxAttempts = int(shellTTL/time.Second), appAttempts
			}
			batch[i] = b
		}
		return batch
	}, &s.slotted)
}

// slotClient takes slots of the keys of k slots over the API of random replicas until
// ctx ends, as leasehold exec --slots does: it holds each for a while, renewing it by
// its slot's name, and releases it, recording each acquisition.
func (s *soak) slotClient(ctx context.Context, n int) {
	rng := rand.New(rand.NewPCG(s.opts.Seed, 20+uint64(n)))
	holder := fmt.Sprintf("chaos-slot-client-%d", n+1)
	for sleepFor(ctx, slotClientRest+jitter(rng, slotClientRest)) {
		addr := s.anyReplica(rng.IntN(len(s.replicas)))
		if addr == "" {
			continue
		}
		key := slotKeys[rng.IntN(len(slotKeys))]
		s.holdLease(ctx, rng, addr, holder, key.name, key.limit)
	}
}

// countSlots fills the report's figures of the keys of k slots: their tasks, from the
// database, and the slot clients' grants.
func (s *soak) countSlots(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	stats := make(map[string]*SlotStats, len(slotKeys))
	for _, k := range slotKeys {
		stats[k.name] = &SlotStats{Key: k.name, Limit: k.limit}
	}
	s.mu.Lock()
	created := slices.Clone(s.slotted)
	s.mu.Unlock()
	rows, err := s.pool.Query(ctx, `
		SELECT lock_resource, count(*) FILTER (WHERE id = ANY ($2)), count(*), count(*) FILTER (WHERE state = 'done')
		FROM tasks WHERE lock_resource = ANY ($1)
		GROUP BY lock_resource`, slices.Collect(maps.Keys(stats)), created)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var key string
		var created, tasks, done int
		if err := rows.Scan(&key, &created, &tasks, &done); err != nil {
			return err
		}
		stats[key].Created, stats[key].Tasks, stats[key].Done = created, tasks, done
	}
	if err := rows.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, g := range s.grants {
		if key, ok := lease.SlotKey(g.resource); ok && stats[key] != nil {
			stats[key].Grants++
		}
	}
	s.report.Slots = s.report.Slots[:0]
	for _, k := range slotKeys {
		s.report.Slots = append(s.report.Slots, *stats[k.name])
	}
	return nil
}
