package leaseholdotel_test

import (
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/leaseholdotel"
)

// Trace a client's tasks with the program's global tracer provider.
func ExampleMiddleware() {
	var pool *pgxpool.Pool // the program's
	workers := leasehold.NewWorkers()
	// ... AddWorker for each kind ...
	client, err := leasehold.NewClient(pool, leasehold.Config{
		Workers:    workers,
		Middleware: []leasehold.Middleware{leaseholdotel.Middleware(nil)},
	})
	fmt.Println(client != nil, err)
}
