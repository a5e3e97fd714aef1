package workers_test

import (
	"context"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/internal/fleettest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/store"
)

// TestTickEnqueuesScansOfDuePartitions: Set.Tick, outside River's periodic
// job, does what a tick job does: it enqueues one scan for each partition
// holding a due row (not for a partition whose rows fall due later), and a
// second tick adds none while those scans wait. The fleet is not started, so
// nothing runs the scans.
func TestTickEnqueuesScansOfDuePartitions(t *testing.T) {
	t.Parallel()
	for _, tt := range deadlineRows {
		t.Run(tt.r.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testdb.New(t)
			f, err := fleet.New(ctx, fleet.Config{DatabaseURL: db.URL, RiverSchema: testdb.RiverSchema,
				Reconcilers: fleettest.Fast(tt.r), Logger: fleettest.Logger(t)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(f.Close)

			now := store.NowMs()
			tt.insert(t, db.Pool, 3, now-1000)
			tt.insert(t, db.Pool, 7, now-5)
			tt.insert(t, db.Pool, 9, now+3_600_000)
			scanned := func() []int16 {
				t.Helper()
				rows, err := db.Pool.Query(ctx, `SELECT (args->>'partition')::smallint FROM river.river_job
					WHERE kind = $1 AND state = 'available' ORDER BY 1`, tt.scan(0).Kind())
				if err != nil {
					t.Fatal(err)
				}
				ps, err := pgx.CollectRows(rows, pgx.RowTo[int16])
				if err != nil {
					t.Fatal(err)
				}
				return ps
			}

			for i := range 2 {
				if err := f.Workers.Tick(ctx, f.Client, tt.r); err != nil {
					t.Fatalf("tick %d: %v", i+1, err)
				}
				if got := scanned(); !slices.Equal(got, []int16{3, 7}) {
					t.Fatalf("after tick %d: scans of partitions %v; want [3 7]", i+1, got)
				}
			}
			if c := f.Workers.Stats().For(tt.r.Name).Snapshot(); c.Ticks != 2 || c.Errors != 0 {
				t.Fatalf("stats %+v; want 2 ticks and no error", c)
			}

		})
	}
}
