package checker

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/leasehold/leasehold/lease"
)

// SlotKey is what the checker saw of one key of k slots (a key with a
// limit, schema/0018): its slots' holdings, as RuleSlotLimit judges them.
type SlotKey struct {
	Key string
	// Limit is the k it was judged by: its highest limit (see
	// RuleSlotLimit).
	Limit int
	// Slots are the slots (KEY#n) with at least one holding; Holdings,
	// their holdings, the gated tasks' included.
	Slots, Holdings int
	// MostAtOnce is the largest number of its holdings live at one
	// instant.
	MostAtOnce int
	// Attempts are the attempts of tasks gated by the key, each judged by
	// RuleLockHeld against its slot's holding.
	Attempts int
}

// slotKeys are the holdings of the keys of k slots, by key, kept as their
// slots' events are read, for RuleSlotLimit at the end and for
// RuleLockHeld on the tasks they gate.
type slotKeys struct {
	// limit is each key's k; a key that is not here has no slots.
	limit map[string]int
	// slots are the slot resources of each key with holdings, in the
	// order read; their holdings are the verifier's locks.
	slots map[string][]string
	// slotOf is the slot resource of each acquisition's fence, by key.
	slotOf map[string]map[int64]string
	// attempts count the gated task attempts judged on each key.
	attempts map[string]int
}

func newSlotKeys(limits map[string]int) *slotKeys {
	return &slotKeys{
		limit:    limits,
		slots:    make(map[string][]string),
		slotOf:   make(map[string]map[int64]string),
		attempts: make(map[string]int),
	}
}

// keyOf returns the key of k slots whose slot resource is, and true; ""
// and false when resource is no slot of a key with a limit.
func (s *slotKeys) keyOf(resource string) (string, bool) {
	key, ok := lease.SlotKey(resource)
	if !ok {
		return "", false
	}
	_, limited := s.limit[key]
	return key, limited
}

// add keeps the holdings h of slot resource of key.
func (s *slotKeys) add(key, resource string, h *lockHoldings) {
	s.slots[key] = append(s.slots[key], resource)
	byFence := s.slotOf[key]
	if byFence == nil {
		byFence = make(map[int64]string)
		s.slotOf[key] = byFence
	}
	for _, iv := range h.ivs {
		byFence[iv.fence] = resource
	}
}

// mergeLimits returns the highest of each key's limits in ls.
func mergeLimits(ls ...map[string]int) map[string]int {
	out := make(map[string]int)
	for _, l := range ls {
		for key, k := range l {
			out[key] = max(out[key], k)
		}
	}
	return out
}

// checkSlotLimits judges RuleSlotLimit on every key of k slots and adds
// each key's figures to the report.
func (v *verifier) checkSlotLimits() {
	for _, key := range slices.Sorted(maps.Keys(v.slotKeys.limit)) {
		k := v.slotKeys.limit[key]
		var ivs []*interval
		for _, slot := range v.slotKeys.slots[key] {
			h := v.locks[slot]
			for i := range h.ivs {
				ivs = append(ivs, &h.ivs[i])
			}
		}
		stats := SlotKey{Key: key, Limit: k, Slots: len(v.slotKeys.slots[key]), Holdings: len(ivs), Attempts: v.slotKeys.attempts[key]}
		stats.MostAtOnce = v.sweepSlots(key, k, ivs)
		v.rep.SlotKeys = append(v.rep.SlotKeys, stats)
	}
}

// sweepSlots walks the holdings ivs of key's slots in order of start and
// reports each start at which more than k of them are live; it returns the
// most live at once. A holding is live in [start, end), so one that ends
// at the instant another starts is not counted with it.
func (v *verifier) sweepSlots(key string, k int, ivs []*interval) int {
	slices.SortStableFunc(ivs, func(a, b *interval) int {
		return cmp.Or(a.start.Compare(b.start), cmp.Compare(a.fence, b.fence))
	})
	var live []*interval
	most := 0
	for _, iv := range ivs {
		if !iv.start.Before(iv.end()) {
			continue // held for no time at all
		}
		live = slices.DeleteFunc(live, func(l *interval) bool { return !l.end().After(iv.start) })
		live = append(live, iv)
		most = max(most, len(live))
		if len(live) > k {
			held := make([]string, len(live))
			for i, l := range live {
				held[i] = l.String()
			}
			v.violate(RuleSlotLimit, "%s, a key of %d slot(s): %d holders at %s, when %s by %s with fence %d took hold: %s",
				key, k, len(live), ts(iv.start), iv.resource, iv.holder, iv.fence, strings.Join(held, "; "))
		}
	}
	return most
}

// readLimits returns each key's limit in lease_limits: its span, which is
// its slots, or more while holders above a lowered limit may still be
// live.
func readLimits(ctx context.Context, tx pgx.Tx) (map[string]int, error) {
	rows, err := tx.Query(ctx, `SELECT resource, greatest(slots, span) FROM lease_limits`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	limits := make(map[string]int)
	for rows.Next() {
		var key string
		var k int
		if err := rows.Scan(&key, &k); err != nil {
			return nil, err
		}
		limits[key] = k
	}
	return limits, rows.Err()
}

// line is the report's line of one key of k slots.
func (s SlotKey) line() string {
	return fmt.Sprintf("slots of %s (limit %d): %d holding(s) of %d slot(s), at most %d at once; %d gated task attempt(s) in them",
		s.Key, s.Limit, s.Holdings, s.Slots, s.MostAtOnce, s.Attempts)
}
