package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/lease"

	"github.com/gorilla/websocket"
	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/demo"
	"github.com/leasehold/leasehold/internal/hub"
	"github.com/leasehold/leasehold/internal/instance"
	"github.com/leasehold/leasehold/internal/notify"
	"github.com/leasehold/leasehold/internal/server"
)

// fanoutRounds is how many lease changes fanout times.
const fanoutRounds = 50

// runFanout connects Fanout websocket clients to one replica's dashboard stream and times,
// per lease change (a renewal, committed), how long until the last client has it. The
// feed's batching window is part of the figure, as it is of what a dashboard sees.
func runFanout(ctx context.Context, c Config, _ []Result) ([]Result, error) {
	d, err := newDB(ctx, c.DatabaseURL, 16)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	leases := leasestore.NewStore(d.Pool)
	runCtx, stop := context.WithCancel(ctx)
	var bg sync.WaitGroup
	defer func() { stop(); bg.Wait() }()
	listener, err := d.listen(runCtx, &bg, notify.ChannelLease, notify.ChannelTask, notify.ChannelGenerator)
	if err != nil {
		return nil, err
	}
	deps := hub.Deps{Leases: leases, Tasks: taskstore.NewStore(d.Pool), Generator: demo.NewState(d.Pool),
		Instances: instance.NewStore(d.Pool), Listener: listener, Instance: "bench", SendBuffer: 4096, Log: zerolog.Nop()}
	h := hub.New(deps)
	bg.Go(func() { _ = h.Run(runCtx) })
	api, err := startAPI(server.Deps{Leases: leases, Tasks: deps.Tasks, Generator: deps.Generator,
		Instances: deps.Instances, Hub: h, DefaultTTL: 30 * time.Second,
		Instance: server.Instance{ID: "bench", StartedAt: time.Now().UTC(), Roles: []string{"api"}, Version: "bench"}})
	if err != nil {
		return nil, err
	}
	defer api.Close()

	acq, err := leases.Acquire(ctx, lease.AcquireParams{Resource: "bench:fanout", Holder: "bench", TTL: time.Hour})
	if err != nil {
		return nil, err
	}
	got := make(chan time.Time, c.Fanout)
	conns := make([]*websocket.Conn, 0, c.Fanout)
	defer func() {
		for _, conn := range conns {
			_ = conn.Close()
		}
	}()
	wsURL := "ws" + strings.TrimPrefix(api.base, "http") + "/ws"
	for range c.Fanout {
		conn, resp, err := websocket.DefaultDialer.DialContext(ctx, wsURL, nil)
		if resp != nil && resp.Body != nil {
			resp.Body.Close()
		}
		if err != nil {
			return nil, fmt.Errorf("open a websocket: %w", err)
		}
		conns = append(conns, conn)
		var first struct {
			Type string `json:"type"`
		}
		if err := conn.ReadJSON(&first); err != nil {
			return nil, fmt.Errorf("read the first message: %w", err)
		}
		if first.Type != "snapshot" {
			return nil, fmt.Errorf("first message %q, want a snapshot", first.Type)
		}
		bg.Go(func() {
			for {
				_, data, err := conn.ReadMessage()
				if err != nil {
					return
				}
				var m struct {
					Type string `json:"type"`
					Kind string `json:"kind"`
				}
				if json.Unmarshal(data, &m) == nil && m.Type == "lease" && m.Kind == "renewed" {
					got <- time.Now()
				}
			}
		})
	}
	var total, spread []time.Duration
	for range fanoutRounds {
		start := time.Now()
		if _, err := leases.Renew(ctx, lease.RenewParams{Resource: "bench:fanout", Holder: "bench", Fence: acq.Lease.Fence}); err != nil {
			return nil, err
		}
		first, last := time.Time{}, time.Time{}
		for i := range c.Fanout {
			select {
			case at := <-got:
				if i == 0 || at.Before(first) {
					first = at
				}
				if at.After(last) {
					last = at
				}
			case <-time.After(30 * time.Second):
				return nil, fmt.Errorf("only %d of %d clients had the change after 30s", i, c.Fanout)
			}
		}
		total = append(total, last.Sub(start))
		spread = append(spread, last.Sub(first))
	}
	slices.Sort(total)
	slices.Sort(spread)
	setup := fmt.Sprintf("lease change → all %d clients have it, %d changes", c.Fanout, fanoutRounds)
	return []Result{
		{Scenario: "fanout", Case: "p50, " + setup, Value: ms(percentile(total, 50)), Unit: "ms"},
		{Scenario: "fanout", Case: "max, " + setup, Value: ms(percentile(total, 100)), Unit: "ms"},
		{Scenario: "fanout", Case: "p50 spread, first client → last", Value: ms(percentile(spread, 50)), Unit: "ms"},
	}, nil
}
