package ffread

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Admission is check_admission's CheckAdmissionResult.
type Admission string

// check_admission's outcomes.
const (
	Admitted            Admission = "Admitted"
	AlreadyAdmitted     Admission = "AlreadyAdmitted"
	RateExceeded        Admission = "RateExceeded"
	ConcurrencyExceeded Admission = "ConcurrencyExceeded"
)

// AdmissionArgs are CheckAdmissionArgs: the policy's limits as the caller
// read them (read_quota_policy_limits), the execution (its wire id, as
// FlowFabric stores it) and now.
type AdmissionArgs struct {
	ExecutionID    string
	WindowSeconds  int64
	RateLimit      int64
	ConcurrencyCap int64
	NowMs          int64
}

// CheckAdmission is check_admission (typed_ops.rs:929-1098) for a policy of
// quota partition partition (FlowFabric computes it from the policy id),
// one SERIALIZABLE transaction without retries (FlowFabric has none here:
// a serialization failure is returned): the admitted row's guard (FOR
// UPDATE; live while expires_at_ms > now: AlreadyAdmitted), the policy's
// window sweep, the rate check, the concurrency check under the policy
// row's lock (FOR UPDATE; active_concurrency >= cap: ConcurrencyExceeded),
// then the window row, the admitted upsert (expiring now + window) and, with
// a cap, the counter's upsert + 1.
func CheckAdmission(ctx context.Context, db TxDB, partition int16, policyID string, a AdmissionArgs) (Admission, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return "", err
	}
	defer rollback(ctx, tx)
	fail := func(err error) (Admission, error) {
		return "", fmt.Errorf("ffread: check_admission %s: %w", policyID, err)
	}
	if _, err := tx.Exec(ctx, "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"); err != nil {
		return fail(err)
	}
	now, windowMs := a.NowMs, a.WindowSeconds*1000
	var guard int64
	err = tx.QueryRow(ctx, `
        SELECT expires_at_ms FROM ff_quota_admitted
         WHERE partition_key = $1 AND quota_policy_id = $2 AND execution_id = $3
         FOR UPDATE
        `, partition, policyID, a.ExecutionID).Scan(&guard)
	switch {
	case err == nil && guard > now:
		if err := tx.Commit(ctx); err != nil {
			return fail(err)
		}
		return AlreadyAdmitted, nil
	case err != nil && !errors.Is(err, pgx.ErrNoRows):
		return fail(err)
	}
	if _, err := tx.Exec(ctx, `
        DELETE FROM ff_quota_window
         WHERE partition_key = $1
           AND quota_policy_id = $2
           AND admitted_at_ms < $3
        `, partition, policyID, now-windowMs); err != nil {
		return fail(err)
	}
	if a.RateLimit > 0 {
		var count int64
		if err := tx.QueryRow(ctx, "SELECT COUNT(*) FROM ff_quota_window "+
			"WHERE partition_key = $1 AND quota_policy_id = $2", partition, policyID).Scan(&count); err != nil {
			return fail(err)
		}
		if count >= a.RateLimit {
			if err := tx.Commit(ctx); err != nil {
				return fail(err)
			}
			return RateExceeded, nil
		}
	}
	var active int64
	err = tx.QueryRow(ctx, "SELECT active_concurrency FROM ff_quota_policy "+
		"WHERE partition_key = $1 AND quota_policy_id = $2 "+
		"FOR UPDATE", partition, policyID).Scan(&active)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fail(err)
	}
	if a.ConcurrencyCap > 0 && active >= a.ConcurrencyCap {
		if err := tx.Commit(ctx); err != nil {
			return fail(err)
		}
		return ConcurrencyExceeded, nil
	}
	if _, err := tx.Exec(ctx, "INSERT INTO ff_quota_window "+
		"(partition_key, quota_policy_id, dimension, admitted_at_ms, execution_id) "+
		"VALUES ($1, $2, '', $3, $4)", partition, policyID, now, a.ExecutionID); err != nil {
		return fail(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO ff_quota_admitted "+
		"(partition_key, quota_policy_id, execution_id, admitted_at_ms, expires_at_ms) "+
		"VALUES ($1, $2, $3, $4, $5) "+
		"ON CONFLICT (partition_key, quota_policy_id, execution_id) DO UPDATE "+
		"SET admitted_at_ms = EXCLUDED.admitted_at_ms, "+
		"expires_at_ms = EXCLUDED.expires_at_ms", partition, policyID, a.ExecutionID, now, now+windowMs); err != nil {
		return fail(err)
	}
	if a.ConcurrencyCap > 0 {
		if _, err := tx.Exec(ctx, "INSERT INTO ff_quota_policy "+
			"(partition_key, quota_policy_id, "+
			"requests_per_window_seconds, max_requests_per_window, "+
			"active_concurrency_cap, active_concurrency, "+
			"created_at_ms, updated_at_ms) "+
			"VALUES ($1, $2, 0, 0, 0, 1, $3, $3) "+
			"ON CONFLICT (partition_key, quota_policy_id) DO UPDATE "+
			"SET active_concurrency = ff_quota_policy.active_concurrency + 1, "+
			"updated_at_ms = EXCLUDED.updated_at_ms", partition, policyID, now); err != nil {
			return fail(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fail(err)
	}
	return Admitted, nil
}
