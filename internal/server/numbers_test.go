package server

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
)

// TestPrintedLengthIsPostgreSQLs holds printedLength to PostgreSQL itself:
// for numbers written every way JSON allows, it is the length of the
// number as jsonb prints it (one more for a negative zero, which prints
// without its sign).
func TestPrintedLengthIsPostgreSQLs(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	rng := rand.New(rand.NewPCG(1, 2))
	nums := []string{"0", "-0", "1", "-1", "1e5", "1E+5", "1.50", "0.001", "1e-3", "12.5e-1", "0.0", "-0.0e-5",
		"1.23e2", "1.2300e2", "123e-5", "6.02e23", "1.5e-20", "1.7976931348623157e308", "0e10", "0.000e3", "100e-2", "1e-100"}
	for range 300 {
		n := fmt.Sprint(rng.IntN(100000))
		if rng.IntN(2) == 0 {
			n += "." + strings.Repeat("0", rng.IntN(3)) + fmt.Sprint(rng.IntN(1000))
		}
		if rng.IntN(2) == 0 {
			n += fmt.Sprintf("e%d", rng.IntN(80)-40)
		}
		if rng.IntN(3) == 0 {
			n = "-" + n
		}
		nums = append(nums, n)
	}
	for _, n := range nums {
		var got int64
		if err := db.Pool.QueryRow(context.Background(), `SELECT length(($1::jsonb)::text)`, n).Scan(&got); err != nil {
			t.Fatalf("%s: %v", n, err)
		}
		if p := printedLength(n); p < got || p > got+1 {
			t.Errorf("%s: printedLength %d, PostgreSQL prints %d characters", n, p, got)
		}
	}
}

// TestNumbersThatGrowAreRefused: a number PostgreSQL would print much
// longer than it was written is refused with a 400 saying so; every number
// a program really sends passes.
func TestNumbersThatGrowAreRefused(t *testing.T) {
	t.Parallel()
	for _, n := range []string{"1e131071", "1e40", "-1e-40", "1.5e-1000", "5e+100"} {
		err := checkJSON("task_data", []byte(`{"n":`+n+`}`), true)
		if err == nil || !strings.Contains(err.Error(), "which PostgreSQL would store and print as") {
			t.Errorf("%s: %v; want a 400 saying it would print longer than written", n, err)
		}
	}
	for _, n := range []string{"0", "1.5", "6.02e23", "1.5e-20", "1e30", "-2.2250738585072014e-8", "123456789012345678901234567890", "9007199254740993"} {
		if err := checkJSON("task_data", []byte(`{"n":`+n+`}`), true); err != nil {
			t.Errorf("%s: %v; want it accepted", n, err)
		}
	}
}
