package worker_test

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/demo"
	"github.com/leasehold/leasehold/internal/taskstore"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/notify"
	"github.com/leasehold/leasehold/internal/worker"
)

// benchReplicas starts replicas×workers in-process, each replica with its
// own LISTEN connection as a process has, and returns once all listen.
func benchReplicas(ctx context.Context, b *testing.B, wg *sync.WaitGroup, url string, tasks *taskstore.Store,
	replicas, workers int, onEvent func(worker.Event)) {
	b.Helper()
	for r := range replicas {
		l := notify.New(func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, url) },
			zerolog.Nop(), notify.ChannelTask, notify.ChannelLease)
		ready := l.Subscribe(notify.ChannelTask, 1)
		wg.Go(func() { _ = l.Run(ctx) })
		<-ready.Resync()
		ready.Close()
		p := &worker.Pool{Tasks: tasks, Listener: l, Instance: string(rune('a' + r)), Workers: workers,
			TTL: 30 * time.Second, Kinds: []string{demo.Kind}, Handler: sleepHandler(b, 0, nil),
			Log: zerolog.Nop(), OnEvent: onEvent}
		wg.Go(func() { _ = p.Run(ctx) })
	}
}

// BenchmarkDrain pre-inserts 10,000 zero-work tasks, then 3 replicas × 4
// workers complete them all; reports tasks/s.
//
//	go test -run '^$' -bench Drain -benchtime 1x ./internal/worker/
func BenchmarkDrain(b *testing.B) {
	const n, replicas, workers = 10000, 3, 4
	for range b.N {
		b.StopTimer()
		tdb := pgtest.New(b)
		tasks := taskstore.NewStore(tdb.Pool)
		batch := make([]taskstore.NewTask, 1000)
		for i := range batch {
			batch[i] = taskstore.NewTask{TaskData: json.RawMessage(`{"sleep_duration_seconds": 0}`)}
		}
		for range n / len(batch) {
			if _, err := taskstore.TasksOf(tasks.Insert(context.Background(), batch)); err != nil {
				b.Fatal(err)
			}
		}
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		var completed atomic.Int64
		done := make(chan struct{})
		b.StartTimer()
		start := time.Now()
		benchReplicas(ctx, b, &wg, tdb.URL, tasks, replicas, workers, func(ev worker.Event) {
			if ev.Kind == worker.EventCompleted && completed.Add(1) == n {
				close(done)
			}
		})
		<-done
		elapsed := time.Since(start)
		b.StopTimer()
		cancel()
		wg.Wait()
		b.ReportMetric(n/elapsed.Seconds(), "tasks/s")
		stats, err := tasks.Stats(context.Background())
		if err != nil || stats.Done != n {
			b.Fatalf("stats after the drain: %+v, %v", stats, err)
		}
	}
}

// BenchmarkPickupLatency inserts one task at a time while 3 replicas × 4
// workers wait idle, and measures from the insert's commit to the claim
// (the claim statement's return); reports p50, p99 and max over 1,000
// tasks.
//
//	go test -run '^$' -bench PickupLatency -benchtime 1x ./internal/worker/
func BenchmarkPickupLatency(b *testing.B) {
	const n = 1000
	tdb := pgtest.New(b)
	tasks := taskstore.NewStore(tdb.Pool)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	claimed := make(chan int64, 16)
	completed := make(chan int64, 16)
	benchReplicas(ctx, b, &wg, tdb.URL, tasks, 3, 4, func(ev worker.Event) {
		switch ev.Kind {
		case worker.EventClaimed:
			claimed <- ev.TaskID
		case worker.EventCompleted:
			completed <- ev.TaskID
		}
	})
	data := []taskstore.NewTask{{TaskData: json.RawMessage(`{"sleep_duration_seconds": 0}`)}}
	for range b.N {
		lat := make([]time.Duration, 0, n)
		for range n {
			inserted := time.Now()
			ts, err := taskstore.TasksOf(tasks.Insert(ctx, data))
			committed := time.Now()
			if err != nil {
				b.Fatal(err)
			}
			// The insert returns after its commit; count from the midpoint
			// of the round trip, when the commit most likely happened.
			from := inserted.Add(committed.Sub(inserted) / 2)
			if id := <-claimed; id != ts[0].ID {
				b.Fatalf("claimed task %d, want %d", id, ts[0].ID)
			}
			lat = append(lat, time.Since(from))
			<-completed // idle again before the next insert
		}
		slices.Sort(lat)
		b.ReportMetric(float64(lat[n/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(lat[n*99/100].Microseconds())/1000, "p99-ms")
		b.ReportMetric(float64(lat[n-1].Microseconds())/1000, "max-ms")
	}
}
