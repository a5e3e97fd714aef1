package store

import (
	"context"
	"fmt"
	"slices"
)

// ExpiredQuotaAdmissions are ff_quota_admitted rows whose expires_at_ms has
// passed, with check_admission's comparison (typed_ops.rs: a guard is live
// while expires_at_ms > now, so one at exactly now is expired). Each is an
// admission whose guard lapsed: FlowFabric's Valkey quota reconciler SREMs
// such members and sets the policy's concurrency counter to the live ones;
// Postgres has neither (migration 0012 promises a sweeper). Quota rows
// belong to no tenant. Index: ff_quota_admitted_expires_idx (partition_key,
// expires_at_ms), FlowFabric's own (0012): a probe reads one entry per
// quota partition and a scan O(due rows of the partition).
//
// A policy's counter drifts from its live admissions only when one lapses
// (check_admission adds a row and one to the counter together;
// release_admission removes both; a re-admission of an execution whose
// guard lapsed adds one to the counter for a row that already counted), so
// recounting the policies of the lapsed rows, as each row job does, is
// FlowFabric's per-policy recount without reading every policy every tick.
var ExpiredQuotaAdmissions = &Due{
	What:      "expired quota admissions",
	From:      "ff_quota_admitted r",
	At:        "r.expires_at_ms",
	Inclusive: true,
	ID:        Key{"r.quota_policy_id", "text"},
	ID2:       Key{"r.execution_id", "text"},
	Index:     "ff_quota_admitted_expires_idx",
}

// QuotaAdmission is one ff_quota_admitted row's key within its partition.
type QuotaAdmission struct {
	PolicyID, ExecutionID string
}

// QuotaReconcileResult says what ReconcileQuotas did for one admission and
// its policy.
type QuotaReconcileResult struct {
	// Deleted: under its row lock the admission was still expired, and it
	// is deleted. False: it was renewed (a re-admission) or deleted
	// meanwhile.
	Deleted bool
	// DeadlineMs is the expiry the admission had under its lock, when
	// Deleted.
	DeadlineMs int64
	// PolicyMissing: no ff_quota_policy row has the admission's policy id
	// (check_admission with a concurrency cap of 0 admits without one):
	// there is no counter or window to reconcile.
	PolicyMissing bool
	// WindowNegative holds the policy's requests_per_window_seconds when it
	// is negative, which no window can be: its window rows are left alone.
	WindowNegative int64
	// WindowRowsDeleted is the number of the policy's ff_quota_window rows
	// older than its window that were deleted (the same count for every
	// admission of the policy in one statement).
	WindowRowsDeleted int64
	// Recounted: the policy has a concurrency cap and its counter differed
	// from its live admissions under its lock; ConcurrencyBefore is what it
	// held and ConcurrencyAfter what it holds now.
	Recounted                           bool
	ConcurrencyBefore, ConcurrencyAfter int64
}

// Changed reports whether anything was written for the admission.
func (r QuotaReconcileResult) Changed() bool {
	return r.Deleted || r.Recounted || r.WindowRowsDeleted > 0
}

// sweepQuotaSQL deletes, for a batch of admissions of one quota partition
// ($2 policy ids and $3 execution ids, in order; $4 now), those still
// expired under their row locks (a DELETE re-reads expires_at_ms on the
// newest committed version: a re-admission's later expiry keeps the row),
// and the window rows of their policies older than the policy's window
// (requests_per_window_seconds, as check_admission's own sweep deletes
// admitted_at_ms < now - window; a negative window deletes nothing). It runs
// in a transaction of its own, before the policy rows are locked, so it
// takes its locks in check_admission's order (admitted row, window rows,
// then the policy) and never holds one of them while waiting on a policy.
// Index: each table's primary key (window rows by its (partition_key,
// quota_policy_id) prefix).
const sweepQuotaSQL = `
WITH input AS (
    SELECT i.quota_policy_id, i.execution_id, i.ord
      FROM unnest($2::text[], $3::text[]) WITH ORDINALITY AS i(quota_policy_id, execution_id, ord)
), del AS (
    DELETE FROM ff_quota_admitted a
     USING input i
     WHERE a.partition_key = $1 AND a.quota_policy_id = i.quota_policy_id AND a.execution_id = i.execution_id
       AND a.expires_at_ms <= $4
    RETURNING a.quota_policy_id, a.execution_id, a.expires_at_ms
), pol AS (
    SELECT p.quota_policy_id, p.requests_per_window_seconds AS window_s
      FROM ff_quota_policy p
     WHERE p.partition_key = $1 AND p.quota_policy_id IN (SELECT quota_policy_id FROM input)
), win AS (
    DELETE FROM ff_quota_window w
     USING pol
     WHERE w.partition_key = $1 AND w.quota_policy_id = pol.quota_policy_id AND pol.window_s >= 0
       AND w.admitted_at_ms < $4::bigint - LEAST(pol.window_s, 9223372036854775) * 1000
    RETURNING w.quota_policy_id
), wn AS (
    SELECT quota_policy_id, count(*) AS n FROM win GROUP BY quota_policy_id
)
SELECT del.execution_id IS NOT NULL,
       COALESCE(del.expires_at_ms, 0),
       pol.quota_policy_id IS NULL,
       CASE WHEN pol.window_s < 0 THEN pol.window_s ELSE 0 END,
       COALESCE(wn.n, 0)
  FROM input i
  LEFT JOIN del ON del.quota_policy_id = i.quota_policy_id AND del.execution_id = i.execution_id
  LEFT JOIN pol ON pol.quota_policy_id = i.quota_policy_id
  LEFT JOIN wn ON wn.quota_policy_id = i.quota_policy_id
 ORDER BY i.ord`

// lockQuotaPoliciesSQL takes the row locks of a batch of policies ($2 ids)
// as check_admission takes its policy's (SELECT … FOR UPDATE), before
// recountQuotaSQL runs in the same transaction and round trip, so the
// recount's snapshot follows the lock: it counts the admission a
// check_admission holding the lock committed. Index: the primary key.
const lockQuotaPoliciesSQL = `
SELECT p.quota_policy_id
  FROM ff_quota_policy p
 WHERE p.partition_key = $1 AND p.quota_policy_id = ANY($2::text[])
 ORDER BY p.quota_policy_id
   FOR UPDATE OF p`

// recountQuotaSQL sets the active_concurrency of each policy of a batch
// ($2 ids, distinct, in order; $3 now) that has a concurrency cap to its
// live admissions (expires_at_ms > now), where it differs: FlowFabric's
// Valkey quota reconciler's recount. Nothing else of the policy changes
// (the Valkey reconciler SETs the counter alone). Index: each table's
// primary key (admissions by its (partition_key, quota_policy_id) prefix).
const recountQuotaSQL = `
WITH input AS (
    SELECT i.quota_policy_id, i.ord FROM unnest($2::text[]) WITH ORDINALITY AS i(quota_policy_id, ord)
), pol AS (
    SELECT p.quota_policy_id, p.active_concurrency AS before,
           (SELECT count(*) FROM ff_quota_admitted a
             WHERE a.partition_key = $1 AND a.quota_policy_id = p.quota_policy_id AND a.expires_at_ms > $3) AS live
      FROM ff_quota_policy p
     WHERE p.partition_key = $1 AND p.quota_policy_id IN (SELECT quota_policy_id FROM input)
       AND p.active_concurrency_cap > 0
     ORDER BY p.quota_policy_id
       FOR UPDATE OF p
), up AS (
    UPDATE ff_quota_policy p
       SET active_concurrency = pol.live
      FROM pol
     WHERE p.partition_key = $1 AND p.quota_policy_id = pol.quota_policy_id AND p.active_concurrency <> pol.live
    RETURNING p.quota_policy_id, pol.before, p.active_concurrency
)
SELECT up.quota_policy_id IS NOT NULL, COALESCE(up.before, 0), COALESCE(up.active_concurrency, 0)
  FROM input i
  LEFT JOIN up ON up.quota_policy_id = i.quota_policy_id
 ORDER BY i.ord`

// ReconcileQuotas reconciles expired admissions of one quota partition, as
// FlowFabric's Valkey quota reconciler does for their policies, with one
// result per admission in order: it deletes those still expired and their
// policies' window rows older than the window (sweepQuotaSQL, one
// transaction), then, in a second transaction under the policies' row
// locks, sets each capped policy's counter to its live admissions. A
// second call finds the admissions gone and the counters right and changes
// nothing. db must also be able to send a batch, as for CloseWaitpoints.
//
// Each policy is recounted whether or not this call deleted its admission:
// a job run again after its sweep committed still recounts.
func ReconcileQuotas(ctx context.Context, db DB, partition int16, rows []QuotaAdmission, nowMs int64) ([]QuotaReconcileResult, error) {
	keys := make([]string, len(rows))
	for i, a := range rows {
		keys[i] = a.PolicyID + "\x00" + a.ExecutionID
	}
	var r QuotaReconcileResult
	out, err := batch[QuotaReconcileResult]{
		sql: sweepQuotaSQL,
		args: func(round []int) []any {
			pol, ex := make([]string, len(round)), make([]string, len(round))
			for j, k := range round {
				pol[j], ex[j] = rows[k].PolicyID, rows[k].ExecutionID
			}
			return []any{partition, pol, ex, nowMs}
		},
		dest:  []any{&r.Deleted, &r.DeadlineMs, &r.PolicyMissing, &r.WindowNegative, &r.WindowRowsDeleted},
		read:  func() QuotaReconcileResult { return r },
		label: func(i int) string { return rows[i].PolicyID + "/" + rows[i].ExecutionID },
		what:  "sweep expired quota admission", partition: partition,
	}.run(ctx, db, keys)
	if err != nil {
		return nil, err
	}
	var policies []string
	for _, a := range rows {
		if !slices.Contains(policies, a.PolicyID) {
			policies = append(policies, a.PolicyID)
		}
	}
	type recount struct {
		changed       bool
		before, after int64
	}
	var c recount
	counts, err := batch[recount]{
		sql:  recountQuotaSQL,
		args: func(round []int) []any { return []any{partition, pick(policies, round), nowMs} },
		dest: []any{&c.changed, &c.before, &c.after},
		read: func() recount { return c },
		lock: lockQuotaPoliciesSQL, lockArgs: 2,
		what: "recount quota policy", partition: partition,
	}.run(ctx, db, policies)
	if err != nil {
		return nil, fmt.Errorf("after sweeping %d admissions: %w", len(rows), err)
	}
	for i, a := range rows {
		c := counts[slices.Index(policies, a.PolicyID)]
		// One policy's recount is reported once, with its first admission.
		if c.changed && slices.IndexFunc(rows[:i], func(b QuotaAdmission) bool { return b.PolicyID == a.PolicyID }) < 0 {
			out[i].Recounted, out[i].ConcurrencyBefore, out[i].ConcurrencyAfter = true, c.before, c.after
		}
	}
	return out, nil
}
