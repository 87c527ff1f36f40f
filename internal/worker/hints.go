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
	fullAt time.Time // when the last claim without hints was sent
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
	out := make([]taskstore.Hint, 0, len(h.m))
	for _, v := range h.m {
		out = append(out, v)
	}
	return out, true
}

// claimed records what a claim took. A claim without hints (full) starts
// the hints afresh from its own tasks, which it took after every pending
// task that it did not.
func (h *hints) claimed(sent time.Time, full bool, ts []task.Task) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if full {
		clear(h.m)
		h.fullAt = sent
	}
	if h.m == nil {
		h.m = make(map[branch]taskstore.Hint)
	}
	for _, t := range ts {
		b := branch{t.Queue, t.Kind, t.Priority}
		hint := taskstore.HintOf(t)
		if old, ok := h.m[b]; !ok || hint.After(old) {
			h.m[b] = hint
		}
	}
}
