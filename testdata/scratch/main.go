// Command scratch is a program of a library user's: it imports leasehold
// and its public packages, and nothing else of the module, so that a test
// can list what such a program links.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/schedule"
	"github.com/leasehold/leasehold/task"
)

type hello struct{ Name string }

func (hello) Kind() string { return "hello" }

func main() {
	ctx := context.Background()
	workers := leasehold.NewWorkers()
	_ = leasehold.AddWorker(workers, leasehold.WorkFunc(func(context.Context, *leasehold.Task[hello]) error { return nil }), leasehold.KindConfig{})
	client, err := leasehold.NewRemoteClient(leasehold.RemoteConfig{URL: "http://localhost:8080"}, leasehold.Config{
		Workers: workers, Queues: map[string]leasehold.QueueConfig{"default": {MaxWorkers: 2}},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	_ = client.Start(ctx)
	_, _ = client.Leases().Acquire(ctx, lease.AcquireParams{Resource: "scratch", Holder: "me"})
	_, _ = client.Schedules().Get(ctx, "nightly")
	fmt.Println(task.StateDone, schedule.DefaultZone)
}
