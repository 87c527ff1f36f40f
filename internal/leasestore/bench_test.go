package leasestore_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/lease"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
)

// The store's hot paths, for benchstat; -cpu sets the concurrency
// (GOMAXPROCS × 4 clients), each client on a resource of its own:
//
//	go test -run '^$' -bench 'AcquireRelease|Renew' -cpu 1,2,8 -count 6 ./internal/leasestore/

// BenchmarkAcquireRelease: one op is an acquisition and its release (two commits).
func BenchmarkAcquireRelease(b *testing.B) {
	s := leasestore.NewStore(pgtest.New(b).Pool)
	var next atomic.Int64
	b.SetParallelism(4)
	b.RunParallel(func(pb *testing.PB) {
		res := fmt.Sprintf("bench:%d", next.Add(1))
		for pb.Next() {
			a, err := s.Acquire(b.Context(), lease.AcquireParams{Resource: res, Holder: "h", TTL: time.Minute})
			if err != nil {
				b.Error(err)
				return
			}
			if _, err := s.Release(b.Context(), lease.ReleaseParams{Resource: res, Holder: "h", Fence: a.Lease.Fence}); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkRenew: one op is a renewal (one commit).
func BenchmarkRenew(b *testing.B) {
	s := leasestore.NewStore(pgtest.New(b).Pool)
	var next atomic.Int64
	b.SetParallelism(4)
	b.RunParallel(func(pb *testing.PB) {
		res := fmt.Sprintf("bench:%d", next.Add(1))
		a, err := s.Acquire(b.Context(), lease.AcquireParams{Resource: res, Holder: "h", TTL: time.Minute})
		if err != nil {
			b.Error(err)
			return
		}
		for pb.Next() {
			if _, err := s.Renew(b.Context(), lease.RenewParams{Resource: res, Holder: "h", Fence: a.Lease.Fence}); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
