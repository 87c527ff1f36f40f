package hub

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/leasehold/leasehold/internal/apitime"
	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/task"

	"github.com/gorilla/websocket"

	"github.com/leasehold/leasehold/internal/demo"
	"github.com/leasehold/leasehold/internal/instance"
	"github.com/leasehold/leasehold/internal/notify"
)

// Coalescing windows (the /ws protocol).
const (
	// leaseBatch gathers the lease changes fetched in one query: short,
	// since it is most of the delay from a change to the page, yet long
	// enough that a burst costs one query, not one per change.
	leaseBatch = 10 * time.Millisecond
	// tasksEvery is the least time between two "tasks" messages.
	tasksEvery = 250 * time.Millisecond
	// statsEvery is the least time between two counts of the tasks table
	// (and two readings of the limits and the paused queues, taken with
	// the counts).
	statsEvery = time.Second
	// tasksRefresh bounds how old the task state the clients last got may
	// grow while any is connected: pausing a queue, and setting a limit
	// while no task waits on its key, notify nothing, and a pause's until
	// and done_last_minute move with the clock. A busy cluster's messages
	// come far more often anyway.
	tasksRefresh = 5 * time.Second
	// queryTimeout bounds each round of database reads.
	queryTimeout = 10 * time.Second
	// maxTasksRetry bounds the wait before reading the task state again
	// after a read failed.
	maxTasksRetry = 5 * time.Second
	// scheduleBatch gathers the schedule notifications of one moment: the
	// schedules that tick at the same minute cost a handful of messages,
	// each (kind, name) once.
	scheduleBatch = 10 * time.Millisecond
	// maxScheduleMsgs bounds the schedule messages of one batch: past it
	// one message without a name stands for them all, so that a thousand
	// schedules ticking together never overflow a client's send buffer.
	maxScheduleMsgs = 32
)

// The kinds of a schedule message: the payloads of notify.ChannelSchedule
// are "<kind>:<name>".
const (
	scheduleChanged = "changed" // added, replaced or removed
	scheduleTicked  = "ticked"  // a tick was made a task (or skipped)
)

// Snapshot sizes (the /ws protocol).
const (
	snapshotLeases = 1000
	snapshotEvents = 200
	// maxMissedEvents bounds the events looked up after a resync.
	maxMissedEvents = 1000
	runningTasks    = 100
	deadTasks       = 20
	// pendingKinds bounds the rows of pending_by_kind: past it, the
	// (queue, kind)s whose oldest due task waited least are left out.
	pendingKinds = 100
	// maxPendingCount bounds each pending_by_kind count, so that reading
	// them stays cheap whatever the backlog: a count equal to it means "at
	// least that many".
	maxPendingCount = 100_000
	// limitKeys bounds limits: the first keys by name.
	limitKeys = 100
	// pausedQueues bounds paused_queues: the first queues by name.
	pausedQueues = 100
)

// The messages of the /ws protocol.
type (
	snapshotMsg struct {
		Type         string              `json:"type"`
		ThisInstance string              `json:"this_instance"`
		Leases       []lease.Lease       `json:"leases"`
		Events       []lease.Event       `json:"events"`
		Tasks        tasksBody           `json:"tasks"`
		Generator    generatorBody       `json:"generator"`
		Instances    []instance.Instance `json:"instances"`
		DBNow        string              `json:"db_now"`
	}
	leaseMsg struct {
		Type  string       `json:"type"`
		Kind  string       `json:"kind"`
		Lease lease.Lease  `json:"lease"`
		Event *lease.Event `json:"event"`
	}
	tasksBody struct {
		task.Stats
		RunningTasks  []taskLine    `json:"running_tasks"`
		DeadTasks     []taskLine    `json:"dead_tasks"`
		PendingByKind []pendingKind `json:"pending_by_kind"`
		// Limits and PausedQueues are flow control, read with the counts:
		// the keys with a limit (as GET /api/limits shows them) and the
		// queues paused now (as GET /api/queues/paused does).
		Limits       []lease.Limit     `json:"limits"`
		PausedQueues []task.QueuePause `json:"paused_queues"`
	}
	// taskLine is what the page shows of a running or dead task in its
	// lists: no data, no output, no history, and the error cut short, so
	// that a message's size is the server's choice whatever the tasks
	// hold. The page reads a whole task (GET /api/tasks/{id}) when one is
	// opened.
	taskLine struct {
		ID                  int64      `json:"id"`
		Kind                string     `json:"kind"`
		Queue               string     `json:"queue"`
		State               task.State `json:"state"`
		Priority            int16      `json:"priority"`
		Processor           *string    `json:"processor"`
		Fence               *int64     `json:"fence"`
		Attempts            int32      `json:"attempts"`
		MaxAttempts         int32      `json:"max_attempts"`
		StartedAt           *string    `json:"started_at"`
		LastHeartbeatAt     *string    `json:"last_heartbeat_at"`
		MustHeartbeatBefore *string    `json:"must_heartbeat_before"`
		ProcessedAt         *string    `json:"processed_at"`
		LastError           *string    `json:"last_error"`
		Lock                *string    `json:"lock"`
		Schedule            *string    `json:"schedule"`
	}
	// pendingKind is the pending tasks of one (queue, kind): what shows a
	// kind that no live worker handles, its wait growing.
	pendingKind struct {
		Queue string `json:"queue"`
		Kind  string `json:"kind"`
		Count int64  `json:"count"`
		// OldestWaitSeconds is how long the longest-waiting due task has
		// waited, by the database clock, to the millisecond; 0 when none is due.
		OldestWaitSeconds float64 `json:"oldest_wait_seconds"`
	}
	tasksMsg struct {
		Type string `json:"type"`
		tasksBody
	}
	generatorBody struct {
		Status string  `json:"status"`
		Holder *string `json:"holder"`
		Fence  *int64  `json:"fence"`
	}
	generatorMsg struct {
		Type string `json:"type"`
		generatorBody
	}
	instancesMsg struct {
		Type      string              `json:"type"`
		Instances []instance.Instance `json:"instances"`
	}
	// scheduleMsg says that a schedule changed or ticked: a hint to read
	// the schedules again (GET /api/schedules), since it carries no more
	// than the name. A nil Name ("name": null, kind "changed") stands for
	// any schedule: sent after the listener reconnected (notifications may
	// have been lost) and for a batch too large to send one by one.
	scheduleMsg struct {
		Type string  `json:"type"`
		Kind string  `json:"kind"`
		Name *string `json:"name"`
	}
)

// scheduleChange is one notification of notify.ChannelSchedule.
type scheduleChange struct{ kind, name string }

// parseScheduleChange reads a "changed:<name>" or "ticked:<name>" payload
// (a name may hold colons too).
func parseScheduleChange(payload string) (scheduleChange, error) {
	kind, name, _ := strings.Cut(payload, ":")
	if (kind != scheduleChanged && kind != scheduleTicked) || name == "" {
		return scheduleChange{}, fmt.Errorf("schedule notification %q is neither changed:<name> nor ticked:<name>", payload)
	}
	return scheduleChange{kind: kind, name: name}, nil
}

// feed turns notifications into messages. Its state belongs to its one
// goroutine.
type feed struct {
	h *Hub
	// lastEvent is the newest lease event sent; after a resync the events
	// past it are the ones whose notifications may have been lost.
	lastEvent int64
	// sent remembers the recently sent events (a notification and the
	// look-up after a resync may both bring one), oldest first in sentOrder.
	sent      map[int64]struct{}
	sentOrder []int64

	changes   []leasestore.Change // non-task lease changes waiting for leaseBatch
	received  []time.Time         // when the notification of each of changes arrived
	generator bool                // a generator message is due with the batch
	instances bool                // an instances message is due with the batch
	resynced  bool                // the listener resynced: catch up on missed events

	tasksDirty bool
	// waiter registers the hub for task changes while it has clients
	// (inserts, claims and completions notify only while someone waits:
	// schema/0008 and 0009). It is registered before
	// each read of the task state, and unregistered when a second
	// insertion arrives before the next tasks message, which that message
	// will show anyway: a stream of inserts costs a few notifications per
	// tasksEvery, not one per insert.
	waiter     *notify.Waiter
	insertSeen bool          // an insertion was notified since the last tasks message
	tasksSent  time.Time     // when the next tasks message may go is tasksEvery after this
	tasksRetry time.Duration // after a failed read, how much longer to wait; doubles up to maxTasksRetry
	stats      task.Stats
	pending    []pendingKind     // read with stats, at its cadence
	limits     []lease.Limit     // read with stats, at its cadence
	paused     []task.QueuePause // read with stats, at its cadence
	statsAt    time.Time
	statsOwed  bool // the last tasks message reused stale counts

	// schedules are the schedule notifications waiting for scheduleBatch,
	// in order, each once.
	schedules []scheduleChange
}

func newFeed(h *Hub) *feed {
	return &feed{h: h, sent: make(map[int64]struct{}), waiter: h.d.Listener.ChangesWaiter(h.d.Instance + "/hub")}
}

// run is the feed goroutine; it returns when ctx ends.
func (f *feed) run(ctx context.Context) {
	leaseSub := f.h.d.Listener.Subscribe(notify.ChannelLease, 4096)
	defer leaseSub.Close()
	taskSub := f.h.d.Listener.Subscribe(notify.ChannelTask, 64)
	defer taskSub.Close()
	genSub := f.h.d.Listener.Subscribe(notify.ChannelGenerator, 16)
	defer genSub.Close()
	// Room for a minute's worth of ticks of many schedules; past it the
	// subscription resyncs, which is one message for them all.
	schedSub := f.h.d.Listener.Subscribe(notify.ChannelSchedule, 1024)
	defer schedSub.Close()
	defer f.waiter.UnregisterWithin(ctx, time.Second) // briefly: the row goes with the LISTEN session anyway

	// Where the event history ends now: what is missed from here on is
	// looked for after a resync.
	if newest, err := f.h.d.Leases.NewestNonTaskEvents(ctx, 1); err == nil && len(newest) == 1 {
		f.lastEvent = newest[0].ID
	} else if err != nil && ctx.Err() == nil {
		f.h.d.Log.Warn().Err(err).Msg("reading the lease event history")
	}

	var leaseTimer, tasksTimer, scheduleTimer, refreshTimer <-chan time.Time
	armLease := func() {
		if leaseTimer == nil {
			leaseTimer = time.After(leaseBatch)
		}
	}
	armTasks := func() {
		if tasksTimer != nil || !f.tasksDirty {
			return
		}
		tasksTimer = time.After(time.Until(f.tasksSent.Add(tasksEvery)))
	}
	// armRefresh looks again when the last reading will be tasksRefresh
	// old, while clients are connected (their snapshot arms it first). It
	// never looks sooner than statsEvery, so that a database that is down
	// costs no busy loop: flushTasks's own backoff applies.
	armRefresh := func() {
		if refreshTimer != nil || f.h.Clients() == 0 {
			return
		}
		refreshTimer = time.After(max(time.Until(f.statsAt.Add(tasksRefresh)), statsEvery))
	}
	for {
		select {
		case <-ctx.Done():
			return
		case n := <-leaseSub.C():
			ch, err := leasestore.ParseChange(n.Payload)
			if err != nil {
				f.h.d.Log.Warn().Err(err).Msg("ignoring lease notification")
				continue
			}
			switch {
			case strings.HasPrefix(ch.Resource, "task:"):
				f.tasksDirty = true
				armTasks()
				continue
			case ch.Resource == demo.Resource:
				f.generator = true
			case instance.IsLease(ch.Resource):
				f.instances = true
			}
			if _, slot := lease.SlotKey(ch.Resource); slot && ch.Kind != "renewed" {
				// A slot taken or freed moves its key's count of slots
				// held, which the tasks message carries.
				f.tasksDirty = true
				armTasks()
			}
			f.changes = append(f.changes, ch)
			f.received = append(f.received, n.Received)
			armLease()
		case n := <-taskSub.C():
			f.tasksDirty = true
			if n.Payload == notify.TasksInserted {
				if f.insertSeen {
					f.waiter.UnregisterWithin(ctx, queryTimeout) // registered again before the next read
				}
				f.insertSeen = true
			}
			armTasks()
		case <-genSub.C():
			f.generator = true
			armLease()
		case n := <-schedSub.C():
			ch, err := parseScheduleChange(n.Payload)
			if err != nil {
				f.h.d.Log.Warn().Err(err).Msg("ignoring schedule notification")
				continue
			}
			// Past maxScheduleMsgs the batch is one message: no need to
			// keep more.
			if len(f.schedules) <= maxScheduleMsgs && !slices.Contains(f.schedules, ch) {
				f.schedules = append(f.schedules, ch)
			}
			if scheduleTimer == nil {
				scheduleTimer = time.After(scheduleBatch)
			}
		case <-leaseSub.Resync():
			f.resync(armLease, armTasks)
		case <-taskSub.Resync():
			f.resync(armLease, armTasks)
		case <-genSub.Resync():
			f.resync(armLease, armTasks)
		case <-schedSub.Resync():
			// What was lost is unknown: any schedule may have changed. The
			// batch under way goes as it is (named, as clients expect).
			f.send(ctx, scheduleMsg{Type: "schedule", Kind: scheduleChanged})
		case <-leaseTimer:
			leaseTimer = nil
			f.flushLeases(ctx)
		case <-tasksTimer:
			tasksTimer = nil
			f.flushTasks(ctx)
			armTasks()
		case <-refreshTimer:
			refreshTimer = nil
			if f.h.Clients() > 0 && time.Since(f.statsAt) >= tasksRefresh {
				f.tasksDirty = true
				armTasks()
			}
			armRefresh()
		case <-scheduleTimer:
			scheduleTimer = nil
			f.flushSchedules(ctx)
		case <-f.h.snapshotMe:
			f.sendSnapshot(ctx)
			armTasks()
			armRefresh()
		}
	}
}

// resync marks everything due after the listener may have lost
// notifications: fresh tasks, generator and instances messages, and the
// lease events that were missed.
func (f *feed) resync(armLease, armTasks func()) {
	f.resynced, f.generator, f.instances, f.tasksDirty = true, true, true, true
	armLease()
	armTasks()
}

// remember records an event as sent, forgetting the oldest beyond
// maxMissedEvents: a resync looks up no more than that.
func (f *feed) remember(id int64) {
	f.lastEvent = max(f.lastEvent, id)
	f.sent[id] = struct{}{}
	f.sentOrder = append(f.sentOrder, id)
	if len(f.sentOrder) > 2*maxMissedEvents {
		for _, old := range f.sentOrder[:maxMissedEvents] {
			delete(f.sent, old)
		}
		f.sentOrder = slices.Delete(f.sentOrder, 0, maxMissedEvents)
	}
}

// flushLeases sends the gathered lease changes, in order, with the leases
// fetched in one query; then the generator and instances messages they
// imply.
func (f *feed) flushLeases(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	changes, received, resynced := f.changes, f.received, f.resynced
	f.changes, f.received, f.resynced = nil, nil, false

	// The events the notifications announce, and after a resync those
	// whose notifications may have been lost.
	eventIDs := make([]int64, 0, len(changes))
	for _, c := range changes {
		eventIDs = append(eventIDs, c.EventID)
	}
	evs, err := f.h.d.Leases.EventsByID(ctx, eventIDs)
	if err != nil {
		f.h.d.Log.Warn().Err(err).Msg("reading lease events")
	}
	f.observeLag(changes, received, evs)
	if resynced {
		missed, err := f.h.d.Leases.NonTaskEvents(ctx, f.lastEvent, maxMissedEvents)
		if err != nil {
			f.h.d.Log.Warn().Err(err).Msg("reading missed lease events")
		}
		evs = append(evs, missed...)
	}
	// Each event once, in id order, and none twice.
	slices.SortFunc(evs, func(a, b lease.Event) int { return cmp.Compare(a.ID, b.ID) })
	evs = slices.CompactFunc(evs, func(a, b lease.Event) bool { return a.ID == b.ID })
	evs = slices.DeleteFunc(evs, func(e lease.Event) bool { _, done := f.sent[e.ID]; return done })
	if len(evs) > 0 {
		ids := make([]int64, len(evs))
		for i, e := range evs {
			ids[i] = e.LeaseID
		}
		leases, err := f.h.d.Leases.GetMany(ctx, ids)
		if err != nil {
			f.h.d.Log.Warn().Err(err).Int("changes", len(ids)).Msg("fetching changed leases; their messages are lost until the next snapshot")
		}
		byID := make(map[int64]lease.Lease, len(leases))
		for _, l := range leases {
			byID[l.ID] = l
		}
		for _, e := range evs {
			f.remember(e.ID)
			if l, ok := byID[e.LeaseID]; ok {
				e := e
				f.send(ctx, leaseMsg{Type: "lease", Kind: e.Kind, Lease: l, Event: &e})
			}
		}
	}
	if f.generator {
		f.generator = false
		if g, err := f.generatorBody(ctx); err != nil {
			f.h.d.Log.Warn().Err(err).Msg("reading the generator status")
		} else {
			f.send(ctx, generatorMsg{Type: "generator", generatorBody: g})
		}
	}
	if f.instances {
		f.instances = false
		if is, err := f.h.d.Instances.Live(ctx); err != nil {
			f.h.d.Log.Warn().Err(err).Msg("listing instances")
		} else {
			f.send(ctx, instancesMsg{Type: "instances", Instances: nonNil(is)})
		}
	}
}

// flushSchedules sends the gathered schedule notifications, one message
// each, or one for them all when there are more than maxScheduleMsgs.
func (f *feed) flushSchedules(ctx context.Context) {
	changes := f.schedules
	f.schedules = nil
	if len(changes) > maxScheduleMsgs {
		f.send(ctx, scheduleMsg{Type: "schedule", Kind: scheduleChanged})
		return
	}
	for _, c := range changes {
		f.send(ctx, scheduleMsg{Type: "schedule", Kind: c.kind, Name: &c.name})
	}
}

// observeLag reports the notify lag of each change whose event was read:
// from the event's time (the database clock) to the arrival of its
// notification (this process's clock), never below zero.
func (f *feed) observeLag(changes []leasestore.Change, received []time.Time, evs []lease.Event) {
	if f.h.d.NotifyLag == nil || len(evs) == 0 {
		return
	}
	at := make(map[int64]time.Time, len(evs))
	for _, e := range evs {
		at[e.ID] = e.At
	}
	for i, c := range changes {
		if t, ok := at[c.EventID]; ok {
			f.h.d.NotifyLag(max(received[i].Sub(t), 0))
		}
	}
}

// flushTasks sends one tasks message. The counts (the pending tasks by
// kind, the limits and the paused queues among them) are taken at most
// once per statsEvery; a message that had to reuse older counts leaves the
// next one due, so the last word always carries fresh counts.
func (f *feed) flushTasks(ctx context.Context) {
	if !f.tasksDirty {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	err := f.wait(ctx)
	var body tasksBody
	if err == nil {
		body, err = f.tasksBody(ctx, false)
	}
	if err != nil {
		// Stays dirty; the next round tries again, later each time, so that a
		// database that is down is not asked again and again.
		// Warned once per run of failures; the retries are debug lines.
		ev := f.h.d.Log.Debug()
		if f.tasksRetry == 0 {
			ev = f.h.d.Log.Warn()
		}
		f.tasksRetry = min(max(2*f.tasksRetry, tasksEvery), maxTasksRetry)
		f.tasksSent = time.Now().Add(f.tasksRetry - tasksEvery)
		ev.Err(err).Stringer("retry_in", f.tasksRetry).Msg("reading task state")
		return
	}
	if f.tasksRetry > 0 {
		f.h.d.Log.Info().Msg("reading task state again")
	}
	f.tasksRetry = 0
	f.tasksDirty = f.statsOwed
	f.insertSeen = false
	f.tasksSent = time.Now()
	f.send(ctx, tasksMsg{Type: "tasks", tasksBody: body})
}

func (f *feed) tasksBody(ctx context.Context, fresh bool) (tasksBody, error) {
	var b tasksBody
	f.statsOwed = false
	if fresh || time.Since(f.statsAt) >= statsEvery {
		s, err := f.h.d.Tasks.Stats(ctx)
		if err != nil {
			return b, err
		}
		p, err := f.h.d.Tasks.PendingByKind(ctx, maxPendingCount)
		if err != nil {
			return b, err
		}
		l, err := f.h.d.Leases.Limits(ctx, "", limitKeys)
		if err != nil {
			return b, err
		}
		q, err := f.h.d.Tasks.PausedQueues(ctx)
		if err != nil {
			return b, err
		}
		f.stats, f.pending, f.statsAt = s, pendingRows(p), time.Now()
		f.limits, f.paused = nonNil(l), nonNil(q[:min(len(q), pausedQueues)])
	} else {
		f.statsOwed = true
	}
	b.Stats, b.PendingByKind, b.Limits, b.PausedQueues = f.stats, f.pending, f.limits, f.paused
	running, err := f.h.d.Tasks.Running(ctx, runningTasks)
	if err != nil {
		return b, err
	}
	dead, err := f.h.d.Tasks.Dead(ctx, deadTasks)
	if err != nil {
		return b, err
	}
	b.RunningTasks, b.DeadTasks = linesOf(running), linesOf(dead)
	return b, nil
}

// maxLineError bounds the error a taskLine carries: the page shows its
// start in a table cell; the whole is in the task.
const maxLineError = 300

// linesOf is the taskLine of each task.
func linesOf(ts []task.Task) []taskLine {
	lines := make([]taskLine, len(ts))
	for i, t := range ts {
		lines[i] = taskLine{
			ID: t.ID, Kind: t.Kind, Queue: t.Queue, State: t.State, Priority: t.Priority,
			Processor: optional(t.Processor), Fence: optional(t.Fence), Attempts: t.Attempts, MaxAttempts: t.MaxAttempts,
			StartedAt: apitime.FormatPtr(t.StartedAt), LastHeartbeatAt: apitime.FormatPtr(t.LastHeartbeatAt),
			MustHeartbeatBefore: apitime.FormatPtr(t.MustHeartbeatBefore), ProcessedAt: apitime.FormatPtr(t.ProcessedAt),
			LastError: optional(cut(t.LastError, maxLineError)), Lock: optional(t.Lock), Schedule: optional(t.Schedule),
		}
	}
	return lines
}

// optional is v, or nil for its zero value (null on the wire, as the
// task object has it).
func optional[T comparable](v T) *T {
	var zero T
	if v == zero {
		return nil
	}
	return &v
}

// cut is s cut to at most n bytes, at a rune boundary, with an ellipsis
// when it was cut.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// pendingRows orders the pending tasks by kind for the page, longest wait
// first (then the most pending, then queue and kind by name), and keeps
// the first pendingKinds: a kind nobody works rises to the top, and stays
// there as its wait grows.
func pendingRows(ps []taskstore.Pending) []pendingKind {
	rows := make([]pendingKind, len(ps))
	for i, p := range ps {
		rows[i] = pendingKind{Queue: p.Queue, Kind: p.Kind, Count: p.Count,
			OldestWaitSeconds: math.Round(p.OldestWait.Seconds()*1000) / 1000}
	}
	slices.SortFunc(rows, func(a, b pendingKind) int {
		return cmp.Or(cmp.Compare(b.OldestWaitSeconds, a.OldestWaitSeconds), cmp.Compare(b.Count, a.Count),
			cmp.Compare(a.Queue, b.Queue), cmp.Compare(a.Kind, b.Kind))
	})
	return rows[:min(len(rows), pendingKinds)]
}

func (f *feed) generatorBody(ctx context.Context) (generatorBody, error) {
	s, err := f.h.d.Generator.Get(ctx)
	if err != nil {
		return generatorBody{}, err
	}
	return generatorBody{Status: s.Switch(), Holder: s.Holder, Fence: s.Fence}, nil
}

// wait registers the hub as a waiter for task changes while it has
// clients, before it reads the task state, so that every insert, claim and
// completion the read does not see is notified; without clients it unregisters. No LISTEN
// session to register is no error: the resync after the reconnect makes
// the feed read (and register) again.
func (f *feed) wait(ctx context.Context) error {
	if f.h.Clients() == 0 {
		f.waiter.UnregisterWithin(ctx, queryTimeout)
		return nil
	}
	if err := f.waiter.Register(ctx); err != nil && !errors.Is(err, notify.ErrNotListening) {
		return err
	}
	return nil
}

// sendSnapshot builds one snapshot for every client waiting for one.
func (f *feed) sendSnapshot(ctx context.Context) {
	qctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	if err := f.wait(qctx); err != nil {
		// The snapshot goes all the same; a tasks message follows once the
		// registration works (flushTasks retries it with backoff).
		f.h.d.Log.Debug().Err(err).Msg("registering as a waiter for inserted tasks before a snapshot")
		f.tasksDirty = true
	}
	msg, err := f.snapshot(qctx)
	if err != nil {
		if ctx.Err() == nil {
			f.h.d.Log.Warn().Err(err).Msg("building a snapshot; closing the waiting clients")
		}
		f.h.broadcast(ctx, frame{snapshot: true})
		return
	}
	pm, err := prepare(msg)
	if err != nil {
		f.h.d.Log.Error().Err(err).Msg("encoding a snapshot")
		f.h.broadcast(ctx, frame{snapshot: true})
		return
	}
	f.h.broadcast(ctx, frame{msg: pm, snapshot: true})
}

func (f *feed) snapshot(ctx context.Context) (snapshotMsg, error) {
	m := snapshotMsg{Type: "snapshot", ThisInstance: f.h.d.Instance}
	_, dbNow, err := f.h.d.Leases.NextExpiry(ctx)
	if err != nil {
		return m, err
	}
	m.DBNow = apitime.Format(dbNow)
	leases, err := f.h.d.Leases.Newest(ctx, snapshotLeases)
	if err != nil {
		return m, err
	}
	m.Leases = nonNil(leases)
	if m.Events, err = f.h.d.Leases.NewestNonTaskEvents(ctx, snapshotEvents); err != nil {
		return m, err
	}
	m.Events = nonNil(m.Events)
	if m.Tasks, err = f.tasksBody(ctx, true); err != nil {
		return m, err
	}
	if m.Generator, err = f.generatorBody(ctx); err != nil {
		return m, err
	}
	is, err := f.h.d.Instances.Live(ctx)
	if err != nil {
		return m, err
	}
	m.Instances = nonNil(is)
	return m, nil
}

// send encodes v once and broadcasts it.
func (f *feed) send(ctx context.Context, v any) {
	pm, err := prepare(v)
	if err != nil {
		f.h.d.Log.Error().Err(err).Msg("encoding a message")
		return
	}
	f.h.broadcast(ctx, frame{msg: pm})
}

func prepare(v any) (*websocket.PreparedMessage, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return websocket.NewPreparedMessage(websocket.TextMessage, b)
}

// nonNil makes an empty list encode as [] rather than null.
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
