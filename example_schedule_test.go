package leasehold_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/schedule"
)

type cleanup struct{}

func (cleanup) Kind() string { return "cleanup" }

// A schedule makes one task per tick, whichever process holds the
// scheduler lease: here the client itself (Config.Scheduler).
func ExampleSchedules_Add() {
	ctx := context.Background()
	ran := make(chan string, 1)
	workers := leasehold.NewWorkers()
	err := leasehold.AddWorker(workers, leasehold.WorkFunc(func(ctx context.Context, t *leasehold.Task[cleanup]) error {
		select {
		case ran <- t.Schedule:
		default:
		}
		return nil
	}), leasehold.KindConfig{})
	if err != nil {
		log.Fatal(err)
	}
	client, err := leasehold.NewClient(examplePool(), leasehold.Config{Workers: workers, Scheduler: true})
	if err != nil {
		log.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer client.Stop(ctx) //nolint:errcheck // an example

	s, err := client.Schedules().Add(ctx, schedule.Params{Name: "cleanup-every-second", Cron: "@every 1s", Kind: "cleanup"})
	if err != nil {
		log.Print(err)
		return
	}
	defer client.Schedules().Delete(ctx, s.Name) //nolint:errcheck // an example
	fmt.Println("added", s.Name, s.Cron, s.Zone)
	fmt.Println("a task of", <-ran)

	_, err = client.Schedules().Add(ctx, schedule.Params{Name: "nightly", Cron: "0 3 * * *", Zone: "Mars/Olympus", Kind: "cleanup"})
	fmt.Println(errors.Is(err, schedule.ErrInvalid), errors.Is(err, leasehold.ErrInvalidArgument))
	// Output:
	// added cleanup-every-second @every 1s UTC
	// a task of cleanup-every-second
	// true true
}

type reindex struct{}

func (reindex) Kind() string { return "reindex" }

// A task gated by a lock holds that resource's lease while it runs: no
// other task of the lock, no `leasehold exec --resource`, no other holder
// runs at the same time.
func ExampleInsertOpts_lock() {
	ctx := context.Background()
	done := make(chan struct{})
	var client *leasehold.Client
	workers := leasehold.NewWorkers()
	err := leasehold.AddWorker(workers, leasehold.WorkFunc(func(ctx context.Context, t *leasehold.Task[reindex]) error {
		defer close(done)
		fmt.Println("running with the lock", t.Lock, "under the task's fence:", t.Fence > 0)
		_, err := client.Leases().Acquire(ctx, lease.AcquireParams{Resource: "db:search-index", Holder: "a-script"})
		var held *lease.HeldError
		if errors.As(err, &held) {
			fmt.Println("another holder is refused; the lock's fence is the task's:", held.Lease.Fence == t.Fence)
		}
		return nil
	}), leasehold.KindConfig{})
	if err != nil {
		log.Fatal(err)
	}
	client, err = leasehold.NewClient(examplePool(), leasehold.Config{Workers: workers})
	if err != nil {
		log.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer client.Stop(ctx) //nolint:errcheck // an example
	if _, err := client.Insert(ctx, reindex{}, &leasehold.InsertOpts{Lock: "db:search-index"}); err != nil {
		log.Print(err)
		return
	}
	<-done
	// Output:
	// running with the lock db:search-index under the task's fence: true
	// another holder is refused; the lock's fence is the task's: true
}
