package leasing

import (
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
