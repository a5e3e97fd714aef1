package migrations_test

import (
	"context"
	"strings"
	"testing"

	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/migrations"
)

// TestApplyFFOnAMigratedDatabaseIsNoop runs ApplyFF on a database ApplyFF
// already migrated (a clone of testdb's template, which ApplyFF built): it
// must create nothing, fail on nothing, and leave an operator's change to a
// table alone. A regression shows as a table reported created, an error on
// an existing one, or the marked table's comment gone.
func TestApplyFFOnAMigratedDatabaseIsNoop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)

	// Mark a table the way an operator's change would look; ApplyFF must
	// neither fail nor touch it.
	if _, err := db.Pool.Exec(ctx, `COMMENT ON TABLE ff_attempt IS 'owned by flowfabric'`); err != nil {
		t.Fatal(err)
	}
	res, err := migrations.ApplyFF(ctx, db.Pool)
	if err != nil {
		t.Fatalf("ApplyFF on a migrated database: %v", err)
	}
	if all := len(migrations.FFTableNames()); len(res.Created) != 0 || len(res.Existed) != all {
		t.Fatalf("ApplyFF on a migrated database: created %v, existed %v; want none created, all %d existing", res.Created, res.Existed, all)
	}
	var comment string
	if err := db.Pool.QueryRow(ctx, `SELECT obj_description('ff_attempt'::regclass, 'pg_class')`).Scan(&comment); err != nil {
		t.Fatal(err)
	}
	if comment != "owned by flowfabric" {
		t.Fatalf("ApplyFF altered ff_attempt (comment %q)", comment)
	}
	if err := migrations.Check(ctx, db.Pool, testdb.RiverSchema); err != nil {
		t.Fatalf("Check after ApplyFF: %v", err)
	}
}

// TestCheckNamesWhatIsMissing checks an empty database (Check names every
// missing table), migrates it from nothing (ApplyFF creates every table,
// each with its 256 hash partitions, and Check passes), then drops a column
// (Check names it). It is the suite's one ApplyFF on an empty database
// besides testdb's template: the DDL of 22 tables x 256 partitions costs
// seconds of the server's CPU, which the 2-core machine shares with every
// other test. A regression shows as a missing table or column not named, or
// a table not created.
func TestCheckNamesWhatIsMissing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.NewEmpty(t)

	err := migrations.Check(ctx, db.Pool, testdb.RiverSchema)
	if err == nil {
		t.Fatal("Check on an empty database: want error")
	}
	for _, name := range migrations.FFTableNames() {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("error %q does not name missing table %s", err, name)
		}
	}

	res, err := migrations.ApplyFF(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if all := len(migrations.FFTableNames()); len(res.Created) != all || len(res.Existed) != 0 {
		t.Fatalf("ApplyFF on an empty database: created %v, existed %v; want all %d created", res.Created, res.Existed, all)
	}
	var children int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_inherits WHERE inhparent = 'ff_attempt'::regclass`).Scan(&children); err != nil {
		t.Fatal(err)
	}
	if children != jobs.PartitionCount {
		t.Fatalf("ff_attempt has %d partitions, want %d", children, jobs.PartitionCount)
	}
	if err := migrations.Check(ctx, db.Pool, testdb.RiverSchema); err != nil {
		t.Fatalf("Check after ApplyFF: %v", err)
	}

	if _, err := db.Pool.Exec(ctx, `ALTER TABLE ff_attempt DROP COLUMN outcome`); err != nil {
		t.Fatal(err)
	}
	err = migrations.Check(ctx, db.Pool, testdb.RiverSchema)
	if err == nil || !strings.Contains(err.Error(), "missing columns: ff_attempt.outcome") {
		t.Fatalf("Check with a dropped column = %v; want it to name ff_attempt.outcome", err)
	}
}

func TestApplyRiverIdempotentAndValidatesSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.NewEmpty(t)

	if _, err := migrations.ApplyRiver(ctx, db.Pool, "river; DROP TABLE x", nil); err == nil ||
		!strings.Contains(err.Error(), "invalid River schema name") {
		t.Fatalf("ApplyRiver with a hostile schema name = %v; want validation error", err)
	}
	v, err := migrations.ApplyRiver(ctx, db.Pool, "river_q", nil)
	if err != nil || len(v) == 0 {
		t.Fatalf("first ApplyRiver = %v, %v; want versions applied", v, err)
	}
	v, err = migrations.ApplyRiver(ctx, db.Pool, "river_q", nil)
	if err != nil || len(v) != 0 {
		t.Fatalf("second ApplyRiver = %v, %v; want no-op", v, err)
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'river_q' AND tablename = 'river_job'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("river_job in schema river_q: %d, %v", n, err)
	}
}
