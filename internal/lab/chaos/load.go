package chaos

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/leasehold/leasehold/internal/demo"
	"github.com/leasehold/leasehold/internal/lab/checker"
)

// The soak's own load, besides the generator.
const (
	// leaseClients contend for sharedResources: more clients than resources.
	leaseClients    = 3
	sharedResources = 2
	// Tasks created over the API: a batch of 1 to maxBatch every 250 to 750 ms, each
	// sleeping up to maxTaskSleep, long enough for heartbeats (and their spikes).
	maxBatch     = 3
	maxTaskSleep = 1500 * time.Millisecond
)

// createTasks creates tasks over the API of random replicas until ctx ends, and keeps the
// ids of those answered 201: the checker must find each of them finished. A request that
// got no answer may have committed too; the checker finds such tasks in the table.
func (s *soak) createTasks(ctx context.Context) {
	rng := rand.New(rand.NewPCG(s.opts.Seed, 2))
	type taskBody struct {
		TaskData struct {
			Sleep float64 `json:"sleep_duration_seconds"`
		} `json:"task_data"`
	}
	s.postTasks(ctx, rng, 250*time.Millisecond, func() any {
		batch := make([]taskBody, 1+rng.IntN(maxBatch))
		for i := range batch {
			batch[i].TaskData.Sleep = float64(rng.Int64N(int64(maxTaskSleep/time.Millisecond))) / 1000
		}
		return batch
	}, nil)
}

// createGatedTasks creates lease-gated tasks over the API of random replicas until ctx
// ends: a batch of one or two every 400 ms to 1.2 s, each on one of gateLocks, of a kind
// that the replicas, the applications or the work processes run, short enough that a
// lock, which runs one task at a time, keeps up.
func (s *soak) createGatedTasks(ctx context.Context) {
	rng := rand.New(rand.NewPCG(s.opts.Seed, 5))
	type body struct {
		Kind     string `json:"kind"`
		TaskData any    `json:"task_data"`
		Lock     string `json:"lock"`
	}
	s.postTasks(ctx, rng, 400*time.Millisecond, func() any {
		batch := make([]body, 1+rng.IntN(2))
		for i := range batch {
			batch[i].Lock = gateLocks[rng.IntN(len(gateLocks))]
			switch rng.IntN(3) {
			case 0:
				batch[i].Kind = demo.Kind
				batch[i].TaskData = map[string]float64{"sleep_duration_seconds": float64(rng.IntN(300)) / 1000}
			case 1:
				batch[i].Kind, batch[i].TaskData = KindFlaky, FlakyArgs{SleepMS: rng.IntN(300), FailFirst: rng.IntN(4) == 0}
			default:
				batch[i].Kind, batch[i].TaskData = KindShell, ShellArgs{SleepMS: rng.IntN(300), FailFirst: rng.IntN(4) == 0}
			}
		}
		return batch
	}, &s.gated)
}

// postTasks posts a batch of tasks from next to a random replica every every to 3×every
// until ctx ends, and adds the ids of those answered 201 to s.created (and to also, when
// not nil), under s.mu.
func (s *soak) postTasks(ctx context.Context, rng *rand.Rand, every time.Duration, next func() any, also *[]int64) {
	var created []struct {
		ID int64 `json:"id"`
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(every + jitter(rng, 2*every)):
		}
		addr := s.anyReplica(rng.IntN(len(s.replicas)))
		if addr == "" {
			continue
		}
		created = created[:0]
		status, err := s.call(ctx, addr, http.MethodPost, "/api/tasks", next(), &created)
		if err != nil || status != http.StatusCreated {
			continue
		}
		s.mu.Lock()
		for _, t := range created {
			s.created = append(s.created, t.ID)
			if also != nil {
				*also = append(*also, t.ID)
			}
		}
		s.mu.Unlock()
	}
}

// grant is one acquisition by a lease client, as the client saw it.
type grant struct {
	resource, holder string
	fence            int64
	// granted is when the 201 arrived. until is the latest time the client may believe
	// it holds the lease: the send time of its last successful acquire or renew plus the
	// TTL (the database counts the TTL from a later moment), or the send time of its
	// release, whichever is earlier.
	granted, until time.Time
	// story is what the client sent and heard about the lease, for a violation's detail.
	story []string
}

// tell adds a request and its outcome to the grant's story.
func (g *grant) tell(what string, sent time.Time, status int, err error) {
	outcome := fmt.Sprint(status)
	if err != nil {
		outcome = err.Error()
	}
	g.story = append(g.story, fmt.Sprintf("%s sent %s: %s", what, clock(sent), outcome))
}

type leaseJSON struct {
	Resource string `json:"resource"`
	Fence    int64  `json:"fence"`
}

// leaseClient acquires, renews and releases the shared resources over the API of random
// replicas until ctx ends, recording each acquisition.
func (s *soak) leaseClient(ctx context.Context, n int) {
	rng := rand.New(rand.NewPCG(s.opts.Seed, 10+uint64(n)))
	holder := fmt.Sprintf("chaos-client-%d", n+1)
	for sleepFor(ctx, jitter(rng, 300*time.Millisecond)) {
		addr := s.anyReplica(rng.IntN(len(s.replicas)))
		if addr == "" {
			continue
		}
		s.holdLease(ctx, rng, addr, holder, sharedResource(1+rng.IntN(sharedResources)), 0)
	}
}

// holdLease asks the replica at addr for resource for holder, or, with slots, for a slot
// of the key resource of that many slots (as leasehold exec --slots does), and when it is
// granted holds the lease for a while, renewing it now and then, sometimes past the point
// where a renewal is refused, and releases it; it records the grant.
func (s *soak) holdLease(ctx context.Context, rng *rand.Rand, addr, holder, resource string, slots int) {
	ttl := s.opts.LeaseTTL
	ttlSeconds := int(ttl / time.Second)
	ask := map[string]any{"resource": resource, "holder": holder, "ttl_seconds": ttlSeconds}
	if slots > 0 {
		ask["slots"] = slots
	}
	var l leaseJSON
	sent := time.Now()
	status, err := s.call(ctx, addr, http.MethodPost, "/api/leases", ask, &l)
	if err != nil || (status != http.StatusCreated && status != http.StatusOK) {
		return // 409: held by another (every slot, for a key); no answer: it may have been granted, and expires
	}
	if l.Resource != "" {
		resource = l.Resource // a slot's name, KEY#n, for a key
	}
	if status == http.StatusOK {
		// Already ours: an earlier request that seemed to fail was granted. Its start
		// is unknown, so it counts for nothing; hand it back.
		s.call(ctx, addr, http.MethodDelete, "/api/leases/release", //nolint:errcheck // it expires anyway
			map[string]any{"resource": resource, "holder": holder, "fence": l.Fence}, nil)
		return
	}
	g := grant{resource: resource, holder: holder, fence: l.Fence, granted: time.Now(), until: sent.Add(ttl)}
	g.tell("acquire", sent, status, nil)
	// Hold it for a while, renewing now and then, sometimes past the point where a
	// renewal is refused.
	held := true
	for range rng.IntN(4) {
		if !sleepFor(ctx, jitter(rng, ttl*2/3)) {
			break
		}
		addr := s.anyReplica(rng.IntN(len(s.replicas)))
		if addr == "" {
			continue
		}
		sent := time.Now()
		status, err := s.call(ctx, addr, http.MethodPut, "/api/leases/renew",
			map[string]any{"resource": resource, "holder": holder, "fence": l.Fence, "ttl_seconds": ttlSeconds}, nil)
		g.tell("renew", sent, status, err)
		if err == nil && status == http.StatusOK {
			g.until = sent.Add(ttl)
		} else if err == nil && status == http.StatusNotFound {
			held = false // lost: expired, and maybe taken
			break
		}
	}
	if addr := s.anyReplica(rng.IntN(len(s.replicas))); held && addr != "" {
		// Sending the release, the client gives the resource up, whatever the answer.
		sent := time.Now()
		g.until = minTime(g.until, sent)
		status, err := s.call(context.WithoutCancel(ctx), addr, http.MethodDelete, "/api/leases/release",
			map[string]any{"resource": resource, "holder": holder, "fence": l.Fence}, nil)
		g.tell("release", sent, status, err)
	}
	s.mu.Lock()
	s.grants = append(s.grants, g)
	s.mu.Unlock()
}

// sleepFor waits for d, or until ctx ends; it reports whether ctx is still live.
func sleepFor(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// checkGrants checks mutual exclusion and fencing as the lease clients saw them: taken in
// fence order, no grant of a resource arrived before the time every earlier holder could
// believe it still held it, and no fence was granted twice.
func (s *soak) checkGrants() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.report.LeaseGrants = len(s.grants)
	s.report.Violations = append(s.report.Violations, overlaps(s.grants)...)
}

// overlaps returns the violations of mutual exclusion among grants.
func overlaps(grants []grant) []checker.Violation {
	byResource := map[string][]grant{}
	for _, g := range grants {
		byResource[g.resource] = append(byResource[g.resource], g)
	}
	var out []checker.Violation
	for _, resource := range sortedKeys(byResource) {
		gs := byResource[resource]
		slices.SortFunc(gs, func(a, b grant) int { return cmp.Compare(a.fence, b.fence) })
		var latest grant // the earlier grant believed held the longest
		for i, g := range gs {
			if i > 0 && g.fence == gs[i-1].fence {
				out = append(out, checker.Violation{Rule: "client-fence-reuse", Detail: fmt.Sprintf(
					"%s: fence %d was granted to %s and to %s", resource, g.fence, gs[i-1].holder, g.holder)})
			}
			if i > 0 && g.granted.Before(latest.until) {
				out = append(out, checker.Violation{Rule: "client-overlap", Detail: fmt.Sprintf(
					"%s: %s was granted fence %d at %s while %s (fence %d) could hold it until %s (%s)",
					resource, g.holder, g.fence, clock(g.granted), latest.holder, latest.fence, clock(latest.until),
					strings.Join(latest.story, "; "))})
			}
			if i == 0 || g.until.After(latest.until) {
				latest = g
			}
		}
	}
	return out
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
