// Command hello is the README's "Use it from Go": a worker for one kind, a
// client on the program's pool, and an insert that the worker runs. It
// needs DATABASE_URL, a database migrated by `leasehold migrate`.
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
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL")) // migrated: `leasehold migrate`
	check(err)
	done := make(chan struct{})
	workers := leasehold.NewWorkers()
	check(leasehold.AddWorker(workers, leasehold.WorkFunc[Hello](func(ctx context.Context, t *leasehold.Task[Hello]) error {
		fmt.Printf("hello, %s (attempt %d, fence %d)\n", t.Args.Name, t.Attempts, t.Fence)
		close(done)
		return nil // completes the task; an error would retry it, with backoff
	}), leasehold.KindConfig{MaxAttempts: 5}))
	client, err := leasehold.NewClient(pool, leasehold.Config{Workers: workers})
	check(err)
	check(client.Start(ctx))
	defer client.Stop(ctx)
	_, err = client.Insert(ctx, Hello{Name: "world"}, nil) // or InsertTx(ctx, tx, …) in your transaction
	check(err)
	<-done
}

// README ends

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
