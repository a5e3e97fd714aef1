package migrations_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/migrations"
)

func TestApplyWorkerTableIdempotentAndValidatesSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.NewEmpty(t)

	if err := migrations.ApplyWorkerTable(ctx, db.Pool, `river"; DROP TABLE x; --`); err == nil ||
		!strings.Contains(err.Error(), "invalid River schema name") {
		t.Fatalf("ApplyWorkerTable with a hostile schema name = %v; want validation error", err)
	}

	// Concurrent first runs (two `worker migrate` at once) must both
	// succeed: the advisory lock makes the second find the table.
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Go(func() { errs[i] = migrations.ApplyWorkerTable(ctx, db.Pool, "river_w") })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("concurrent ApplyWorkerTable %d: %v", i, err)
		}
	}

	var cols string
	err := db.Pool.QueryRow(ctx, `
		SELECT string_agg(column_name || ' ' || data_type || ' ' || is_nullable, ', ' ORDER BY ordinal_position)
		  FROM information_schema.columns WHERE table_schema = 'river_w' AND table_name = $1`,
		migrations.WorkerTableName).Scan(&cols)
	if err != nil {
		t.Fatal(err)
	}
	const want = "client_id text NO, hostname text NO, pid integer NO, version text YES, " +
		"started_at timestamp with time zone NO, heartbeat_at timestamp with time zone NO, config jsonb YES, conn_tag text YES"
	if cols != want {
		t.Fatalf("columns:\n got %s\nwant %s", cols, want)
	}

	// A second run leaves an existing table, and its rows, alone.
	if _, err := db.Pool.Exec(ctx, `INSERT INTO river_w.ffreconcile_worker VALUES ('c1', 'h', 1, NULL, now(), now(), NULL, NULL)`); err != nil {
		t.Fatal(err)
	}
	if err := migrations.ApplyWorkerTable(ctx, db.Pool, "river_w"); err != nil {
		t.Fatalf("second ApplyWorkerTable: %v", err)
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM river_w.ffreconcile_worker`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("rows after second run: %d, %v; want 1", n, err)
	}

	// A table of an earlier version, without config and conn_tag, gains
	// the columns and keeps its rows.
	if _, err := db.Pool.Exec(ctx, `ALTER TABLE river_w.ffreconcile_worker DROP COLUMN config, DROP COLUMN conn_tag`); err != nil {
		t.Fatal(err)
	}
	if err := migrations.ApplyWorkerTable(ctx, db.Pool, "river_w"); err != nil {
		t.Fatalf("ApplyWorkerTable on an earlier version's table: %v", err)
	}
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM river_w.ffreconcile_worker WHERE config IS NULL AND conn_tag IS NULL`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("rows after adding config and conn_tag: %d, %v; want 1", n, err)
	}
}
