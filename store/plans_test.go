package store

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flowfabric/ffreconcile/internal/testdb"
)

// TestRowStatementsReadByKey: under the work pool's session settings
// (internal/fleet), every batched row statement reads O(rows in its batch)
// of each table, whatever the partition holds: EXPLAIN ANALYZE (rolled
// back) counts the rows each scan of an ff_ table returned or filtered out,
// and a batch of 40 may read at most 3 per row (a table read twice, as a
// statement's CTEs do, plus slack). The partition holds 10,000 rows of each
// kind: at the benchmark's ~860 rows a partition is 19 pages and Postgres
// rightly reads it whole rather than probe 40 keys, so a smaller seed would
// pin nothing. A regression, a statement whose key condition no index can
// use (a cast on the key, an OR across tables), or a retention index that
// does not cover cancelled executions, reads the 10,000.
func TestRowStatementsReadByKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	const p = 7
	const now = int64(5_000_000)
	const batch = 40
	const partitionRows = 10_000
	if _, err := db.Pool.Exec(ctx, `
		WITH ex AS (
			INSERT INTO ff_exec_core (partition_key, execution_id, lane_id, lifecycle_phase, ownership_state,
			       eligibility_state, public_state, attempt_state, created_at_ms, deadline_at_ms, raw_fields)
			SELECT $1, gen_random_uuid(), 'l', 'runnable', 'unowned', 'not_eligible_until_time', 'delayed',
			       'pending_retry_attempt', 1, $2 - g, '{}'::jsonb
			  FROM generate_series(1, $3::int) AS g
			RETURNING partition_key, execution_id
		), att AS (
			INSERT INTO ff_attempt (partition_key, execution_id, attempt_index, lease_epoch, lease_expires_at_ms)
			SELECT partition_key, execution_id, 0, 1, $2 - 1 FROM ex
		), wp AS (
			INSERT INTO ff_waitpoint_pending (partition_key, waitpoint_id, execution_id, token_kid, token, created_at_ms,
			       expires_at_ms, waitpoint_key)
			SELECT partition_key, gen_random_uuid(), execution_id, 'kid', 'token', 1, $2 - 1, 'wpk:' || execution_id FROM ex
		)
		INSERT INTO ff_suspension_current (partition_key, execution_id, suspension_id, suspended_at_ms, timeout_at_ms,
		       reason_code, condition, timeout_behavior)
		SELECT partition_key, execution_id, gen_random_uuid(), 1, $2 - 1, 'r', '{}'::jsonb, 'fail' FROM ex`,
		p, now, partitionRows); err != nil {
		t.Fatal(err)
	}
	// As many active executions past their deadline, each with its
	// current attempt: the rows the deadline statements act on.
	if _, err := db.Pool.Exec(ctx, `
		WITH ex AS (
			INSERT INTO ff_exec_core (partition_key, execution_id, lane_id, lifecycle_phase, ownership_state,
			       eligibility_state, public_state, attempt_state, attempt_index, created_at_ms, deadline_at_ms, raw_fields)
			SELECT $1, gen_random_uuid(), 'l', 'active', 'leased', 'not_applicable', 'running',
			       'running_attempt', 0, 1, $2 - g, '{}'::jsonb
			  FROM generate_series(1, $3::int) AS g
			RETURNING partition_key, execution_id
		)
		INSERT INTO ff_attempt (partition_key, execution_id, attempt_index, lease_epoch, lease_expires_at_ms)
		SELECT partition_key, execution_id, 0, 1, $2 + 60000 FROM ex`,
		p, now, partitionRows); err != nil {
		t.Fatal(err)
	}
	// As many ended executions past retention, half terminal and half
	// cancelled (FlowFabric's Postgres cancels' phase): the rows a trim
	// deletes through the retention index, which covers both phases.
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO ff_exec_core (partition_key, execution_id, lane_id, lifecycle_phase, ownership_state,
		       eligibility_state, public_state, attempt_state, created_at_ms, terminal_at_ms, raw_fields)
		SELECT $1, gen_random_uuid(), 'l', CASE WHEN g % 2 = 0 THEN 'terminal' ELSE 'cancelled' END, 'unowned', 'not_applicable',
		       CASE WHEN g % 2 = 0 THEN 'completed' ELSE 'cancelled' END, 'attempt_terminal', 1, $2 - g, '{}'::jsonb
		  FROM generate_series(1, $3::int) AS g`, p, now, partitionRows); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `ANALYZE ff_exec_core, ff_attempt, ff_suspension_current, ff_waitpoint_pending`); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Pool.Query(ctx,
		`SELECT execution_id::text FROM ff_exec_core
		 WHERE partition_key = $1 AND lifecycle_phase = 'runnable' ORDER BY execution_id LIMIT $2`, p, batch)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(ids) != batch {
		t.Fatalf("ids: %d, %v", len(ids), err)
	}
	rows, err = db.Pool.Query(ctx, `SELECT execution_id::text FROM ff_exec_core
		 WHERE partition_key = $1 AND lifecycle_phase = 'active' ORDER BY execution_id LIMIT $2`, p, batch)
	if err != nil {
		t.Fatal(err)
	}
	active, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(active) != batch {
		t.Fatalf("active ids: %d, %v", len(active), err)
	}
	attempts := make([]int32, len(ids))
	rows, err = db.Pool.Query(ctx,
		`SELECT waitpoint_id::text FROM ff_waitpoint_pending WHERE partition_key = $1 ORDER BY waitpoint_id LIMIT $2`, p, batch)
	if err != nil {
		t.Fatal(err)
	}
	waitpoints, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(waitpoints) != batch {
		t.Fatalf("waitpoints: %d, %v", len(waitpoints), err)
	}
	// Budgets (two usage rows each) and worker registrations of the
	// partition, all due.
	if _, err := db.Pool.Exec(ctx, `
		WITH b AS (
			INSERT INTO ff_budget_policy (partition_key, budget_id, policy_json, created_at_ms, updated_at_ms, next_reset_at_ms)
			SELECT $1, 'budget-' || g, '{"reset_interval_ms": 60000}'::jsonb, 1, 1, $2 - g FROM generate_series(1, $3::int) AS g
			RETURNING partition_key, budget_id
		), u AS (
			INSERT INTO ff_budget_usage (partition_key, budget_id, dimensions_key, current_value, updated_at_ms)
			SELECT b.partition_key, b.budget_id, d.d, 5, 1 FROM b CROSS JOIN (VALUES ('tokens'), ('requests')) AS d(d)
		)
		INSERT INTO ff_worker_registry (partition_key, namespace, worker_instance_id, worker_id, lanes, capabilities_csv,
		       last_heartbeat_ms, liveness_ttl_ms, registered_at_ms)
		SELECT $1, 'ns', 'inst-' || g, 'worker', '{default}', '', $2 - 60000 - g, 30000, 1 FROM generate_series(1, $3::int) AS g`,
		p, now, partitionRows); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `ANALYZE ff_budget_policy, ff_budget_usage, ff_worker_registry`); err != nil {
		t.Fatal(err)
	}
	var budgetIDs, workerNamespaces, workerIDs []string
	if err := db.Pool.QueryRow(ctx, `
		SELECT (SELECT array_agg(budget_id ORDER BY budget_id) FROM (SELECT budget_id FROM ff_budget_policy
		          WHERE partition_key = $1 ORDER BY budget_id LIMIT $2) b),
		       (SELECT array_agg(namespace ORDER BY worker_instance_id) FROM (SELECT namespace, worker_instance_id
		          FROM ff_worker_registry WHERE partition_key = $1 ORDER BY worker_instance_id LIMIT $2) w),
		       (SELECT array_agg(worker_instance_id ORDER BY worker_instance_id) FROM (SELECT worker_instance_id
		          FROM ff_worker_registry WHERE partition_key = $1 ORDER BY worker_instance_id LIMIT $2) w)`, p, batch).
		Scan(&budgetIDs, &workerNamespaces, &workerIDs); err != nil || len(budgetIDs) != batch || len(workerIDs) != batch {
		t.Fatalf("budgets: %d, workers: %d, %v", len(budgetIDs), len(workerIDs), err)
	}

	// An expired grant of every runnable execution, and quota policies
	// (each with an expired admission and a window row older than its
	// window) and dedup keys as many, all due.
	if _, err := db.Pool.Exec(ctx, `
		WITH g AS (
			INSERT INTO ff_claim_grant (partition_key, grant_id, execution_id, kind, worker_id, worker_instance_id,
			       grant_ttl_ms, issued_at_ms, expires_at_ms)
			SELECT partition_key, sha256(execution_id::text::bytea), execution_id, 'claim', 'w', 'w-i', 1000, $2 - 2000, $2 - 1000
			  FROM ff_exec_core WHERE partition_key = $1 AND lifecycle_phase = 'runnable'
		), q AS (
			INSERT INTO ff_quota_policy (partition_key, quota_policy_id, requests_per_window_seconds, max_requests_per_window,
			       active_concurrency_cap, active_concurrency, created_at_ms, updated_at_ms)
			SELECT $1, 'qp-' || g, 60, 10, 5, 2, 1, 1 FROM generate_series(1, $3::int) AS g
		), a AS (
			INSERT INTO ff_quota_admitted (partition_key, quota_policy_id, execution_id, admitted_at_ms, expires_at_ms)
			SELECT $1, 'qp-' || g, '{fp:1}:' || g, $2 - 70000, $2 - 10000 FROM generate_series(1, $3::int) AS g
		), w AS (
			INSERT INTO ff_quota_window (partition_key, quota_policy_id, dimension, admitted_at_ms, execution_id)
			SELECT $1, 'qp-' || g, '', $2 - 70000, '{fp:1}:' || g FROM generate_series(1, $3::int) AS g
		)
		INSERT INTO ff_budget_usage_dedup (partition_key, dedup_key, outcome_json, applied_at_ms, expires_at_ms)
		SELECT $1, 'dedup-' || g, '{}'::jsonb, 1, $2 - g FROM generate_series(1, $3::int) AS g`,
		p, now, partitionRows); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `ANALYZE ff_claim_grant, ff_quota_policy, ff_quota_admitted, ff_quota_window, ff_budget_usage_dedup`); err != nil {
		t.Fatal(err)
	}
	var grants, policies, admitted, dedupKeys []string
	if err := db.Pool.QueryRow(ctx, `
		SELECT (SELECT array_agg(encode(grant_id, 'hex') ORDER BY grant_id) FROM (SELECT grant_id FROM ff_claim_grant
		          WHERE partition_key = $1 ORDER BY grant_id LIMIT $2) g),
		       (SELECT array_agg(quota_policy_id ORDER BY quota_policy_id) FROM (SELECT quota_policy_id FROM ff_quota_admitted
		          WHERE partition_key = $1 ORDER BY quota_policy_id LIMIT $2) a),
		       (SELECT array_agg(execution_id ORDER BY quota_policy_id) FROM (SELECT quota_policy_id, execution_id FROM ff_quota_admitted
		          WHERE partition_key = $1 ORDER BY quota_policy_id LIMIT $2) a),
		       (SELECT array_agg(dedup_key ORDER BY dedup_key) FROM (SELECT dedup_key FROM ff_budget_usage_dedup
		          WHERE partition_key = $1 ORDER BY dedup_key LIMIT $2) d)`, p, batch).
		Scan(&grants, &policies, &admitted, &dedupKeys); err != nil || len(grants) != batch || len(policies) != batch || len(dedupKeys) != batch {
		t.Fatalf("grants: %d, policies: %d, dedup keys: %d, %v", len(grants), len(policies), len(dedupKeys), err)
	}

	// A partition of flows for the dependency dispatch (a partition of
	// its own, whose completion events no other statement here reads):
	// each of partitionRows upstreams with an edge into a group of its own
	// whose downstream is blocked, and a completion event each, half of
	// them dispatched.
	const dp = p + 1
	if _, err := db.Pool.Exec(ctx, `
		WITH d AS (
			SELECT gen_random_uuid() AS down, gen_random_uuid() AS flow, gen_random_uuid() AS up, g
			  FROM generate_series(1, $2::int) AS g
		), dx AS (
			INSERT INTO ff_exec_core (partition_key, execution_id, flow_id, lane_id, lifecycle_phase, ownership_state,
			       eligibility_state, public_state, attempt_state, created_at_ms)
			SELECT $1, down, flow, 'l', 'blocked', 'unowned', 'blocked_by_dependencies', 'waiting', 'pending', 1 FROM d
		), ed AS (
			INSERT INTO ff_edge (partition_key, flow_id, edge_id, upstream_eid, downstream_eid, policy)
			SELECT $1, flow, gen_random_uuid(), up, down, '{"kind": "all_of"}' FROM d
		), gr AS (
			INSERT INTO ff_edge_group (partition_key, flow_id, downstream_eid, policy, running_count)
			SELECT $1, flow, down, '{"kind": "all_of"}', 1 FROM d
		)
		INSERT INTO ff_completion_event (partition_key, execution_id, flow_id, outcome, occurred_at_ms, committed_at_ms,
		       dispatched_at_ms)
		SELECT $1, up, flow, 'success', 1, 1, CASE WHEN g % 2 = 0 THEN 1 END FROM d`, dp, partitionRows); err != nil {
		t.Fatal(err)
	}
	// As autovacuum would after such an insert: without it, the planner
	// takes the partition for nearly empty and reads it whole.
	if _, err := db.Pool.Exec(ctx, `ANALYZE ff_exec_core, ff_edge, ff_edge_group, ff_completion_event`); err != nil {
		t.Fatal(err)
	}
	var events []int64
	var depFlows, depDowns []string
	if err := db.Pool.QueryRow(ctx, `
		SELECT array_agg(c.event_id ORDER BY c.event_id), array_agg(e.flow_id::text ORDER BY c.event_id),
		       array_agg(e.downstream_eid::text ORDER BY c.event_id)
		  FROM (SELECT * FROM ff_completion_event WHERE partition_key = $1 AND dispatched_at_ms IS NULL ORDER BY event_id LIMIT $2) c
		  JOIN ff_edge e ON e.partition_key = $1 AND e.flow_id = c.flow_id AND e.upstream_eid = c.execution_id`, dp, batch).
		Scan(&events, &depFlows, &depDowns); err != nil || len(events) != batch || len(depDowns) != batch {
		t.Fatalf("completion events: %d, %v", len(events), err)
	}
	decisions := make([]int32, len(depDowns))
	for i := range decisions {
		decisions[i] = int32(Satisfied + Decision(i%2))
	}

	type statement struct {
		name string
		sql  string
		args []any
		// byPartition are tables the statement reads a partition of on
		// purpose, documented where it is built (retention's text-keyed
		// siblings, which no index of FlowFabric's leads with
		// execution_id).
		byPartition []string
	}
	tests := []statement{
		{name: "CancelSiblings", sql: cancelSiblingsSQL, args: []any{p, ids, now, SiblingQuorumSatisfied}},
		{name: "LockDeadlineExecutions", sql: lockDeadlineExecutionsSQL, args: []any{p, active}},
		{name: "LockWaitpoints", sql: lockWaitpointsSQL, args: []any{p, waitpoints}},
		// ResetBudgets runs it in a SERIALIZABLE transaction; its plan is
		// the same outside one.
		{name: "ResetBudgets", sql: resetBudgetsSQL, args: []any{p, budgetIDs, now}},
		{name: "SweepWorkers", sql: sweepWorkersSQL, args: []any{p, workerNamespaces, workerIDs, now}},
		{name: "LockClaimGrantExecutions", sql: lockClaimGrantExecsSQL, args: []any{p, grants}},
		{name: "SweepQuota", sql: sweepQuotaSQL, args: []any{p, policies, admitted, now}},
		{name: "LockQuotaPolicies", sql: lockQuotaPoliciesSQL, args: []any{p, policies}},
		{name: "RecountQuota", sql: recountQuotaSQL, args: []any{p, policies, now}},
		{name: "DeleteBudgetDedupKeys", sql: deleteBudgetDedupKeysSQL, args: []any{p, dedupKeys, now}},
		// The cancel backlog's cancel of a header's live members (locked
		// and filtered before it), here active with their attempts.
		{name: "CancelBacklogMembers", sql: cancelBacklogMembersSQL, args: []any{p, active, now, "reason", BacklogCancelSource}},
		// The dependency dispatch of a batch of the partition's events.
		// The claim reads the partition's undispatched events through
		// ff_completion_event_pending_dispatch_idx (see claimSQL).
		{name: "ClaimCompletions", sql: fmt.Sprintf(claimSQL, ""), args: []any{dp, events, now}, byPartition: []string{"ff_completion_event"}},
		{name: "LockEdgeGroups", sql: lockGroupsSQL, args: []any{dp, depFlows, depDowns}},
		// The writes of a batch's decided downstreams: made eligible, or
		// decided (half satisfied, half impossible, with their skip
		// events).
		{name: "EligibleDownstreams", sql: eligibleSQL, args: []any{dp, depDowns}},
		{name: "DecidedDownstreams", sql: decidedSQL, args: []any{dp, depDowns, decisions, depFlows, now}},
	}
	// Retention's trim of a batch of the partition's 10,000 ended
	// executions, terminal and cancelled: its doomed CTE reads the
	// retention index, which covers both phases (the text sibling tables,
	// empty here, are read by partition once a batch). Unfiltered only: a
	// tenant filter is not indexed, and a filter no ended execution passes
	// reads them all, as every scan's does.
	{
		sql, args := trimSQL(Filter{})
		args[0], args[1], args[2] = p, now, batch
		tests = append(tests, statement{"TrimExecutions", sql, args, RetentionSiblingTables.Text})
	}
	// Statements that re-check the tenant filter, without one and with
	// one (its EXISTS probe of the execution must stay a key lookup).
	for _, tt := range []statement{
		{name: "ReleaseLeases", sql: releaseSQL, args: []any{p, ids, attempts, now}},
		{name: "ExpireAttempts", sql: expireAttemptsSQL, args: []any{p, active, attempts, now}},
		{name: "ExpireSuspensions", sql: expireSuspensionSQL, args: []any{p, ids, now}},
		{name: "Promote", sql: promoteSQL, args: []any{p, ids, now}},
		{name: "ExpireDeadlines", sql: expireDeadlinesSQL, args: []any{p, active, now}},
		{name: "CloseWaitpoints", sql: closeWaitpointsSQL, args: []any{p, waitpoints, now}},
		{name: "ExpireClaimGrants", sql: expireClaimGrantsSQL, args: []any{p, grants, now}},
	} {
		tests = append(tests,
			statement{name: tt.name, sql: tt.sql, args: append(tt.args, Filter{}.args()...)},
			statement{name: tt.name + "/Filtered", sql: tt.sql, args: append(slices.Clip(tt.args), Filter{Namespace: "ns", TagKey: "k", TagValue: "v"}.args()...)})
	}
	// The work pool's settings (internal/fleet).
	conn := sessionConn(t, db.Pool, "force_custom_plan")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// EXPLAIN ANALYZE runs the statement: in a transaction rolled
			// back, so each case sees the seeded rows.
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			var plan []map[string]any
			if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+tt.sql, tt.args...).Scan(&plan); err != nil {
				t.Fatal(err)
			}
			for rel, n := range rowsRead(plan[0]["Plan"].(map[string]any)) {
				t.Logf("%s: %d rows read", rel, n)
				if n > 3*batch && !slices.Contains(tt.byPartition, rel) {
					t.Errorf("%d rows of %s read for a batch of %d: the statement reads the partition, not its batch", n, rel, batch)
				}
			}
		})
	}

	// The dispatch statements as a fleet's dispatch lanes run them: naming
	// the partition's leaves, with a generic plan (PREPARE, then EXPLAIN
	// EXECUTE: the plan a lane caches). A generic plan cannot see the
	// batch's size or keys, so one that reads the partition would cost
	// O(partition) at every single event.
	lv, err := LoadLeaves(ctx, db.Pool, DispatchTables...)
	if err != nil {
		t.Fatal(err)
	}
	// A dispatch lane's settings (internal/fleet).
	lane := sessionConn(t, db.Pool, "force_generic_plan")
	hop := []any{int16(dp), depFlows[0], depDowns[0], int32(1), int32(0), int32(0), int32(0)}
	for _, tt := range []statement{
		{name: "ClaimCompletion", sql: fmt.Sprintf(claimSQL, ""), args: []any{int16(dp), events[:1], now}},
		{name: "ClaimCompletions", sql: fmt.Sprintf(claimSQL, ""), args: []any{int16(dp), events, now}},
		{name: "LockEdgeGroup", sql: lockGroupSQL, args: hop[:3]},
		{name: "LockEdgeGroups", sql: lockGroupsSQL, args: []any{int16(dp), depFlows, depDowns}},
		{name: "HopPending", sql: hopPendingSQL, args: hop},
		{name: "HopSatisfied", sql: hopSatisfiedSQL, args: hop},
		{name: "HopSatisfiedCancel", sql: hopSatisfiedCancelSQL, args: append(slices.Clip(hop), now, depFlows[1])},
		{name: "HopImpossible", sql: hopImpossibleSQL, args: append(slices.Clip(hop), now)},
		{name: "EligibleDownstreams", sql: eligibleSQL, args: []any{int16(dp), depDowns}},
		{name: "DecidedDownstreams", sql: decidedSQL, args: []any{int16(dp), depDowns, decisions, depFlows, now}},
	} {
		t.Run("Leaves/"+tt.name, func(t *testing.T) {
			// A prepared statement outlives a rollback: deallocated after.
			if _, err := lane.Exec(ctx, "PREPARE leaf_statement AS "+lv.sql(tt.sql, dp)); err != nil {
				t.Fatal(err)
			}
			defer lane.Exec(ctx, "DEALLOCATE leaf_statement")
			tx, err := lane.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			// EXECUTE takes no parameters of the outer statement: the
			// arguments as literals, which the prepared types coerce.
			literals := make([]string, len(tt.args))
			for i, a := range tt.args {
				literals[i] = sqlLiteral(t, a)
			}
			var plan []map[string]any
			if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE leaf_statement("+strings.Join(literals, ", ")+")").Scan(&plan); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(fmt.Sprint(plan), "$1") {
				t.Errorf("not a generic plan (no parameter in it): %v", plan)
			}
			for rel, n := range rowsRead(plan[0]["Plan"].(map[string]any)) {
				t.Logf("%s: %d rows read", rel, n)
				if n > 3*batch {
					t.Errorf("%d rows of %s read for a batch of at most %d: the generic plan reads the partition, not its keys", n, rel, batch)
				}
			}
		})
	}
}

// sessionConn acquires a connection of pool for the rest of the test and
// gives it a fleet pool's session settings: planCacheMode, enable_seqscan
// off.
func sessionConn(t *testing.T, pool *pgxpool.Pool, planCacheMode string) *pgxpool.Conn {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Release)
	for _, set := range []string{`SET plan_cache_mode = ` + planCacheMode, `SET enable_seqscan = off`} {
		if _, err := conn.Exec(ctx, set); err != nil {
			t.Fatal(err)
		}
	}
	return conn
}

// sqlLiteral writes a statement argument as an untyped SQL literal.
func sqlLiteral(t *testing.T, a any) string {
	t.Helper()
	quote := func(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
	switch v := a.(type) {
	case int16, int32, int64, int:
		return fmt.Sprint(v)
	case string:
		return quote(v)
	case []int64, []int32:
		return quote(strings.NewReplacer("[", "{", "]", "}", " ", ",").Replace(fmt.Sprint(v)))
	case []string:
		return quote("{" + strings.Join(v, ",") + "}")
	}
	t.Fatalf("no literal for %T", a)
	return ""
}

// childSuffix is a hash partition's suffix (ff_attempt_p007).
var childSuffix = regexp.MustCompile(`_p[0-9]+$`)

// rowsRead sums, per ff_ relation, the rows its scan nodes returned or
// removed by a filter, over all loops: what the statement read of it.
func rowsRead(node map[string]any) map[string]int {
	out := map[string]int{}
	var walk func(n map[string]any)
	walk = func(n map[string]any) {
		if rel, ok := n["Relation Name"].(string); ok && strings.HasPrefix(rel, "ff_") && strings.Contains(n["Node Type"].(string), "Scan") {
			num := func(k string) float64 { v, _ := n[k].(float64); return v }
			loops := max(num("Actual Loops"), 1)
			out[childSuffix.ReplaceAllString(rel, "")] += int((num("Actual Rows") + num("Rows Removed by Filter") + num("Rows Removed by Index Recheck")) * loops)
		}
		if kids, ok := n["Plans"].([]any); ok {
			for _, k := range kids {
				walk(k.(map[string]any))
			}
		}
	}
	walk(node)
	return out
}
