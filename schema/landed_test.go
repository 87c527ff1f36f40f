package schema_test

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"

	"github.com/leasehold/leasehold/schema"
)

// landed are the first 16 hex digits of the SHA-256 of each migration's Up
// section as it landed on main, by version. A database that applied one
// never runs it again, so a migration that has landed must not change:
// what a release changes goes into a migration of its own. Add a version
// here once it has landed.
var landed = map[int64]string{
	1:  "f446c7cf7c852e53",
	2:  "5019050cb9f9a471",
	3:  "e4448b30216a1ae0",
	4:  "9e7606ac37975df3",
	5:  "d2f4df78d0091529",
	6:  "fb62e65dd13e192e",
	7:  "155c0d27ad207624",
	8:  "4eb5c1c864a2df0c",
	9:  "1ebc4aed26420d79",
	10: "4ebc832a8a70b924",
	11: "0538a0dda0955210",
	12: "6ece8e35a231edbe",
}

// TestLandedMigrationsUnchanged: the migrations that have landed are as
// they landed.
func TestLandedMigrationsUnchanged(t *testing.T) {
	ms, err := schema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, m := range ms {
		want, ok := landed[m.Version]
		if !ok {
			continue
		}
		seen++
		sum := sha256.Sum256([]byte(m.Up))
		if got := hex.EncodeToString(sum[:])[:16]; got != want {
			t.Errorf("migration %s: Up section %s, landed as %s: a database that applied it would not see the change; put the change in a new migration", m.Name, got, want)
		}
	}
	if seen != len(landed) {
		t.Errorf("%d of the %d landed migrations are embedded", seen, len(landed))
	}
}
