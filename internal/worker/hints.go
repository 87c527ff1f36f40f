package worker

import (
	"sync"
	"time"

	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/task"
)

// maxHintAge bounds how long a pool claims with hints before it claims
// without them again: the longest a task that sits before a hint (an insert
// that committed late, a task put back at its old schedule) waits while the
// pool has a backlog.
const maxHintAge = time.Second

// hints are a pool's taskstore.Hints, one per branch (queue, kind,
// priority): where the last task it claimed in each stands. The dispatcher
// and the completer both claim, so they share them.
type hints struct {
	mu     sync.Mutex
	m      map[branch]taskstore.Hint
	fullAt time.Time        // when the last claim without hints was sent
	cached []taskstore.Hint // m's values, for forClaim; nil when m changed
}

type branch struct {
	queue, kind string
	priority    int16
}

// forClaim returns the hints for a claim about to be sent, and whether
// there are any: none when the last claim without them is older than
// maxHintAge, and then the claim is one without them.
func (h *hints) forClaim() ([]taskstore.Hint, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.m) == 0 || time.Since(h.fullAt) > maxHintAge {
		return nil, false
	}
	if h.cached == nil {
		h.cached = make([]taskstore.Hint, 0, len(h.m))
		for _, v := range h.m {
			h.cached = append(h.cached, v)
		}
	}
	return h.cached, true
}

// claimed records what a claim took. A claim without hints (full) starts
// the hints afresh from its own tasks, which it took after every pending
// task that it did not.
func (h *hints) claimed(sent time.Time, full bool, ts []task.Task) {
	// The last task of each branch, outside the lock: a claim's tasks come
	// from a few branches, most often one.
	var last []taskstore.Hint
	for _, t := range ts {
		hint := taskstore.HintOf(t)
		i := 0
		for i < len(last) && !sameBranch(last[i], hint) {
			i++
		}
		switch {
		case i == len(last):
			last = append(last, hint)
		case hint.After(last[i]):
			last[i] = hint
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if full {
		clear(h.m)
		h.fullAt = sent
		h.cached = nil
	}
	if h.m == nil {
		h.m = make(map[branch]taskstore.Hint)
	}
	for _, hint := range last {
		b := branch{hint.Queue, hint.Kind, hint.Priority}
		if old, ok := h.m[b]; !ok || hint.After(old) {
			h.m[b] = hint
			h.cached = nil
		}
	}
}

func sameBranch(a, b taskstore.Hint) bool {
	return a.Queue == b.Queue && a.Kind == b.Kind && a.Priority == b.Priority
}
