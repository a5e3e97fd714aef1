package migrations

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

// requiredColumns lists, per table, every column the worker reads or writes.
// Check compares it with the live catalog so a worker started against a
// database FlowFabric has not (fully) migrated fails at start, naming what is
// missing, instead of failing row by row later.
var requiredColumns = map[string][]string{
	"ff_exec_core": {"partition_key", "execution_id", "flow_id", "attempt_index", "lifecycle_phase", "ownership_state",
		"eligibility_state", "public_state", "attempt_state", "cancellation_reason", "cancelled_by",
		"terminal_at_ms", "deadline_at_ms", "policy", "raw_fields"},
	"ff_attempt": {"partition_key", "execution_id", "attempt_index", "worker_instance_id", "lease_epoch", "lease_expires_at_ms",
		"terminal_at_ms", "outcome"},
	"ff_suspension_current": {"partition_key", "execution_id", "timeout_at_ms", "member_map", "timeout_behavior"},
	"ff_edge_group": {"partition_key", "flow_id", "downstream_eid", "policy", "success_count", "fail_count", "skip_count",
		"running_count", "cancel_siblings_pending_flag", "cancel_siblings_pending_members"},
	"ff_edge":                  {"partition_key", "flow_id", "edge_id", "upstream_eid", "downstream_eid"},
	"ff_pending_cancel_groups": {"partition_key", "flow_id", "downstream_eid", "enqueued_at_ms"},
	"ff_completion_event": {"partition_key", "event_id", "execution_id", "flow_id", "outcome", "namespace",
		"instance_tag", "occurred_at_ms", "committed_at_ms", "dispatched_at_ms"},
	"ff_lease_event": {"event_id", "execution_id", "lease_id", "event_type", "occurred_at_ms", "partition_key",
		"namespace", "instance_tag"},
	"ff_waitpoint_pending": {"partition_key", "waitpoint_id", "execution_id", "expires_at_ms", "waitpoint_key"},
	"ff_budget_policy": {"partition_key", "budget_id", "policy_json", "updated_at_ms", "last_breach_at_ms",
		"last_breach_dim", "next_reset_at_ms"},
	"ff_budget_usage":    {"partition_key", "budget_id", "current_value", "last_reset_at_ms", "updated_at_ms"},
	"ff_worker_registry": {"partition_key", "namespace", "worker_instance_id", "last_heartbeat_ms", "liveness_ttl_ms"},
	"ff_worker_registry_event": {"partition_key", "namespace", "worker_instance_id", "event_kind", "event_at_ms",
		"reason"},
	// Retention deletes a trimmed execution's rows from these; the
	// background duties read and write the claim grants, the cancel
	// backlog and the quota tables.
	"ff_claim_grant":           {"partition_key", "grant_id", "execution_id", "kind", "expires_at_ms"},
	"ff_stream_frame":          {"partition_key", "execution_id"},
	"ff_stream_meta":           {"partition_key", "execution_id"},
	"ff_stream_summary":        {"partition_key", "execution_id"},
	"ff_cancel_backlog_member": {"partition_key", "flow_id", "execution_id"},
	"ff_operator_event":        {"partition_key", "execution_id"},
	"ff_quota_admitted":        {"partition_key", "quota_policy_id", "execution_id", "expires_at_ms"},
	"ff_quota_window":          {"partition_key", "quota_policy_id", "admitted_at_ms", "execution_id"},
	"ff_signal_event":          {"partition_key", "execution_id"},
	"ff_flow_core":             {"partition_key", "flow_id", "public_flow_state", "raw_fields"},
	"ff_flow_summary": {"partition_key", "flow_id", "total_members", "sampled_members", "members_completed", "members_failed",
		"members_cancelled", "members_expired", "members_skipped", "members_active", "members_suspended", "members_waiting",
		"members_delayed", "members_rate_limited", "members_waiting_children", "public_flow_state", "last_summary_update_at"},
	"ff_cancel_backlog": {"partition_key", "flow_id", "requested_at_ms", "reason", "grace_until_ms", "cancellation_policy"},
	"ff_quota_policy": {"partition_key", "quota_policy_id", "requests_per_window_seconds", "active_concurrency_cap",
		"active_concurrency", "updated_at_ms"},
	"ff_budget_usage_dedup": {"partition_key", "dedup_key", "expires_at_ms"},
}

// Check verifies that the given ff_* tables (every one the worker knows when
// none is given) exist with every column the worker reads or writes, looked
// up through the connection's search_path, and that the given objects of
// ours (Object, with River's tables in schema) are in place. A fleet checks
// the tables of the reconcilers it runs. The error names every missing
// table, column and object in one message.
func Check(ctx context.Context, pool *pgxpool.Pool, schema string, names ...string) error {
	var tables []string
	for _, n := range names {
		if !IsObject(n) {
			tables = append(tables, n)
		}
	}
	if len(names) == 0 {
		for t := range requiredColumns {
			tables = append(tables, t)
		}
	}
	if err := checkTables(ctx, pool, tables); err != nil {
		return err
	}
	return checkObjects(ctx, pool, schema, names)
}

// checkTables checks that tables exist with their requiredColumns.
func checkTables(ctx context.Context, pool *pgxpool.Pool, tables []string) error {
	rows, err := pool.Query(ctx, `
		SELECT c.relname, a.attname
		  FROM pg_class c
		  JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
		 WHERE c.relname = ANY($1) AND pg_table_is_visible(c.oid) AND c.relkind IN ('r', 'p')`,
		tables)
	if err != nil {
		return fmt.Errorf("read catalog: %w", err)
	}
	have := map[string]map[string]bool{}
	for rows.Next() {
		var table, column string
		if err := rows.Scan(&table, &column); err != nil {
			return fmt.Errorf("read catalog: %w", err)
		}
		if have[table] == nil {
			have[table] = map[string]bool{}
		}
		have[table][column] = true
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read catalog: %w", err)
	}

	var missingTables, missingColumns []string
	for _, table := range tables {
		cols, known := requiredColumns[table]
		if !known {
			return fmt.Errorf("check schema: no columns known for table %q", table)
		}
		if have[table] == nil {
			missingTables = append(missingTables, table)
			continue
		}
		for _, c := range cols {
			if !have[table][c] {
				missingColumns = append(missingColumns, table+"."+c)
			}
		}
	}
	if len(missingTables) == 0 && len(missingColumns) == 0 {
		return nil
	}
	sort.Strings(missingTables)
	sort.Strings(missingColumns)
	var parts []string
	if len(missingTables) > 0 {
		parts = append(parts, "missing tables: "+strings.Join(missingTables, ", "))
	}
	if len(missingColumns) > 0 {
		parts = append(parts, "missing columns: "+strings.Join(missingColumns, ", "))
	}
	return fmt.Errorf("database is not migrated for FlowFabric (%s); run FlowFabric's migrations or `worker migrate --ff-schema`",
		strings.Join(parts, "; "))
}

// checkColumns reports table (one of ours) missing, or missing one of cols,
// with fix, what to run.
func checkColumns(ctx context.Context, pool *pgxpool.Pool, table string, cols []string, fix string) error {
	var have []string
	err := pool.QueryRow(ctx, `
		SELECT COALESCE(array_agg(a.attname::text), '{}')
		  FROM pg_class c
		  JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
		 WHERE c.relname = $1 AND pg_table_is_visible(c.oid) AND c.relkind IN ('r', 'p')`, table).Scan(&have)
	if err != nil {
		return fmt.Errorf("read catalog: %w", err)
	}
	if len(have) == 0 {
		return fmt.Errorf("table %s is missing; %s", table, fix)
	}
	var missing []string
	for _, c := range cols {
		if !slices.Contains(have, c) {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("table %s lacks columns %s; %s", table, strings.Join(missing, ", "), fix)
	}
	return nil
}
