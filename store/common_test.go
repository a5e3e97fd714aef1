package store_test

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"

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

// waitForLockWait waits until a backend of the test's own database waits on
// a lock while running a statement that mentions table.
func waitForLockWait(t *testing.T, db store.DB, table string) {
	t.Helper()
	fftest.WaitForLockWait(t, db, table)
}
