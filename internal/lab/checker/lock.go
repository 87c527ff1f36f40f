package checker

import (
	"slices"
	"time"
)

// lockHoldings are the holding intervals of one resource that gates
// tasks, as its lease events give them: the lease clients' and the gated
// tasks' alike.
type lockHoldings struct {
	ivs     []interval    // sorted by start
	maxEnd  []time.Time   // maxEnd[i]: the latest end of ivs[:i+1]
	byFence map[int64]int // index in ivs of the acquisition with each fence
}

func newLockHoldings(ivs []interval) *lockHoldings {
	h := &lockHoldings{ivs: slices.Clone(ivs), maxEnd: make([]time.Time, len(ivs)), byFence: make(map[int64]int, len(ivs))}
	for i := range h.ivs {
		end := h.ivs[i].end()
		if i > 0 && h.maxEnd[i-1].After(end) {
			end = h.maxEnd[i-1]
		}
		h.maxEnd[i] = end
		h.byFence[h.ivs[i].fence] = i
	}
	return h
}

// meeting returns the indexes of the holdings, other than skip, whose
// intervals meet [from, to), latest start first.
func (h *lockHoldings) meeting(from, to time.Time, skip int) []int {
	// The holdings that start before to are a prefix; of those, walking
	// back, none before the first whose running latest end is <= from
	// can reach from.
	n, _ := slices.BinarySearchFunc(h.ivs, to, func(iv interval, t time.Time) int {
		if iv.start.Before(t) {
			return -1
		}
		return 1
	})
	var out []int
	for i := n - 1; i >= 0 && h.maxEnd[i].After(from); i-- {
		if i != skip && h.ivs[i].end().After(from) {
			out = append(out, i)
		}
	}
	return out
}

// checkLockHeld checks that attempt iv of gated task t held t's lock
// throughout, or a slot of it when the lock is a key of k slots: see
// RuleLockHeld.
func (v *verifier) checkLockHeld(t Task, iv *interval) {
	v.rep.GatedAttempts++
	// held is the resource whose holding the attempt is: the lock, or one
	// of its slots; its is how a violation names it.
	held, its := t.Lock, "its lock"
	h := v.locks[t.Lock]
	k, ok := -1, false
	if h != nil {
		k, ok = h.byFence[iv.fence]
	}
	limit, slotted := v.slotKeys.limit[t.Lock]
	if slotted {
		v.slotKeys.attempts[t.Lock]++
		if slot, found := v.slotKeys.slotOf[t.Lock][iv.fence]; !ok && found {
			held, its, h = slot, "its slot", v.locks[slot]
			k, ok = h.byFence[iv.fence]
		}
	}
	switch {
	case !ok && slotted:
		v.violate(RuleLockHeld, "%s, of a task gated by %s, a key of %d slot(s): no slot of %s was acquired with fence %d",
			iv, t.Lock, limit, t.Lock, iv.fence)
		return
	case !ok:
		v.violate(RuleLockHeld, "%s, of a task gated by %s: %s was never acquired with fence %d", iv, t.Lock, t.Lock, iv.fence)
		return
	}
	lock := &h.ivs[k]
	switch {
	case lock.holder != iv.holder:
		v.violate(RuleLockHeld, "%s: %s's acquisition with that fence is another holder's, %s", iv, its, lock)
		return
	case !lock.start.Equal(iv.start):
		v.violate(RuleLockHeld, "%s: %s was not acquired at the claim but at %s, %s", iv, its, ts(lock.start), lock)
		return
	case lock.end().Before(iv.end()):
		v.violate(RuleLockHeld, "%s outlived %s, %s", iv, its, lock)
	}
	for _, i := range h.meeting(iv.start, iv.end(), k) {
		v.violate(RuleLockHeld, "%s, holding %s, meets %s", iv, held, &h.ivs[i])
	}
}
