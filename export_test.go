package leasehold

import "time"

// SetSafetyPoll sets the last-resort poll of c's workers, before Start: a
// negative d turns it off, for tests that prove nobody needs it.
func SetSafetyPoll(c *Client, d time.Duration) { c.safetyPoll = d }
