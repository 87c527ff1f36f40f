package leasestore_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/leasehold/leasehold/internal/db"
	"github.com/leasehold/leasehold/internal/lab/pgtest"
)

// TestRenewReadsOneLease: with statistics taken while the table was empty (a deployment's
// first ANALYZE) and 5,000 live leases since, a renewal finds its lease by the resource's
// key and reads that one entry, not the reaper's index of every live lease. Its counts are
// the transaction's own statistics.
func TestRenewReadsOneLease(t *testing.T) {
	t.Parallel()
	pdb := pgtest.New(t)
	ctx := context.Background()
	if _, err := pdb.Pool.Exec(ctx, `ANALYZE leases`); err != nil {
		t.Fatal(err)
	}
	if _, err := pdb.Pool.Exec(ctx, `INSERT INTO leases (resource, holder, fence, ttl_seconds, expires_at)
		SELECT 'r' || i, 'h', nextval('lease_fence_seq'), 60, now() + interval '1 hour' FROM generate_series(1, 5000) AS i`); err != nil {
		t.Fatal(err)
	}
	tx, err := pdb.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read only what it counted
	const renewals = 10
	var params []db.LeaseRenewParams
	for i := range renewals {
		params = append(params, db.LeaseRenewParams{Resource: fmt.Sprintf("r%d", 1+i*499), Holder: "h"})
	}
	renewed := 0
	db.New(tx).LeaseRenew(ctx, params).QueryRow(func(_ int, _ db.Lease, err error) {
		if err != nil {
			t.Error(err)
			return
		}
		renewed++
	})
	if renewed != renewals {
		t.Fatalf("renewed %d of %d live leases", renewed, renewals)
	}
	var reaperScans, keyRead, seqScans int64
	if err := tx.QueryRow(ctx, `SELECT pg_stat_get_xact_numscans('leases_unannounced_idx'::regclass),
		pg_stat_get_xact_tuples_returned('leases_resource_key'::regclass), pg_stat_get_xact_numscans('leases'::regclass)`).
		Scan(&reaperScans, &keyRead, &seqScans); err != nil {
		t.Fatal(err)
	}
	if reaperScans != 0 || seqScans != 0 || keyRead != renewals {
		t.Errorf("%d renewals: %d scans of leases_unannounced_idx, %d sequential scans, %d entries of leases_resource_key read; want 0, 0 and %d",
			renewals, reaperScans, seqScans, keyRead, renewals)
	}
}
