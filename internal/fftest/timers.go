package fftest

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/flowfabric/ffreconcile/internal/ffseed"
	"github.com/flowfabric/ffreconcile/store"
)

// Waitpoint is an ff_waitpoint_pending row. Zero fields take defaults: a
// fresh id, state pending, key ” (FlowFabric then keys the member_map by
// the waitpoint id).
type Waitpoint struct {
	Partition   int16
	ID          string
	ExecutionID string
	Key         string
	State       string
	ExpiresAtMs *int64
}

// InsertWaitpoint inserts w (token kid-1, created at 1) and returns its id.
func InsertWaitpoint(t testing.TB, db store.DB, w Waitpoint) string {
	t.Helper()
	row := ffseed.Waitpoint{Partition: w.Partition, ID: w.ID, ExecutionID: w.ExecutionID, Key: w.Key, State: w.State,
		ExpiresAtMs: w.ExpiresAtMs}.Defaults()
	insert(t, db, row)
	return row.ID
}

// WaitpointExists reports whether a waitpoint is still pending.
func WaitpointExists(t testing.TB, db store.DB, partition int16, id string) bool {
	t.Helper()
	return Count(t, db, `SELECT count(*) FROM ff_waitpoint_pending WHERE partition_key = $1 AND waitpoint_id = $2`,
		partition, id) == 1
}

// Budget is an ff_budget_policy row. Policy is stored as JSON (nil: {}).
type Budget struct {
	Partition     int16
	ID            string
	Policy        any
	NextResetAtMs *int64
	// Breach fields, to check what a reset clears and keeps.
	BreachCount, SoftBreachCount int64
	LastBreachAtMs               *int64
	LastBreachDim                *string
}

// InsertBudget inserts b (a hard budget of flow scope-1, created and
// updated at 1) and returns its id (a fresh one when empty).
func InsertBudget(t testing.TB, db store.DB, b Budget) string {
	t.Helper()
	dim := ""
	if b.LastBreachDim != nil {
		dim = *b.LastBreachDim
	}
	row := ffseed.Budget{Partition: b.Partition, ID: b.ID, Policy: b.Policy, ScopeType: "flow", ScopeID: "scope-1",
		EnforcementMode: "hard", BreachCount: b.BreachCount, SoftBreachCount: b.SoftBreachCount,
		LastBreachAtMs: b.LastBreachAtMs, LastBreachDim: dim, NextResetAtMs: b.NextResetAtMs}.Defaults()
	insert(t, db, row)
	return row.ID
}

// InsertBudgetUsage inserts a usage row of a budget, updated at 1.
func InsertBudgetUsage(t testing.TB, db store.DB, partition int16, budgetID, dimensions string, value int64) {
	t.Helper()
	insert(t, db, ffseed.BudgetUsage{Partition: partition, BudgetID: budgetID, Dimensions: dimensions, CurrentValue: value})
}

// BudgetRow is what tests read back from ff_budget_policy.
type BudgetRow struct {
	PolicyJSON                   string
	UpdatedAtMs                  int64
	BreachCount, SoftBreachCount int64
	LastBreachAtMs               *int64
	LastBreachDim                *string
	NextResetAtMs                *int64
}

// ReadBudget reads one budget policy; it fails the test when it is missing.
func ReadBudget(t testing.TB, db store.DB, partition int16, id string) BudgetRow {
	t.Helper()
	var r BudgetRow
	err := db.QueryRow(context.Background(), `
		SELECT policy_json::text, updated_at_ms, breach_count, soft_breach_count, last_breach_at_ms, last_breach_dim,
		       next_reset_at_ms
		  FROM ff_budget_policy WHERE partition_key = $1 AND budget_id = $2`, partition, id).
		Scan(&r.PolicyJSON, &r.UpdatedAtMs, &r.BreachCount, &r.SoftBreachCount, &r.LastBreachAtMs, &r.LastBreachDim,
			&r.NextResetAtMs)
	if err != nil {
		t.Fatalf("read ff_budget_policy %d/%s: %v", partition, id, err)
	}
	return r
}

// UsageRow is what tests read back from ff_budget_usage.
type UsageRow struct {
	Dimensions    string
	CurrentValue  int64
	LastResetAtMs *int64
	UpdatedAtMs   int64
}

// ReadUsage reads a budget's usage rows, by dimensions key.
func ReadUsage(t testing.TB, db store.DB, partition int16, budgetID string) []UsageRow {
	t.Helper()
	rows, err := db.Query(context.Background(), `
		SELECT dimensions_key, current_value, last_reset_at_ms, updated_at_ms FROM ff_budget_usage
		 WHERE partition_key = $1 AND budget_id = $2 ORDER BY dimensions_key`, partition, budgetID)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (UsageRow, error) {
		var u UsageRow
		err := r.Scan(&u.Dimensions, &u.CurrentValue, &u.LastResetAtMs, &u.UpdatedAtMs)
		return u, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Worker is an ff_worker_registry row. Zero fields take defaults: a fresh
// instance id, namespace default, a 30 s TTL.
type Worker struct {
	Partition       int16
	Namespace       string
	InstanceID      string
	LastHeartbeatMs int64
	TTLMs           int64
}

// InsertWorker inserts w (worker worker-1, lane default, registered at 1)
// and returns its instance id.
func InsertWorker(t testing.TB, db store.DB, w Worker) string {
	t.Helper()
	row := ffseed.WorkerRegistration{Partition: w.Partition, Namespace: w.Namespace, InstanceID: w.InstanceID,
		LastHeartbeatMs: w.LastHeartbeatMs, TTLMs: w.TTLMs}.Defaults()
	insert(t, db, row)
	return row.InstanceID
}

// WorkerExists reports whether a registration is still in the registry.
func WorkerExists(t testing.TB, db store.DB, partition int16, namespace, instanceID string) bool {
	t.Helper()
	return Count(t, db, `SELECT count(*) FROM ff_worker_registry
		WHERE partition_key = $1 AND namespace = $2 AND worker_instance_id = $3`, partition, namespace, instanceID) == 1
}

// WorkerEvent is one ff_worker_registry_event row.
type WorkerEvent struct {
	Kind      string
	AtMs      int64
	Reason    *string
	Partition int16
}

// WorkerEvents returns the events of a registration, oldest first.
func WorkerEvents(t testing.TB, db store.DB, namespace, instanceID string) []WorkerEvent {
	t.Helper()
	rows, err := db.Query(context.Background(), `
		SELECT event_kind, event_at_ms, reason, partition_key FROM ff_worker_registry_event
		 WHERE namespace = $1 AND worker_instance_id = $2 ORDER BY event_at_ms, event_kind`, namespace, instanceID)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (WorkerEvent, error) {
		var e WorkerEvent
		err := r.Scan(&e.Kind, &e.AtMs, &e.Reason, &e.Partition)
		return e, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// AttemptJSON reads a whole ff_attempt row as a JSON object (column name to
// value), so a test can check that an action changed only what it should.
func AttemptJSON(t testing.TB, db store.DB, partition int16, execID string, attemptIndex int32) map[string]any {
	t.Helper()
	return rowJSON(t, db, `SELECT to_jsonb(a)::text FROM ff_attempt a
		 WHERE partition_key = $1 AND execution_id = $2 AND attempt_index = $3`, partition, execID, attemptIndex)
}

// SuspensionJSON reads a whole ff_suspension_current row as a JSON object
// (column name to value).
func SuspensionJSON(t testing.TB, db store.DB, partition int16, execID string) map[string]any {
	t.Helper()
	return rowJSON(t, db, `SELECT to_jsonb(s)::text FROM ff_suspension_current s
		 WHERE partition_key = $1 AND execution_id = $2`, partition, execID)
}

// rowJSON runs a query returning one row as JSON text and decodes it; it
// fails the test when the row is missing.
func rowJSON(t testing.TB, db store.DB, sql string, args ...any) map[string]any {
	t.Helper()
	var text string
	if err := db.QueryRow(context.Background(), sql, args...).Scan(&text); err != nil {
		t.Fatalf("%s %v: %v", sql, args, err)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(text), &m); err != nil {
		t.Fatal(err)
	}
	return m
}
