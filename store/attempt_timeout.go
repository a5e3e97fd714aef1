package store

import (
	"context"
	"fmt"
)

// TimedOutAttempts are attempts whose lease lapsed while their execution is
// still active: FlowFabric's attempt_timeout scan (an inner join, so an
// attempt without its execution is never due). Index:
// ff_attempt_lease_expiry_idx (partition_key, lease_expires_at_ms) WHERE
// lease_expires_at_ms IS NOT NULL; each execution is read by its primary key.
var TimedOutAttempts = &Due{
	What:        "timed-out attempts",
	From:        "ff_attempt r",
	Exec:        execJoin,
	Tenant:      true,
	ExecInWhere: true,
	At:          "r.lease_expires_at_ms",
	Where:       "e.lifecycle_phase = 'active'",
	ID:          Key{"r.execution_id", "uuid"},
	N:           "r.attempt_index",
	Index:       "ff_attempt_lease_expiry_idx",
}

// TimedOutAttemptsShare is attempt timeout's share of the timed-out attempts
// when the fleet also runs lease expiry, which would otherwise take the same
// rows (docs/design.md, "Attempt timeout and lease expiry"): those whose
// execution declares retries (declaresRetriesSQL), which attempt timeout
// counts against them, retrying the execution or, once they are spent,
// ending it. Every other expired lease is lease expiry's
// (ExpiredLeasesShare): the two shares split ExpiredLeases with no row in
// both. Index: as TimedOutAttempts; the condition reads the execution the
// join already reads by its primary key.
var TimedOutAttemptsShare = &Due{
	What:        "timed-out attempts of executions declaring retries",
	From:        "ff_attempt r",
	Exec:        execJoin,
	Tenant:      true,
	ExecInWhere: true,
	At:          "r.lease_expires_at_ms",
	Where:       "e.lifecycle_phase = 'active' AND " + declaresRetriesSQL("e"),
	ID:          Key{"r.execution_id", "uuid"},
	N:           "r.attempt_index",
	Index:       "ff_attempt_lease_expiry_idx",
}

// AttemptTimeoutResult says what ExpireAttempts did to one attempt.
type AttemptTimeoutResult struct {
	// Applied: under the row locks the attempt's lease was still expired and
	// its execution still active; the attempt is interrupted, the execution
	// retried or terminal, and its `expired` lease event written. False
	// means a renewal, a completion or another reconciler got there first:
	// nothing changed.
	Applied bool
	// Retried: retries remained (the execution's attempt_index was below
	// its policy's retry_policy.max_retries), so the execution is runnable
	// again with the next attempt index (public_state waiting); else it is
	// terminal (public_state expired, its current attempt's outcome
	// expired), with an `expired` completion event.
	Retried bool
	// RawFieldsMalformed: the execution's raw_fields is not a JSON object;
	// last_failure_message could not be merged in, and raw_fields was kept
	// as it was.
	RawFieldsMalformed bool
	// PolicyMalformed holds retry_policy.max_retries as stored when it is
	// present but not a whole number from 0 to 2^32-1, which FlowFabric
	// reads as 0 retries ("" when absent or valid).
	PolicyMalformed string
	// EventID is the lease event; CompletionEventID the completion event
	// (0 when retried).
	EventID, CompletionEventID int64
	// DeadlineMs is the lease expiry the attempt had under its lock, when
	// Applied: the deadline its lateness is measured from.
	DeadlineMs int64
}

// expireAttemptsSQL is FlowFabric's attempt_timeout expire_one as one
// statement, for a batch of attempts of distinct executions of one
// partition ($2 execution ids, $3 attempt indexes, in order; $4 now):
//   - att locks each attempt and re-checks its lease (expired before now),
//     reading the expiry it had (the deadline lateness is measured from),
//     ex then locks each execution and re-checks that it is still active:
//     SELECT … FOR UPDATE re-evaluates its conditions on the newest
//     committed version, so a renewal, a completion or a concurrent
//     lease-expiry release makes the attempt match nothing, and nothing
//     else happens to it. Attempts are locked before executions, as
//     FlowFabric does.
//   - ex reads FlowFabric's extract_max_retries (maxRetriesNumberSQL,
//     retriesSQL): policy.retry_policy.max_retries when it is a JSON
//     unsigned integer that fits 32 bits, else 0 (absent, negative,
//     fractional, a string);
//   - up_att interrupts the attempt; up_ex retries the execution (runnable,
//     the next attempt index) when its attempt_index is below max_retries,
//     else makes it terminal; both merge last_failure_message into a
//     raw_fields that is an object and keep any other as it is. Beyond
//     FlowFabric's Postgres statement, which leaves the claim's `running`
//     and the attempt `interrupted`, they say what happened the way
//     FlowFabric's readers decode it: a retried execution is waiting
//     (waiting_for_worker), an ended one expired (no blocking reason), and
//     the outcome of its current attempt (the one up_att interrupts, or the
//     execution's newer one) is `expired`, from which read_execution_info
//     derives its terminal outcome;
//   - ce writes the `expired` completion event of a terminal execution and
//     le the `expired` lease event, both with the execution's namespace and
//     instance tag (FlowFabric leaves the completion event's NULL).
//
// Index: each table's primary key.
var expireAttemptsSQL = `
WITH input AS (
    SELECT i.execution_id, i.attempt_index, i.ord
      FROM unnest($2::uuid[], $3::int[]) WITH ORDINALITY AS i(execution_id, attempt_index, ord)
), att AS (
    SELECT a.execution_id, a.attempt_index, a.lease_expires_at_ms
      FROM ff_attempt a JOIN input i ON i.execution_id = a.execution_id AND i.attempt_index = a.attempt_index
     WHERE a.partition_key = $1 AND a.lease_expires_at_ms IS NOT NULL AND a.lease_expires_at_ms < $4
     ORDER BY a.execution_id
       FOR UPDATE OF a
), ex AS (
    SELECT e.execution_id, e.attempt_index,
           e.attempt_index < ` + retriesSQL("v.n") + ` AS retry,
           CASE WHEN p.mr IS NOT NULL AND NOT COALESCE(v.n <= 4294967295, false) THEN p.mr::text END AS bad_policy
      FROM ff_exec_core e
     CROSS JOIN LATERAL (SELECT e.policy->'retry_policy'->'max_retries' AS mr) p
     CROSS JOIN LATERAL (SELECT ` + maxRetriesNumberSQL("p.mr") + ` AS n) v
     WHERE e.partition_key = $1 AND e.execution_id IN (SELECT execution_id FROM att)
       AND e.lifecycle_phase = 'active'
       AND ` + tenantSQL("e", 5) + `
     ORDER BY e.execution_id
       FOR UPDATE OF e
), up_att AS (
    UPDATE ff_attempt a
       SET outcome = CASE WHEN ex.retry THEN 'interrupted' ELSE 'expired' END,
           lease_expires_at_ms = CASE WHEN a.attempt_index = att.attempt_index THEN NULL ELSE a.lease_expires_at_ms END,
           terminal_at_ms = CASE WHEN a.attempt_index = att.attempt_index THEN $4 ELSE a.terminal_at_ms END
      FROM att JOIN ex USING (execution_id)
     WHERE a.partition_key = $1 AND a.execution_id = att.execution_id
       AND a.attempt_index IN (att.attempt_index, CASE WHEN NOT ex.retry THEN ex.attempt_index END)
    RETURNING a.execution_id
), up_ex AS (
    UPDATE ff_exec_core e
       SET lifecycle_phase = CASE WHEN ex.retry THEN 'runnable' ELSE 'terminal' END,
           ownership_state = 'unowned',
           eligibility_state = CASE WHEN ex.retry THEN 'eligible_now' ELSE 'not_applicable' END,
           attempt_state = CASE WHEN ex.retry THEN 'pending_retry_attempt' ELSE 'attempt_terminal' END,
           attempt_index = CASE WHEN ex.retry THEN e.attempt_index + 1 ELSE e.attempt_index END,
           terminal_at_ms = CASE WHEN ex.retry THEN e.terminal_at_ms ELSE $4 END,
           public_state = CASE WHEN ex.retry THEN 'waiting' ELSE 'expired' END,
           blocking_reason = CASE WHEN ex.retry THEN 'waiting_for_worker' END,
           raw_fields = CASE WHEN jsonb_typeof(e.raw_fields) = 'object'
                             THEN e.raw_fields || jsonb_build_object('last_failure_message', 'attempt_timeout')
                             ELSE e.raw_fields END
      FROM ex
     WHERE e.partition_key = $1 AND e.execution_id = ex.execution_id
       AND e.execution_id IN (SELECT execution_id FROM up_att)
    RETURNING e.execution_id, e.flow_id, ex.retry, ex.bad_policy,
              jsonb_typeof(e.raw_fields) = 'object' AS raw_ok,
              e.raw_fields->>'namespace' AS namespace, e.raw_fields->'tags'->>'cairn.instance_id' AS instance_tag
), ce AS (
    INSERT INTO ff_completion_event (partition_key, execution_id, flow_id, outcome, namespace, instance_tag, occurred_at_ms)
    SELECT $1, execution_id, flow_id, 'expired', namespace, instance_tag, $4
      FROM up_ex WHERE NOT retry
     ORDER BY execution_id
    RETURNING execution_id, event_id
), le AS (
    INSERT INTO ff_lease_event (execution_id, lease_id, event_type, occurred_at_ms, partition_key, namespace, instance_tag)
    SELECT execution_id::text, NULL, 'expired', $4, $1::int, namespace, instance_tag
      FROM up_ex
     ORDER BY execution_id
    RETURNING execution_id, event_id
)
SELECT up_ex.execution_id IS NOT NULL,
       COALESCE(up_ex.retry, false),
       COALESCE(NOT up_ex.raw_ok, false),
       COALESCE(up_ex.bad_policy, ''),
       COALESCE(le.event_id, 0),
       COALESCE(ce.event_id, 0),
       COALESCE(CASE WHEN up_ex.execution_id IS NOT NULL THEN att.lease_expires_at_ms END, 0)
  FROM input i
  LEFT JOIN up_ex ON up_ex.execution_id = i.execution_id
  LEFT JOIN att ON att.execution_id = i.execution_id
  LEFT JOIN le ON le.execution_id = i.execution_id::text
  LEFT JOIN ce ON ce.execution_id = i.execution_id
 ORDER BY i.ord`

// ExpireAttempts applies FlowFabric's attempt timeout to attempts of one
// partition, with one result per ref in order: an attempt whose lease is
// still expired under its row lock, of an execution still active, is
// interrupted and its execution retried or made terminal. Each attempt is
// re-checked under its own locks exactly as alone, and a second call for
// the same attempt changes nothing (its lease is released). A second attempt
// of an execution already in the batch goes to a following statement, where
// it finds the execution no longer active, as it would alone.
//
// f is the fleet's tenant filter: a row outside it is left unchanged
// (see tenantSQL).
func ExpireAttempts(ctx context.Context, db DB, partition int16, refs []LeaseRef, nowMs int64, f Filter) ([]AttemptTimeoutResult, error) {
	ids := make([]string, len(refs))
	idx := make([]int32, len(refs))
	for i, r := range refs {
		ids[i], idx[i] = r.ExecutionID, r.AttemptIndex
	}
	var r AttemptTimeoutResult
	return batch[AttemptTimeoutResult]{
		sql: expireAttemptsSQL,
		args: func(round []int) []any {
			return append([]any{partition, pick(ids, round), pick(idx, round), nowMs}, f.args()...)
		},
		dest: []any{&r.Applied, &r.Retried, &r.RawFieldsMalformed, &r.PolicyMalformed, &r.EventID, &r.CompletionEventID, &r.DeadlineMs},
		read: func() AttemptTimeoutResult { return r },
		what: "expire timed-out attempt", partition: partition,
		label: func(i int) string { return fmt.Sprintf("%s attempt %d", ids[i], idx[i]) },
	}.run(ctx, db, ids)
}
