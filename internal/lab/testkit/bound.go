package testkit

import (
	"os"
	"strconv"
	"time"
)

// Slack is the factor by which Bound stretches the time bounds a test
// holds the code to (a guarantee's "within 1 s"): 1 on an ordinary build,
// 3 under the race detector, which slows everything it watches; the
// environment's LEASEHOLD_TEST_SLACK (a number) replaces it. A bound is
// the guarantee's on an idle machine; the slack is what a loaded one (a CI
// runner's two cores running the suite's packages side by side) needs.
var Slack = slack()

func slack() float64 {
	if f, err := strconv.ParseFloat(os.Getenv("LEASEHOLD_TEST_SLACK"), 64); err == nil && f >= 1 {
		return f
	}
	if raceEnabled {
		return 3
	}
	return 1
}

// Bound is d stretched by Slack.
func Bound(d time.Duration) time.Duration { return time.Duration(float64(d) * Slack) }
