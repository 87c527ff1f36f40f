package leaseholdtest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/leaseholdtest"
)

type invoice struct {
	OrderID int64 `json:"order_id"`
}

func (invoice) Kind() string { return "invoice" }

// A worker's Work, tested without a database or a queue.
func ExampleWork() {
	w := leasehold.WorkFunc(func(ctx context.Context, t *leasehold.Task[invoice]) error {
		return leasehold.RecordOutput(ctx, map[string]int64{"invoiced": t.Args.OrderID})
	})
	res, err := leaseholdtest.Work(context.Background(), w, invoice{OrderID: 12}, nil)
	fmt.Println(res.Outcome, string(res.Output), err)
	// Output: completed {"invoiced":12} <nil>
}

// In a test of a function that inserts in the caller's transaction: the
// task is there, with its args, before anything commits.
func ExampleRequireInsertedTx() {
	var t *testing.T       // the test's
	var pool *pgxpool.Pool // the test's database, migrated
	var client *leasehold.Client
	ctx := context.Background()
	tx, _ := pool.Begin(ctx)
	defer tx.Rollback(ctx)                                     //nolint:errcheck // an example
	_, _ = client.InsertTx(ctx, tx, invoice{OrderID: 12}, nil) // what the code under test does
	got := leaseholdtest.RequireInsertedTx[invoice](ctx, t, tx, "")
	fmt.Println(got.Args.OrderID)
}

// In a test of a program's workers: wait until they have done everything
// that is due, then look at what they did. No sleep.
func ExampleWaitIdle() {
	var client *leasehold.Client // started, with the program's workers
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := leaseholdtest.WaitIdle(ctx, client); err != nil {
		fmt.Println(err)
	}
}
