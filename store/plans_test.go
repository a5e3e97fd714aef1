package store

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/flowfabric/ffreconcile/internal/testdb"
)

// TestRowStatementsReadByKey: under the work pool's session settings
// (internal/fleet), every batched row statement reaches the rows of a small
// partition through an index of each table it reads, never by reading the
// partition whole, so a statement costs O(rows in its batch) whatever the
// partition holds. The partition here holds 800 rows, like the benchmark's
// (~860); with enable_seqscan on, Postgres reads it whole in each of these
// statements.
func TestRowStatementsReadByKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	const p = 7
	const now = int64(5_000_000)
	if _, err := db.Pool.Exec(ctx, `
		WITH ex AS (
			INSERT INTO ff_exec_core (partition_key, execution_id, lane_id, lifecycle_phase, ownership_state,
			       eligibility_state, public_state, attempt_state, created_at_ms, deadline_at_ms, raw_fields)
			SELECT $1, gen_random_uuid(), 'l', 'runnable', 'unowned', 'not_eligible_until_time', 'delayed',
			       'pending_retry_attempt', 1, $2 - g, '{}'::jsonb
			  FROM generate_series(1, 800) AS g
			RETURNING partition_key, execution_id
		), att AS (
			INSERT INTO ff_attempt (partition_key, execution_id, attempt_index, lease_epoch, lease_expires_at_ms)
			SELECT partition_key, execution_id, 0, 1, $2 - 1 FROM ex
		)
		INSERT INTO ff_suspension_current (partition_key, execution_id, suspension_id, suspended_at_ms, timeout_at_ms,
		       reason_code, condition, timeout_behavior)
		SELECT partition_key, execution_id, gen_random_uuid(), 1, $2 - 1, 'r', '{}'::jsonb, 'fail' FROM ex`,
		p, now); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `ANALYZE ff_exec_core, ff_attempt, ff_suspension_current`); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Pool.Query(ctx,
		`SELECT execution_id::text FROM ff_exec_core WHERE partition_key = $1 ORDER BY execution_id LIMIT 40`, p)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(ids) != 40 {
		t.Fatalf("ids: %d, %v", len(ids), err)
	}
	attempts := make([]int32, len(ids))

	tests := []struct {
		name string
		sql  string
		args []any
	}{
		{name: "ReleaseLeases", sql: releaseSQL, args: []any{p, ids, attempts, now}},
		{name: "ExpireSuspensions", sql: expireSuspensionSQL, args: []any{p, ids, now}},
		{name: "Promote", sql: promoteSQL, args: []any{p, ids, now}},
		{name: "CancelSiblings", sql: cancelSiblingsSQL, args: []any{p, ids, now, SiblingQuorumSatisfied}},
	}
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	// The work pool's settings (internal/fleet).
	for _, set := range []string{`SET plan_cache_mode = force_custom_plan`, `SET enable_seqscan = off`} {
		if _, err := conn.Exec(ctx, set); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rows, err := conn.Query(ctx, "EXPLAIN (COSTS OFF) "+tt.sql, tt.args...)
			if err != nil {
				t.Fatal(err)
			}
			lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				t.Fatal(err)
			}
			plan := strings.Join(lines, "\n")
			if strings.Contains(plan, "Seq Scan on ff_") {
				t.Errorf("a table of the partition is read whole:\n%s", plan)
			}
		})
	}
}
