package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// DueLeasePartitions returns the partitions (0..partitionCount-1) holding at
// least one attempt whose lease expired before nowMs and whose execution
// passes f. Index: ff_attempt (partition_key, lease_expires_at_ms) WHERE
// lease_expires_at_ms IS NOT NULL, one probe per partition.
func DueLeasePartitions(ctx context.Context, db DB, nowMs int64, partitionCount int, f Filter) ([]int16, error) {
	args := []any{partitionCount, nowMs}
	probe := `SELECT 1 FROM ff_attempt a WHERE a.partition_key = s.p
	   AND a.lease_expires_at_ms IS NOT NULL AND a.lease_expires_at_ms < $2`
	if !f.Empty() {
		var cond string
		cond, args = f.sql(args)
		probe = `SELECT 1 FROM ff_attempt a
		  JOIN ff_exec_core e ON e.partition_key = a.partition_key AND e.execution_id = a.execution_id
		 WHERE a.partition_key = s.p
		   AND a.lease_expires_at_ms IS NOT NULL AND a.lease_expires_at_ms < $2` + cond
	}
	parts, err := collectPartitions(db.Query(ctx, partitionsSQL(probe), args...))
	if err != nil {
		return nil, fmt.Errorf("find partitions with expired leases: %w", err)
	}
	return parts, nil
}

// ExpiredLease is one attempt whose lease has lapsed.
type ExpiredLease struct {
	ExecutionID  string
	AttemptIndex int32
	ExpiresAtMs  int64
}

// ScanExpiredLeases returns up to limit attempts of one partition whose lease
// expired before nowMs, oldest first (then by execution and attempt, so the
// order is total and a scan can continue after any row), skipping rows whose
// execution does not pass f. Index: ff_attempt (partition_key,
// lease_expires_at_ms) WHERE lease_expires_at_ms IS NOT NULL; the cost is
// O(due rows), not O(table).
//
// Like the seed, it does not require the execution to be active: a lease left
// behind on a terminal execution is still released.
func ScanExpiredLeases(ctx context.Context, db DB, partition int16, nowMs int64, after *After, limit int, f Filter) ([]ExpiredLease, error) {
	args := []any{partition, nowMs, limit}
	cond := ""
	if after != nil {
		args = append(args, after.AtMs, after.ID, after.N)
		cond = ` AND (a.lease_expires_at_ms, a.execution_id, a.attempt_index) > ($4, $5::uuid, $6)`
	}
	from := `ff_attempt a`
	if !f.Empty() {
		var fc string
		fc, args = f.sql(args)
		cond += fc
		from = `ff_attempt a JOIN ff_exec_core e ON e.partition_key = a.partition_key AND e.execution_id = a.execution_id`
	}
	rows, err := db.Query(ctx, `
		SELECT a.execution_id::text, a.attempt_index, a.lease_expires_at_ms
		  FROM `+from+`
		 WHERE a.partition_key = $1
		   AND a.lease_expires_at_ms IS NOT NULL AND a.lease_expires_at_ms < $2`+cond+`
		 ORDER BY a.lease_expires_at_ms, a.execution_id, a.attempt_index
		 LIMIT $3`, args...)
	if err != nil {
		return nil, fmt.Errorf("scan expired leases in partition %d: %w", partition, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ExpiredLease, error) {
		var l ExpiredLease
		err := r.Scan(&l.ExecutionID, &l.AttemptIndex, &l.ExpiresAtMs)
		return l, err
	})
	if err != nil {
		return nil, fmt.Errorf("scan expired leases in partition %d: %w", partition, err)
	}
	return out, nil
}

// ReleaseResult says what ReleaseExpiredLease did.
type ReleaseResult struct {
	// Released: the lease was still expired under lock and is now released,
	// with its `expired` lease event written. False means the row no longer
	// qualified (renewed, released, or gone): nothing changed.
	Released bool
	// ExecFlipped: the execution was active and is now runnable, unowned,
	// eligible_now, attempt_interrupted. False with Released means the
	// execution was not active (terminal, cancelled, …) and was left as is.
	ExecFlipped bool
	// ExecMissing: no ff_exec_core row exists for the attempt; the event
	// carries NULL namespace and instance tag, as FlowFabric writes it.
	ExecMissing bool
	// RawFieldsMalformed: the execution's raw_fields is not a JSON object;
	// the lifecycle columns were flipped but raw_fields was kept as it was
	// instead of being overwritten.
	RawFieldsMalformed bool
	// EventID is the ff_lease_event row written, when Released.
	EventID int64
}

// releaseSQL is the seed's release_one transaction as one statement:
//   - att re-checks the lease under the row lock (a renewal committed since
//     the scan makes it match nothing, and then nothing else happens) and
//     releases it with outcome lease_expired_reclaimable;
//   - ec flips the execution to reclaimable-runnable only while it is still
//     active, stamping raw_fields.lease_expired_at_ms;
//   - ev writes the `expired` lease event with the namespace and
//     cairn.instance_id tag copied from the execution (NULL when missing),
//     as FlowFabric does since 0.10.
const releaseSQL = `
WITH att AS (
    UPDATE ff_attempt
       SET lease_expires_at_ms = NULL,
           outcome = 'lease_expired_reclaimable'
     WHERE partition_key = $1 AND execution_id = $2::uuid AND attempt_index = $3
       AND lease_expires_at_ms IS NOT NULL AND lease_expires_at_ms < $4
    RETURNING execution_id
), cur AS (
    SELECT e.raw_fields, e.lifecycle_phase
      FROM ff_exec_core e
     WHERE e.partition_key = $1 AND e.execution_id = $2::uuid
       AND EXISTS (SELECT 1 FROM att)
), ec AS (
    UPDATE ff_exec_core e
       SET lifecycle_phase = 'runnable',
           ownership_state = 'unowned',
           eligibility_state = 'eligible_now',
           attempt_state = 'attempt_interrupted',
           raw_fields = CASE WHEN jsonb_typeof(e.raw_fields) = 'object'
                             THEN e.raw_fields || jsonb_build_object('lease_expired_at_ms', $4::bigint)
                             ELSE e.raw_fields END
     WHERE e.partition_key = $1 AND e.execution_id = $2::uuid
       AND e.lifecycle_phase = 'active'
       AND EXISTS (SELECT 1 FROM att)
    RETURNING jsonb_typeof(e.raw_fields) = 'object' AS raw_ok
), ev AS (
    INSERT INTO ff_lease_event (execution_id, lease_id, event_type, occurred_at_ms, partition_key, namespace, instance_tag)
    SELECT att.execution_id::text, NULL, 'expired', $4, $1::int,
           (SELECT cur.raw_fields->>'namespace' FROM cur),
           (SELECT cur.raw_fields->'tags'->>'cairn.instance_id' FROM cur)
      FROM att
    RETURNING event_id
)
SELECT EXISTS (SELECT 1 FROM att),
       EXISTS (SELECT 1 FROM ec),
       NOT EXISTS (SELECT 1 FROM cur),
       COALESCE((SELECT NOT raw_ok FROM ec), false),
       COALESCE((SELECT event_id FROM ev), 0)`

// ReleaseExpiredLease releases one attempt's lease if, under its row lock, it
// is still expired at nowMs. It runs in one statement (one implicit
// transaction when db is a pool), so the check and the change are atomic and
// a second call for the same lease is a no-op.
func ReleaseExpiredLease(ctx context.Context, db DB, partition int16, executionID string, attemptIndex int32, nowMs int64) (ReleaseResult, error) {
	var r ReleaseResult
	err := db.QueryRow(ctx, releaseSQL, partition, executionID, attemptIndex, nowMs).
		Scan(&r.Released, &r.ExecFlipped, &r.ExecMissing, &r.RawFieldsMalformed, &r.EventID)
	if err != nil {
		return ReleaseResult{}, fmt.Errorf("release lease %d/%s attempt %d: %w", partition, executionID, attemptIndex, err)
	}
	if !r.Released {
		r.ExecMissing = false
	}
	return r, nil
}
