package demo

import (
	"encoding/json"
	"testing"
	"time"
)

// TestTaskData: each task sleeps a uniformly random whole number of
// milliseconds in the configured range, written in seconds.
func TestTaskData(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		min, max time.Duration
		want     string // the only possible task_data; "" when random
	}{
		{0, 0, ""}, // the defaults
		{0, time.Millisecond, ""},
		{2500 * time.Millisecond, 2500 * time.Millisecond, `{"sleep_duration_seconds":2.5}`},
		{time.Hour, time.Hour, `{"sleep_duration_seconds":3600}`},
		{1234 * time.Millisecond, 1234 * time.Millisecond, `{"sleep_duration_seconds":1.234}`},
	} {
		s := settings{minMS: tc.min.Milliseconds(), maxMS: tc.max.Milliseconds()}
		if tc.min == 0 && tc.max == 0 {
			s.minMS, s.maxMS = DefaultMinSleep.Milliseconds(), DefaultMaxSleep.Milliseconds()
		}
		seen := map[int64]bool{}
		for range 2000 {
			data := s.taskData()
			if tc.want != "" && string(data) != tc.want {
				t.Fatalf("%s..%s: %s; want %s", tc.min, tc.max, data, tc.want)
			}
			var d struct {
				Sleep float64 `json:"sleep_duration_seconds"`
			}
			if err := json.Unmarshal(data, &d); err != nil {
				t.Fatalf("%s: %v", data, err)
			}
			ms := int64(d.Sleep*1000 + 0.5)
			if float64(ms)/1000 != d.Sleep || ms < s.minMS || ms > s.maxMS {
				t.Fatalf("%s..%s: %s; want whole milliseconds in the range", tc.min, tc.max, data)
			}
			seen[ms] = true
		}
		// Both ends of a small range come up: the range is inclusive.
		if s.maxMS-s.minMS == 1 && (!seen[s.minMS] || !seen[s.maxMS]) {
			t.Errorf("%s..%s: saw %v; want both ends", tc.min, tc.max, seen)
		}
	}
}
