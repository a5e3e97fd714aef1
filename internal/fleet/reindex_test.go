package fleet_test

import (
	"context"
	"testing"
	"time"

	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/internal/fleettest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
)

// TestRiverReindexesOnTheConfiguredInterval: with ReindexInterval set,
// River's reindexer rebuilds river_job's indexes on that interval (REINDEX
// CONCURRENTLY swaps in a new index under the old name, so the name's oid
// changes) and leaves no invalid index behind. A regression leaves River's
// daily schedule in place: the GIN index over the jobs' args then grows by
// every job inserted until midnight UTC (docs/performance.md, "The soak: what
// grows"), and here the oid never changes.
func TestRiverReindexesOnTheConfiguredInterval(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	const index = testdb.RiverSchema + ".river_job_args_index"
	oid := func() uint32 {
		t.Helper()
		var o uint32
		if err := db.Pool.QueryRow(ctx, `SELECT $1::regclass::oid`, index).Scan(&o); err != nil {
			t.Fatal(err)
		}
		return o
	}
	before := oid()
	fleettest.Start(t, db, fleet.Config{Reconcilers: map[string]time.Duration{}, ReindexInterval: 2 * time.Second})
	fleettest.WaitFor(t, 45*time.Second, index+" rebuilt", func() (bool, string) {
		return oid() != before, fleettest.Statusf("oid %d unchanged", before)
	})
	var invalid int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
		JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND NOT i.indisvalid`, testdb.RiverSchema).Scan(&invalid); err != nil {
		t.Fatal(err)
	}
	if invalid != 0 {
		t.Fatalf("%d invalid indexes in %s after the reindex; want none", invalid, testdb.RiverSchema)
	}
}
