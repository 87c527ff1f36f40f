package checker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/task"

	"github.com/leasehold/leasehold/internal/lab/checker"
	"github.com/leasehold/leasehold/internal/lab/pgtest"
)

// TestCheckSlots runs real tasks on a key of 3 slots and on a key of 1,
// with a lease client holding a slot of the first as leasehold exec
// --slots would: their history, as the database records it, keeps every
// guarantee, with the first key held by 3 at once. Then it plants one
// holding more than each key's limit into the lease history, a grant that
// ignored the limit, and checks that Check reports each key with every
// holder; and, the plant removed, a slotted task's completion forged to
// come after its slot's release.
func TestCheckSlots(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := pgtest.New(t)
	leases := leasestore.NewStore(tdb.Pool)
	tasks := taskstore.NewStore(tdb.Pool)
	const three, one = "imports:acme", "exports:acme"
	data := json.RawMessage(`{"sleep_duration_seconds": 0}`)
	var nts []taskstore.NewTask
	for range 3 {
		nts = append(nts, taskstore.NewTask{TaskData: data, Lock: three, LockLimit: 3})
	}
	for range 2 {
		nts = append(nts, taskstore.NewTask{TaskData: data, Lock: one, LockLimit: 1})
	}
	inserted, err := taskstore.TasksOf(tasks.Insert(ctx, nts))
	if err != nil {
		t.Fatal(err)
	}
	claim := func(processors ...string) []task.Task {
		t.Helper()
		claimed, err := tasks.Claim(ctx, taskstore.ClaimParams{Processors: processors, TTL: time.Minute, WithLapsed: true})
		if err != nil {
			t.Fatal(err)
		}
		return claimed
	}
	complete := func(c task.Task) {
		t.Helper()
		if _, err := tasks.Complete(ctx, c.ID, c.Processor, c.Fence, nil); err != nil {
			t.Fatalf("complete task %d: %v", c.ID, err)
		}
	}

	// The script takes a slot of three before any claim.
	script, err := leases.Acquire(ctx, lease.AcquireParams{Resource: three, Holder: "script", TTL: time.Minute, Slots: 3})
	if err != nil || !script.New || script.Lease.Resource != lease.SlotName(three, 1) {
		t.Fatalf("the script's slot: %+v, %v; want %s, new", script.Lease, err, lease.SlotName(three, 1))
	}
	// One claim for four processors fills both keys: two tasks of three
	// beside the script, one of one.
	first := claim("w1", "w2", "w3", "w4")
	byLock := map[string]int{}
	for _, c := range first {
		byLock[c.Lock]++
	}
	if byLock[three] != 2 || byLock[one] != 1 || len(first) != 3 {
		t.Fatalf("claimed %d task(s) by lock %v; want 2 of %s and 1 of %s", len(first), byLock, three, one)
	}
	for key, k := range map[string]int{three: 3, one: 1} {
		if _, err := leases.Acquire(ctx, lease.AcquireParams{Resource: key, Holder: "late", TTL: time.Minute, Slots: k}); !errors.Is(err, lease.ErrHeld) {
			t.Fatalf("a slot of the full key %s: %v, want %v", key, err, lease.ErrHeld)
		}
	}
	if _, err := leases.Renew(ctx, lease.RenewParams{Resource: script.Lease.Resource, Holder: "script", Fence: script.Lease.Fence, TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if _, err := tasks.Heartbeat(ctx, first[0].ID, first[0].Processor, first[0].Fence); err != nil {
		t.Fatal(err)
	}
	for _, c := range first {
		complete(c)
	}
	if _, err := leases.Release(ctx, lease.ReleaseParams{Resource: script.Lease.Resource, Holder: "script", Fence: script.Lease.Fence}); err != nil {
		t.Fatal(err)
	}
	for claimed := claim("w5", "w6"); len(claimed) > 0; claimed = claim("w5", "w6") {
		for _, c := range claimed {
			complete(c)
		}
	}

	var expected []int64
	for _, tk := range inserted {
		expected = append(expected, tk.ID)
	}
	opts := checker.Options{ExpectedTasks: expected}
	rep := check(t, tdb.Pool, opts)
	if !rep.OK() {
		t.Fatalf("violations in a real history: %v", rep.Violations)
	}
	want := []checker.SlotKey{
		{Key: one, Limit: 1, Slots: 1, Holdings: 2, MostAtOnce: 1, Attempts: 2},
		// The script's, then the three tasks'.
		{Key: three, Limit: 3, Slots: 3, Holdings: 4, MostAtOnce: 3, Attempts: 3},
	}
	if !slices.Equal(rep.SlotKeys, want) {
		t.Errorf("slot keys = %+v, want %+v", rep.SlotKeys, want)
	}
	if rep.TasksDone != 5 || rep.GatedTasks != 5 || rep.GatedAttempts != 5 {
		t.Errorf("done %d, gated tasks %d, attempts %d; want 5 of each", rep.TasksDone, rep.GatedTasks, rep.GatedAttempts)
	}

	// A grant that ignored each key's limit: a holding of the slot above
	// it, with a fence of the sequence, from the instant the last of the
	// key's holdings of the first claim began to the first of them ending:
	// the key was full throughout.
	for _, key := range []string{three, one} {
		var fences []int64
		if key == three {
			fences = append(fences, script.Lease.Fence)
		}
		k := len(fences)
		for _, c := range first {
			if c.Lock == key {
				fences = append(fences, c.Fence)
				k++
			}
		}
		tag, err := tdb.Pool.Exec(ctx, `
			INSERT INTO lease_events (at, lease_id, resource, holder, fence, kind, expires_at)
			SELECT max(at) FILTER (WHERE kind = 'acquired'), 0, $1, 'intruder', nextval('lease_fence_seq'), 'acquired',
			       min(at) FILTER (WHERE kind = 'released')
			FROM lease_events
			WHERE fence = ANY ($2)`, lease.SlotName(key, k+1), fences)
		if err != nil || tag.RowsAffected() != 1 {
			t.Fatalf("plant a holding of %s: %d row(s), %v", lease.SlotName(key, k+1), tag.RowsAffected(), err)
		}
	}
	rep = check(t, tdb.Pool, opts)
	if got := rules(rep); !slices.Equal(got, []string{checker.RuleSlotLimit}) || len(rep.Violations) != 2 {
		t.Fatalf("violations = %v, want two %q", rep.Violations, checker.RuleSlotLimit)
	}
	oneTask := first[slices.IndexFunc(first, func(c task.Task) bool { return c.Lock == one })]
	wantDetail := [][]string{
		{one + ", a key of 1 slot(s): 2 holders at ", one + "#2 by intruder with fence",
			fmt.Sprintf("%s#1 by %s with fence %d", one, oneTask.Processor, oneTask.Fence)},
		{three + ", a key of 3 slot(s): 4 holders at ", three + "#4 by intruder with fence",
			fmt.Sprintf("%s#1 by script with fence %d", three, script.Lease.Fence)},
	}
	for _, c := range first {
		if c.Lock == three {
			wantDetail[1] = append(wantDetail[1], fmt.Sprintf("by %s with fence %d", c.Processor, c.Fence))
		}
	}
	for i, want := range wantDetail {
		for _, w := range want {
			if d := rep.Violations[i].Detail; !strings.Contains(d, w) {
				t.Errorf("detail %q does not say %q", d, w)
			}
		}
	}
	if got := rep.SlotKeys[1]; got.MostAtOnce != 4 || got.Holdings != 5 {
		t.Errorf("%s: %+v; want the planted holding counted: 5 holdings, 4 at once", three, got)
	}

	// The plant removed, a task of three forged to complete 1 s after it
	// did, when its slot had been released.
	if _, err := tdb.Pool.Exec(ctx, `DELETE FROM lease_events WHERE holder = 'intruder'`); err != nil {
		t.Fatal(err)
	}
	late := first[slices.IndexFunc(first, func(c task.Task) bool { return c.Lock == three })]
	if _, err := tdb.Pool.Exec(ctx, `UPDATE tasks SET processed_at = processed_at + interval '1 second' WHERE id = $1`, late.ID); err != nil {
		t.Fatal(err)
	}
	rep = check(t, tdb.Pool, opts)
	if got := rules(rep); !slices.Equal(got, []string{checker.RuleLockHeld}) || len(rep.Violations) != 1 {
		t.Fatalf("violations = %v, want one %q", rep.Violations, checker.RuleLockHeld)
	}
	for _, w := range []string{fmt.Sprintf("task:%d by %s with fence %d", late.ID, late.Processor, late.Fence),
		fmt.Sprintf("outlived its slot, %s#", three)} {
		if d := rep.Violations[0].Detail; !strings.Contains(d, w) {
			t.Errorf("detail %q does not say %q", d, w)
		}
	}
}
