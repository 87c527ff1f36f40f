package lease_test

import (
	"fmt"
	"time"

	"github.com/leasehold/leasehold/lease"
)

// A configuration under which a holder could not keep its lease is refused
// before anything is sent.
func ExampleKeepConfig_Validate() {
	fmt.Println(lease.KeepConfig{TTL: 30 * time.Second}.Validate())
	fmt.Println(lease.KeepConfig{TTL: 3 * time.Second, RenewInterval: 5 * time.Second}.Validate())
	c := lease.KeepConfig{TTL: 30 * time.Second}.WithDefaults()
	fmt.Println(c.RenewInterval, c.RetryInterval, c.Margin)
	// Output:
	// <nil>
	// renew interval 5s must be positive and shorter than the TTL 3s
	// 10s 2.5s 3s
}
