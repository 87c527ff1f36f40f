package taskstore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/taskstore"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
)

// BenchmarkClaimCompleteBatch: one op is a task inserted, claimed and completed, in
// batches of 100 (one insert, one claim and one CompleteMany statement per batch),
// as a replica with 100 idle workers does; for benchstat:
//
//	go test -run '^$' -bench ClaimCompleteBatch -count 6 ./internal/taskstore/
func BenchmarkClaimCompleteBatch(b *testing.B) {
	const batch = 100
	ctx := context.Background()
	s := taskstore.NewStore(pgtest.New(b).Pool)
	workers := make([]string, batch)
	for i := range workers {
		workers[i] = fmt.Sprintf("bench/w%d", i+1)
	}
	data := make([]taskstore.NewTask, batch)
	for i := range data {
		data[i] = taskstore.NewTask{TaskData: json.RawMessage(`{}`)}
	}
	b.ResetTimer()
	for done := 0; done < b.N; done += batch {
		if _, err := taskstore.TasksOf(s.Insert(ctx, data)); err != nil {
			b.Fatal(err)
		}
		claimed, err := s.Claim(ctx, taskstore.ClaimParams{Processors: workers, TTL: time.Minute, WithLapsed: true})
		if err != nil || len(claimed) != batch {
			b.Fatalf("claim: %d tasks, %v", len(claimed), err)
		}
		cs := make([]taskstore.Completion, len(claimed))
		for i, t := range claimed {
			cs[i] = taskstore.Completion{ID: t.ID, Processor: t.Processor, Fence: t.Fence}
		}
		if got, err := s.CompleteMany(ctx, cs); err != nil || len(got) != batch {
			b.Fatalf("complete: %d tasks, %v", len(got), err)
		}
	}
}
