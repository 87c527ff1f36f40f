package task_test

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/leasehold/leasehold/task"
)

// A task as the REST API shows it: zero values are nulls.
func ExampleTask_MarshalJSON() {
	t := task.Task{
		ID: 12, Kind: "welcome_email", Queue: "default", TaskData: json.RawMessage(`{"user_id":42}`),
		State: task.StatePending, ScheduledAt: time.Date(2026, 12, 1, 9, 30, 0, 0, time.UTC),
		MaxAttempts: 5, CreatedAt: time.Date(2026, 12, 1, 9, 30, 0, 0, time.UTC),
	}
	b, _ := json.Marshal(t)
	var back task.Task
	_ = json.Unmarshal(b, &back)
	fmt.Println(string(b))
	fmt.Println(back.Processor == "", back.Fence == 0, back.ScheduledAt.Equal(t.ScheduledAt))
	// Output:
	// {"id":12,"kind":"welcome_email","queue":"default","priority":0,"task_data":{"user_id":42},"state":"pending","unique_key":null,"scheduled_at":"2026-12-01T09:30:00.000Z","processor":null,"fence":null,"ttl_seconds":null,"attempts":0,"max_attempts":5,"last_heartbeat_at":null,"must_heartbeat_before":null,"started_at":null,"processed_at":null,"task_output":null,"last_error":null,"created_at":"2026-12-01T09:30:00.000Z","lock":null,"schedule":null,"schedule_tick":null,"earlier_attempts":[],"metadata":null}
	// true true true
}
