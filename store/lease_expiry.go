package store

import (
	"context"
	"fmt"
)

// ExpiredLeases are attempts whose lease has lapsed, whatever their
// execution's phase: like the seed, a lease left behind on a terminal
// execution is still released. Index: ff_attempt_lease_expiry_idx
// (partition_key, lease_expires_at_ms) WHERE lease_expires_at_ms IS NOT NULL.
var ExpiredLeases = &Due{
	What:   "expired leases",
	From:   "ff_attempt r",
	Exec:   execJoin,
	Tenant: true,
	At:     "r.lease_expires_at_ms",
	ID:     Key{"r.execution_id", "uuid"},
	N:      "r.attempt_index",
	Index:  "ff_attempt_lease_expiry_idx",
}

// ExpiredLeasesShare is lease expiry's share of the expired leases when the
// fleet also runs attempt timeout: every expired lease but those of an
// active execution declaring retries, which are attempt timeout's
// (TimedOutAttemptsShare). Leases of executions that are not active, or
// missing, stay lease expiry's alone, as they always were. Index: as
// ExpiredLeases; each due lease's execution is read by its primary key
// (the LEFT JOIN in Join).
var ExpiredLeasesShare = &Due{
	What:   "expired leases not of executions declaring retries",
	From:   "ff_attempt r",
	Exec:   execJoin,
	Tenant: true,
	At:     "r.lease_expires_at_ms",
	Join:   "LEFT JOIN ff_exec_core x ON x.partition_key = r.partition_key AND x.execution_id = r.execution_id",
	Where:  "NOT COALESCE(x.lifecycle_phase = 'active' AND " + declaresRetriesSQL("x") + ", false)",
	ID:     Key{"r.execution_id", "uuid"},
	N:      "r.attempt_index",
	Index:  "ff_attempt_lease_expiry_idx",
}

// ReleaseResult says what ReleaseExpiredLease did.
type ReleaseResult struct {
	// Released: the lease was still expired under lock and is now released,
	// with its `expired` lease event written. False means the row no longer
	// qualified (renewed, released, or gone): nothing changed.
	Released bool
	// ExecFlipped: the execution was active and is now runnable, unowned,
	// eligible_now, attempt_interrupted, public_state waiting with
	// blocking_reason waiting_for_worker. False with Released means the
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
	// DeadlineMs is the lease expiry the attempt had under its lock, when
	// Released: the deadline its lateness is measured from.
	DeadlineMs int64
}

// releaseSQL is the seed's release_one transaction as one statement, for
// a batch of attempts of one partition (input, in order $2/$3):
//   - lk re-checks each lease under its row lock (a renewal committed since
//     the scan makes it match nothing, and then nothing else happens for
//     that attempt), reading the expiry it had, and att releases it with
//     outcome lease_expired_reclaimable (an UPDATE returns only the values
//     it wrote: the expiry it clears is read first, under the same lock);
//   - ec flips each execution to reclaimable-runnable only while it is still
//     active, stamping raw_fields.lease_expired_at_ms, and says so in
//     public_state and blocking_reason as FlowFabric's Valkey engine reads
//     that state (waiting, waiting_for_worker), where FlowFabric's Postgres
//     statement leaves the claim's `running`;
//   - ev writes one `expired` lease event per released attempt with the
//     namespace and cairn.instance_id tag copied from the execution (NULL
//     when missing), as FlowFabric does since 0.10.
//
// The partition is a constant so the planner prunes to one child of each
// table; the execution ids of one call are distinct (ReleaseExpiredLeases
// splits the input), which lets events be matched back by execution id.
// Index: each table's primary key.
var releaseSQL = `
WITH input AS (
    SELECT i.execution_id, i.attempt_index, i.ord
      FROM unnest($2::uuid[], $3::int[]) WITH ORDINALITY AS i(execution_id, attempt_index, ord)
), lk AS (
    SELECT a.execution_id, a.attempt_index, a.lease_expires_at_ms, i.ord
      FROM ff_attempt a JOIN input i ON i.execution_id = a.execution_id AND i.attempt_index = a.attempt_index
     WHERE a.partition_key = $1
       AND a.lease_expires_at_ms IS NOT NULL AND a.lease_expires_at_ms < $4
       AND ` + tenantExecSQL("a.execution_id", 5) + `
     ORDER BY a.execution_id
       FOR UPDATE OF a
), att AS (
    UPDATE ff_attempt a
       SET lease_expires_at_ms = NULL,
           outcome = 'lease_expired_reclaimable'
      FROM lk
     WHERE a.partition_key = $1 AND a.execution_id = lk.execution_id AND a.attempt_index = lk.attempt_index
    RETURNING a.execution_id, lk.ord, lk.lease_expires_at_ms
), cur AS (
    SELECT e.execution_id, e.raw_fields
      FROM ff_exec_core e
     WHERE e.partition_key = $1 AND e.execution_id IN (SELECT execution_id FROM att)
), ec AS (
    UPDATE ff_exec_core e
       SET lifecycle_phase = 'runnable',
           ownership_state = 'unowned',
           eligibility_state = 'eligible_now',
           attempt_state = 'attempt_interrupted',
           public_state = 'waiting',
           blocking_reason = 'waiting_for_worker',
           raw_fields = CASE WHEN jsonb_typeof(e.raw_fields) = 'object'
                             THEN e.raw_fields || jsonb_build_object('lease_expired_at_ms', $4::bigint)
                             ELSE e.raw_fields END
     WHERE e.partition_key = $1 AND e.execution_id IN (SELECT execution_id FROM att)
       AND e.lifecycle_phase = 'active'
    RETURNING e.execution_id, jsonb_typeof(e.raw_fields) = 'object' AS raw_ok
), ev AS (
    INSERT INTO ff_lease_event (execution_id, lease_id, event_type, occurred_at_ms, partition_key, namespace, instance_tag)
    SELECT att.execution_id::text, NULL, 'expired', $4, $1::int,
           cur.raw_fields->>'namespace', cur.raw_fields->'tags'->>'cairn.instance_id'
      FROM att LEFT JOIN cur ON cur.execution_id = att.execution_id
     ORDER BY att.ord
    RETURNING execution_id, event_id
)
SELECT att.execution_id IS NOT NULL,
       ec.execution_id IS NOT NULL,
       cur.execution_id IS NULL,
       COALESCE(NOT ec.raw_ok, false),
       COALESCE(ev.event_id, 0),
       COALESCE(att.lease_expires_at_ms, 0)
  FROM input i
  LEFT JOIN att ON att.ord = i.ord
  LEFT JOIN cur ON cur.execution_id = att.execution_id
  LEFT JOIN ec ON ec.execution_id = att.execution_id
  LEFT JOIN ev ON ev.execution_id = att.execution_id::text
 ORDER BY i.ord`

// ReleaseExpiredLease releases one attempt's lease if, under its row lock, it
// is still expired at nowMs. It runs in one statement (one implicit
// transaction when db is a pool), so the check and the change are atomic and
// a second call for the same lease is a no-op.
func ReleaseExpiredLease(ctx context.Context, db DB, partition int16, executionID string, attemptIndex int32, nowMs int64, f Filter) (ReleaseResult, error) {
	return one(ReleaseExpiredLeases(ctx, db, partition, []LeaseRef{{executionID, attemptIndex}}, nowMs, f))
}

// ReleaseExpiredLeases is ReleaseExpiredLease for several attempts of one
// partition, with one result per ref in order. Each attempt is re-checked
// under its own row lock exactly as alone; attempts of distinct executions
// share one statement, and a second attempt of an execution already in it
// goes to a following statement (it would otherwise see the execution as it
// was before the first one's change).
//
// f is the fleet's tenant filter: a row outside it is left unchanged
// (see tenantSQL).
func ReleaseExpiredLeases(ctx context.Context, db DB, partition int16, refs []LeaseRef, nowMs int64, f Filter) ([]ReleaseResult, error) {
	ids := make([]string, len(refs))
	idx := make([]int32, len(refs))
	for i, r := range refs {
		ids[i], idx[i] = r.ExecutionID, r.AttemptIndex
	}
	var r ReleaseResult
	return batch[ReleaseResult]{
		sql: releaseSQL,
		args: func(round []int) []any {
			return append([]any{partition, pick(ids, round), pick(idx, round), nowMs}, f.args()...)
		},
		dest: []any{&r.Released, &r.ExecFlipped, &r.ExecMissing, &r.RawFieldsMalformed, &r.EventID, &r.DeadlineMs},
		read: func() ReleaseResult {
			if !r.Released {
				r.ExecMissing = false
			}
			return r
		},
		what: "release lease", partition: partition,
		label: func(i int) string { return fmt.Sprintf("%s attempt %d", ids[i], idx[i]) },
	}.run(ctx, db, ids)
}
