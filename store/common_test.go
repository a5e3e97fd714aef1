package store_test

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/store"
)

// jsonEqual compares two decoded JSON values.
func jsonEqual(a, b any) bool {
	switch av := a.(type) {
	case map[string]any:
		bv, ok := b.(map[string]any)
		return ok && maps.EqualFunc(av, bv, jsonEqual)
	case []any:
		bv, ok := b.([]any)
		return ok && slices.EqualFunc(av, bv, jsonEqual)
	default:
		return a == b
	}
}

// explainDB runs every query it is given as EXPLAIN, keeps the plan and
// returns no rows, so a test can see the plan of a store function's exact SQL
// with its exact parameters.
type explainDB struct {
	store.DB
	plans []string
}

func (d *explainDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	rows, err := d.DB.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS OFF, TIMING OFF, SUMMARY OFF) "+sql, args...)
	if err != nil {
		return nil, err
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	d.plans = append(d.plans, strings.Join(lines, "\n"))
	return d.DB.Query(ctx, `SELECT NULL::text, NULL::bigint WHERE false`)
}

func (d *explainDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return d.DB.Exec(ctx, sql, args...)
}

// waitForLockWait waits until some backend is waiting on a row lock while
// running a statement that mentions table.
func waitForLockWait(t *testing.T, db store.DB, table string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := fftest.Count(t, db, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'
			  AND query LIKE '%' || $1 || '%'`, table)
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no statement on %s ever waited on a row lock", table)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
