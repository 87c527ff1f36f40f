package leasehold_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/lab/testkit"
)

// outcomeArgs says what its task's handler does.
type outcomeArgs struct {
	Do string `json:"do"`
}

func (outcomeArgs) Kind() string { return "outcome" }

// TestSubscribe: a subscription hears what becomes of each attempt of the
// client's workers, of the kinds it asked for, embedded and remote alike;
// after its end, nothing.
func TestSubscribe(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	svc := startService(t, db)
	w := leasehold.NewWorkers()
	if err := leasehold.AddWorker(w, leasehold.WorkFunc(func(_ context.Context, tk *leasehold.Task[outcomeArgs]) error {
		switch tk.Args.Do {
		case "fail":
			return errors.New("it failed")
		case "cancel":
			return leasehold.Cancel(errors.New("not wanted"))
		case "snooze":
			if tk.Attempts == 1 && len(tk.EarlierAttempts) == 0 {
				return leasehold.Snooze(time.Millisecond)
			}
		}
		return nil
	}), leasehold.KindConfig{MaxAttempts: 1}); err != nil {
		t.Fatal(err)
	}
	embedded, err := leasehold.NewClient(db.Pool, leasehold.Config{Workers: w})
	if err != nil {
		t.Fatal(err)
	}
	remote, err := leasehold.NewRemoteClient(leasehold.RemoteConfig{URL: svc.URL}, leasehold.Config{Workers: w})
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]*leasehold.Client{"embedded": embedded, "remote": remote} {
		t.Run(name, func(t *testing.T) {
			all, endAll := c.Subscribe()
			deaths, endDeaths := c.Subscribe(leasehold.EventDead)
			if err := c.Start(t.Context()); err != nil {
				t.Fatal(err)
			}
			defer c.Stop(context.Background()) //nolint:errcheck // the test's end
			want := map[string]leasehold.EventKind{"ok": leasehold.EventCompleted, "fail": leasehold.EventDead, "cancel": leasehold.EventCancelled}
			ids := map[int64]string{}
			for do := range want {
				res, err := c.Insert(t.Context(), outcomeArgs{Do: do}, nil)
				if err != nil {
					t.Fatal(err)
				}
				ids[res.Task.ID] = do
			}
			for len(want) > 0 {
				ev := testkit.Receive(t, "an event", all)
				do, ok := ids[ev.TaskID]
				if !ok || ev.TaskKind != "outcome" || ev.Attempt != 1 {
					t.Fatalf("an event of no task of the test: %+v", ev)
				}
				if ev.Kind != want[do] {
					t.Errorf("the %s task: %s; want %s", do, ev.Kind, want[do])
				}
				delete(want, do)
			}
			if ev := testkit.Receive(t, "the death", deaths); ev.Kind != leasehold.EventDead || ids[ev.TaskID] != "fail" || ev.Err == nil {
				t.Errorf("the subscription to deaths heard %+v; want the failed task, with its error", ev)
			}
			endAll()
			endDeaths()
			if _, open := <-all; open {
				t.Error("the channel is open after the subscription ended")
			}
		})
	}
}
