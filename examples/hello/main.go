// Command hello is the README's "Use it from Go": a worker for one kind, a
// client on the program's pool, and an insert in a transaction that the
// worker runs once it commits. It needs DATABASE_URL.
package main

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold"
)

// README begins

type Hello struct {
	Name string `json:"name"`
}

func (Hello) Kind() string { return "hello" }

func main() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	check(err)
	_, err = leasehold.Migrate(ctx, pool) // or `leasehold migrate` when you deploy
	check(err)
	done := make(chan struct{})
	workers := leasehold.NewWorkers()
	check(leasehold.AddWorker(workers, leasehold.WorkFunc(func(ctx context.Context, t *leasehold.Task[Hello]) error {
		fmt.Printf("hello, %s (attempt %d, fence %d)\n", t.Args.Name, t.Attempts, t.Fence)
		close(done)
		return nil // completes the task; an error retries it, with backoff
	}), leasehold.KindConfig{MaxAttempts: 5}))
	client, err := leasehold.NewClient(pool, leasehold.Config{Workers: workers})
	check(err)
	check(client.Start(ctx))
	defer client.Stop(ctx)

	tx, err := pool.Begin(ctx) // your own writes go in this transaction too
	check(err)
	_, err = client.InsertTx(ctx, tx, Hello{Name: "world"}, nil)
	check(err)
	check(tx.Commit(ctx)) // the task exists if and only if this commits
	<-done
}

// README ends

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
