package hub_test

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/lease"

	"github.com/gorilla/websocket"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
)

// BenchmarkFanout200 measures, with 200 clients connected, the time from a
// lease change (a renewal, committed) to the last client having its
// message: ms/change. It includes the feed's 50 ms batching window; the
// spread (first to last client) is the fan-out alone.
func BenchmarkFanout200(b *testing.B) {
	const clients = 200
	db := pgtest.New(b)
	r := startReplica(b, db, "bench", options{})
	leases := leasestore.NewStore(db.Pool)
	acq, err := leases.Acquire(b.Context(), lease.AcquireParams{Resource: "bench", Holder: "h", TTL: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	type receipt struct{ at time.Time }
	got := make(chan receipt, clients)
	var wg sync.WaitGroup
	conns := make(chan *websocket.Conn, clients)
	var dialing sync.WaitGroup
	for range clients {
		dialing.Go(func() {
			conn, _, err := dial(b, r, nil)
			if err != nil {
				b.Error(err)
				return
			}
			if m, err := read(conn); err != nil || m.Type != "snapshot" {
				b.Errorf("first message %q, %v; want a snapshot", m.Type, err)
			}
			conns <- conn
		})
	}
	dialing.Wait()
	close(conns)
	if b.Failed() {
		b.FailNow()
	}
	r.waitListening(b)
	var all []*websocket.Conn
	for conn := range conns {
		all = append(all, conn)
		wg.Go(func() {
			for {
				m, err := read(conn)
				if err != nil {
					return
				}
				if m.Type == "lease" && m.Kind == "renewed" {
					got <- receipt{at: time.Now()}
				}
			}
		})
	}
	b.Cleanup(func() {
		for _, c := range all {
			_ = c.Close()
		}
		wg.Wait()
	})
	var total, spread time.Duration
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		if _, err := leases.Renew(b.Context(), lease.RenewParams{Resource: "bench", Holder: "h", Fence: acq.Lease.Fence}); err != nil {
			b.Fatal(err)
		}
		times := make([]time.Time, 0, clients)
		for range clients {
			times = append(times, (<-got).at)
		}
		first, last := slices.MinFunc(times, time.Time.Compare), slices.MaxFunc(times, time.Time.Compare)
		total += last.Sub(start)
		spread += last.Sub(first)
	}
	b.StopTimer()
	b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "ms/change")
	b.ReportMetric(float64(spread.Microseconds())/1000/float64(b.N), "ms-spread/change")
	b.ReportMetric(0, "ns/op")
}
