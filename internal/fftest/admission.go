package fftest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"

	"github.com/flowfabric/ffreconcile/store"
)

// Grant is an ff_claim_grant row, as FlowFabric's scheduler
// (claim_grant::write_claim_grant) or issue_reclaim_grant writes it.
type Grant struct {
	Partition   int16
	ExecutionID string
	// Kind is 'claim' (default) or 'reclaim'.
	Kind        string
	ExpiresAtMs int64
	// WorkerID defaults to w1.
	WorkerID string
}

// InsertGrant inserts g with a random 32-byte grant_id (FlowFabric's is the
// sha256 of the signed grant key) and returns the id in hex, as a scan of
// expired grants returns it.
func InsertGrant(t testing.TB, db store.DB, g Grant) string {
	t.Helper()
	if g.Kind == "" {
		g.Kind = "claim"
	}
	if g.WorkerID == "" {
		g.WorkerID = "w1"
	}
	var id [32]byte
	_, _ = rand.Read(id[:])
	_, err := db.Exec(context.Background(), `
		INSERT INTO ff_claim_grant (partition_key, grant_id, execution_id, kind, worker_id, worker_instance_id,
		       lane_id, capability_hash, worker_capabilities, route_snapshot_json, admission_summary,
		       grant_ttl_ms, issued_at_ms, expires_at_ms)
		VALUES ($1, $2, $3, $4, $5, $5 || '-i1', NULL, NULL, '[]'::jsonb, NULL, NULL, 1000, $6::bigint - 1000, $6::bigint)`,
		g.Partition, id[:], g.ExecutionID, g.Kind, g.WorkerID, g.ExpiresAtMs)
	if err != nil {
		t.Fatalf("insert ff_claim_grant: %v", err)
	}
	return hex.EncodeToString(id[:])
}

// PendingClaim returns an execution as FlowFabric's Postgres scheduler
// leaves it once it issued a claim grant: runnable, unowned, public state
// waiting, eligibility_state pending_claim (the only column the scheduler
// writes).
func PendingClaim(partition int16) Exec {
	return Exec{Partition: partition, LifecyclePhase: "runnable", OwnershipState: "unowned",
		EligibilityState: "pending_claim", PublicState: "waiting", AttemptState: "pending_first_attempt"}
}

// Grants counts the grants of an execution.
func Grants(t testing.TB, db store.DB, partition int16, execID string) int {
	t.Helper()
	return Count(t, db, `SELECT count(*) FROM ff_claim_grant WHERE partition_key = $1 AND execution_id = $2`, partition, execID)
}

// QuotaPolicy is an ff_quota_policy row, as create_quota_policy writes it.
type QuotaPolicy struct {
	Partition         int16
	ID                string
	WindowSeconds     int64
	MaxRequests       int64
	ConcurrencyCap    int64
	ActiveConcurrency int64
}

// InsertQuotaPolicy inserts p.
func InsertQuotaPolicy(t testing.TB, db store.DB, p QuotaPolicy) {
	t.Helper()
	_, err := db.Exec(context.Background(), `
		INSERT INTO ff_quota_policy (partition_key, quota_policy_id, requests_per_window_seconds, max_requests_per_window,
		       active_concurrency_cap, active_concurrency, created_at_ms, updated_at_ms)
		VALUES ($1, $2, $3, $4, $5, $6, 1, 1)`,
		p.Partition, p.ID, p.WindowSeconds, p.MaxRequests, p.ConcurrencyCap, p.ActiveConcurrency)
	if err != nil {
		t.Fatalf("insert ff_quota_policy: %v", err)
	}
}

// InsertQuotaAdmitted inserts an admission of execID (a wire id, as
// check_admission stores it) under policy, expiring at expiresAtMs.
func InsertQuotaAdmitted(t testing.TB, db store.DB, partition int16, policy, execID string, expiresAtMs int64) {
	t.Helper()
	_, err := db.Exec(context.Background(), `
		INSERT INTO ff_quota_admitted (partition_key, quota_policy_id, execution_id, admitted_at_ms, expires_at_ms)
		VALUES ($1, $2, $3, $4::bigint - 1000, $4::bigint)`, partition, policy, execID, expiresAtMs)
	if err != nil {
		t.Fatalf("insert ff_quota_admitted: %v", err)
	}
}

// InsertQuotaWindow inserts a sliding-window row of policy (dimension ”, as
// check_admission writes it) admitted at admittedAtMs.
func InsertQuotaWindow(t testing.TB, db store.DB, partition int16, policy, execID string, admittedAtMs int64) {
	t.Helper()
	_, err := db.Exec(context.Background(), `
		INSERT INTO ff_quota_window (partition_key, quota_policy_id, dimension, admitted_at_ms, execution_id)
		VALUES ($1, $2, '', $3, $4)`, partition, policy, admittedAtMs, execID)
	if err != nil {
		t.Fatalf("insert ff_quota_window: %v", err)
	}
}

// ActiveConcurrency reads a policy's counter.
func ActiveConcurrency(t testing.TB, db store.DB, partition int16, policy string) int {
	t.Helper()
	return Count(t, db, `SELECT active_concurrency FROM ff_quota_policy WHERE partition_key = $1 AND quota_policy_id = $2`,
		partition, policy)
}

// InsertBudgetDedup inserts a report_usage idempotency key expiring at
// expiresAtMs.
func InsertBudgetDedup(t testing.TB, db store.DB, partition int16, key string, expiresAtMs int64) {
	t.Helper()
	_, err := db.Exec(context.Background(), `
		INSERT INTO ff_budget_usage_dedup (partition_key, dedup_key, outcome_json, applied_at_ms, expires_at_ms)
		VALUES ($1, $2, '{"outcome":"applied"}'::jsonb, $3::bigint - 1000, $3::bigint)`, partition, key, expiresAtMs)
	if err != nil {
		t.Fatalf("insert ff_budget_usage_dedup: %v", err)
	}
}
