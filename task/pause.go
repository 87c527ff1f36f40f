package task

import (
	"encoding/json"
	"time"

	"github.com/leasehold/leasehold/internal/apitime"
)

// QueuePause is a paused queue: its pending tasks are not claimed (its
// running ones finish) until it is resumed, or until Until when set.
type QueuePause struct {
	Queue    string    `json:"queue"`
	PausedAt time.Time `json:"paused_at"`
	// Until is when the pause ends on its own; nil: when resumed.
	Until  *time.Time `json:"until"`
	Reason string     `json:"reason"`
}

// MarshalJSON writes the pause as the API shows it: times as RFC 3339 UTC
// with milliseconds.
func (p QueuePause) MarshalJSON() ([]byte, error) {
	type plain QueuePause
	return json.Marshal(struct {
		plain
		PausedAt string  `json:"paused_at"`
		Until    *string `json:"until"`
	}{plain: plain(p), PausedAt: apitime.Format(p.PausedAt), Until: apitime.FormatPtr(p.Until)})
}
