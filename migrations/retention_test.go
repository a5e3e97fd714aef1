package migrations_test

import (
	"context"
	"testing"

	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/migrations"
)

// retentionIndexState reads the parent index's validity and how many
// partitions have their own index attached to it.
func retentionIndexState(t *testing.T, db *testdb.DB) (exists, valid bool, attached int) {
	t.Helper()
	err := db.Pool.QueryRow(context.Background(), `
SELECT to_regclass($1) IS NOT NULL,
       COALESCE((SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)), false),
       (SELECT count(*) FROM pg_inherits WHERE inhparent = to_regclass($1))`, migrations.RetentionIndexName).Scan(&exists, &valid, &attached)
	if err != nil {
		t.Fatal(err)
	}
	return exists, valid, attached
}

// TestRetentionIndex: both ways of building retention's index, in one
// statement (a small table) and online, partition by partition (a large
// one), end with a valid index on every partition; an online build
// interrupted after some partitions is finished by the next run; running
// it again changes nothing; a fleet's check refuses a missing or
// unfinished index with what to run. A database migrated before retention
// trimmed cancelled executions has the old index (terminal only): it is
// dropped once the new one is built. A regression leaves the index
// invalid (Postgres then never uses it: every retention tick reads every
// execution), fails on a second run, or leaves the old index behind (a
// second partial index every write of an ended execution pays for).
func TestRetentionIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tt := range []struct {
		name  string
		apply func(context.Context, *testdb.DB) error
	}{
		{"OneStatement", func(ctx context.Context, db *testdb.DB) error { return migrations.ApplyRetentionIndex(ctx, db.Pool) }},
		{"Online", func(ctx context.Context, db *testdb.DB) error {
			return migrations.ApplyRetentionIndexOnline(ctx, db.Pool)
		}},
		{"OnlineInterrupted", func(ctx context.Context, db *testdb.DB) error {
			// What a build stopped after five partitions leaves: the
			// parent ON ONLY (invalid), five partitions built and
			// attached, a sixth built but not attached.
			const cols = `(partition_key, terminal_at_ms) WHERE lifecycle_phase IN ('terminal', 'cancelled')`
			stmts := []string{`CREATE INDEX ` + migrations.RetentionIndexName + ` ON ONLY ff_exec_core ` + cols}
			for i := range 6 {
				idx := "ff_exec_core_p" + string(rune('0'+i)) + "_ffr_ended_idx"
				stmts = append(stmts, `CREATE INDEX `+idx+` ON ff_exec_core_p`+string(rune('0'+i))+` `+cols)
				if i < 5 {
					stmts = append(stmts, `ALTER INDEX `+migrations.RetentionIndexName+` ATTACH PARTITION `+idx)
				}
			}
			for _, s := range stmts {
				if _, err := db.Pool.Exec(ctx, s); err != nil {
					return err
				}
			}
			if err := migrations.CheckRetentionIndex(ctx, db.Pool); err == nil {
				t.Error("CheckRetentionIndex accepted an unfinished index")
			}
			return migrations.ApplyRetentionIndexOnline(ctx, db.Pool)
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// testdb's template has the index (as `worker migrate`
			// leaves a database); dropping it costs far less than
			// migrating an empty database (22 tables x 256 partitions).
			db := testdb.New(t)
			if _, err := db.Pool.Exec(ctx, `DROP INDEX `+migrations.RetentionIndexName); err != nil {
				t.Fatal(err)
			}
			if err := migrations.CheckRetentionIndex(ctx, db.Pool); err == nil {
				t.Error("CheckRetentionIndex accepted a missing index")
			}
			if _, err := db.Pool.Exec(ctx, `CREATE INDEX `+migrations.OldRetentionIndexName+
				` ON ff_exec_core (partition_key, terminal_at_ms) WHERE lifecycle_phase = 'terminal'`); err != nil {
				t.Fatal(err)
			}
			fftest.InsertExec(t, db.Pool, fftest.Terminal(3, 1000))
			if err := tt.apply(ctx, db); err != nil {
				t.Fatal(err)
			}
			if exists, valid, attached := retentionIndexState(t, db); !exists || !valid || attached != 256 {
				t.Fatalf("index exists %v, valid %v, on %d partitions; want a valid index on all 256", exists, valid, attached)
			}
			if err := migrations.CheckRetentionIndex(ctx, db.Pool); err != nil {
				t.Fatal(err)
			}
			if n := fftest.Count(t, db.Pool, `SELECT count(*) FROM pg_class WHERE relname = $1`, migrations.OldRetentionIndexName); n != 0 {
				t.Fatalf("the old index %s is still there", migrations.OldRetentionIndexName)
			}
			// Again: a no-op, whichever way it builds.
			for _, again := range []func(context.Context, *testdb.DB) error{
				func(ctx context.Context, db *testdb.DB) error { return migrations.ApplyRetentionIndex(ctx, db.Pool) },
				func(ctx context.Context, db *testdb.DB) error {
					return migrations.ApplyRetentionIndexOnline(ctx, db.Pool)
				},
			} {
				if err := again(ctx, db); err != nil {
					t.Fatalf("second run: %v", err)
				}
			}
			if _, valid, attached := retentionIndexState(t, db); !valid || attached != 256 {
				t.Fatalf("after a second run: valid %v on %d partitions", valid, attached)
			}
		})
	}
}
