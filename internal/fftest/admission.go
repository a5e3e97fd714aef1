package fftest

import (
	"testing"

	"github.com/flowfabric/ffreconcile/internal/ffseed"
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
// sha256 of the signed grant key), a TTL of 1 s, and returns the id in hex,
// as a scan of expired grants returns it.
func InsertGrant(t testing.TB, db store.DB, g Grant) string {
	t.Helper()
	row := ffseed.ClaimGrant{Partition: g.Partition, ExecutionID: g.ExecutionID, Kind: g.Kind, WorkerID: g.WorkerID,
		ExpiresAtMs: g.ExpiresAtMs}.Defaults()
	insert(t, db, row)
	return ffseed.HexID(row.ID)
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

// InsertQuotaPolicy inserts p (created and updated at 1).
func InsertQuotaPolicy(t testing.TB, db store.DB, p QuotaPolicy) {
	t.Helper()
	insert(t, db, ffseed.QuotaPolicy{Partition: p.Partition, ID: p.ID, WindowSeconds: p.WindowSeconds,
		MaxRequests: p.MaxRequests, ConcurrencyCap: p.ConcurrencyCap, ActiveConcurrency: p.ActiveConcurrency})
}

// InsertQuotaAdmitted inserts an admission of execID (a wire id, as
// check_admission stores it) under policy, admitted a second before it
// expires at expiresAtMs.
func InsertQuotaAdmitted(t testing.TB, db store.DB, partition int16, policy, execID string, expiresAtMs int64) {
	t.Helper()
	insert(t, db, ffseed.QuotaAdmitted{Partition: partition, PolicyID: policy, ExecutionID: execID, ExpiresAtMs: expiresAtMs})
}

// InsertQuotaWindow inserts a sliding-window row of policy (dimension ”, as
// check_admission writes it) admitted at admittedAtMs.
func InsertQuotaWindow(t testing.TB, db store.DB, partition int16, policy, execID string, admittedAtMs int64) {
	t.Helper()
	insert(t, db, ffseed.QuotaWindow{Partition: partition, PolicyID: policy, AdmittedAtMs: admittedAtMs, ExecutionID: execID})
}

// ActiveConcurrency reads a policy's counter.
func ActiveConcurrency(t testing.TB, db store.DB, partition int16, policy string) int {
	t.Helper()
	return Count(t, db, `SELECT active_concurrency FROM ff_quota_policy WHERE partition_key = $1 AND quota_policy_id = $2`,
		partition, policy)
}

// InsertBudgetDedup inserts a report_usage idempotency key expiring at
// expiresAtMs, applied a second before.
func InsertBudgetDedup(t testing.TB, db store.DB, partition int16, key string, expiresAtMs int64) {
	t.Helper()
	insert(t, db, ffseed.BudgetDedup{Partition: partition, Key: key, ExpiresAtMs: expiresAtMs})
}
