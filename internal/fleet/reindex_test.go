package fleet_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

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
	fleettest.WaitFor(t, 135*time.Second, index+" rebuilt", func() (bool, string) {
		return oid() != before, fleettest.Statusf("oid %d unchanged", before)
	})
	// River goes on to its next index at once: a REINDEX CONCURRENTLY in
	// progress has an invalid transient index (<name>_ccnew) until it
	// swaps it in. Those are left out while a rebuild is running; an
	// invalid index that stays is what a failed rebuild leaves.
	fleettest.WaitFor(t, fleettest.Patient, "no invalid index left in "+testdb.RiverSchema, func() (bool, string) {
		var invalid []string
		rows, err := db.Pool.Query(ctx, `SELECT ic.relname FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid
			JOIN pg_namespace n ON n.oid = ic.relnamespace
			WHERE n.nspname = $1 AND NOT i.indisvalid
			  AND NOT (ic.relname ~ '_ccnew[0-9]*$' AND EXISTS (SELECT 1 FROM pg_stat_progress_create_index p
			           JOIN pg_database d ON d.oid = p.datid WHERE d.datname = current_database()))`, testdb.RiverSchema)
		if err == nil {
			invalid, err = pgx.CollectRows(rows, pgx.RowTo[string])
		}
		if err != nil {
			t.Fatal(err)
		}
		return len(invalid) == 0, fleettest.Statusf("invalid: %v", invalid)
	})
}
