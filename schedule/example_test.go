package schedule_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/leasehold/leasehold/schedule"
)

// Parse checks an expression in a zone and tells its ticks; what it
// refuses is an *InvalidError naming the field to fix.
func ExampleParse() {
	s, err := schedule.Parse("30 2 * * *", "America/New_York")
	if err != nil {
		fmt.Println(err)
		return
	}
	// The night the clocks skip 02:30, the tick runs at the change.
	at := time.Date(2027, 3, 13, 12, 0, 0, 0, time.UTC)
	fmt.Println(s.Next(at).Format(time.RFC3339))

	_, err = schedule.Parse("61 * * * *", "")
	var inv *schedule.InvalidError
	fmt.Println(errors.As(err, &inv), inv.Field)
	// Output:
	// 2027-03-14T07:00:00Z
	// true cron
}
