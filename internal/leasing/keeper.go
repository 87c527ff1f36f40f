package leasing

import (
	"time"

	"github.com/leasehold/leasehold/lease"
)

// The observer's calls, for a KeepConfig whose Observer may be nil.

func won(c lease.KeepConfig, l lease.Lease) {
	if c.Observer != nil {
		c.Observer.Won(l)
	}
}

func released(c lease.KeepConfig, l lease.Lease) {
	if c.Observer != nil {
		c.Observer.Released(l)
	}
}

// MaxWaitPerRequest is the longest wait one acquisition may ask for (the
// REST API's wait_seconds bound); a caller that means to wait longer asks
// again.
const MaxWaitPerRequest = 300 * time.Second
