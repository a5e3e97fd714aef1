package store

import (
	"context"
)

// PastDeadlineExecutions are active executions whose execution deadline
// (deadline_at_ms) has passed. FlowFabric has no Postgres scan for them,
// only the per-row expire_for_execution; this is the Valkey engine's
// execution_deadline scanner over the Postgres columns. The phase condition
// is what keeps the overloaded column apart: deadline_at_ms also holds the
// delay-until of delayed executions (runnable + not_eligible_until_time),
// and the action does not clear it, so without the condition terminal rows
// would be due forever.
//
// Index: ff_exec_core_deadline_idx (partition_key, deadline_at_ms) WHERE
// deadline_at_ms IS NOT NULL. The index range (partition, deadline < now)
// also returns delayed executions past their delay-until and terminal
// executions that kept their deadline, which the phase condition filters
// out row by row: a probe or scan costs O(rows of the partition whose
// deadline_at_ms has passed), never the rows whose deadline is ahead.
var PastDeadlineExecutions = &Due{
	What:   "executions past their deadline",
	From:   "ff_exec_core r",
	Tenant: true,
	At:     "r.deadline_at_ms",
	Where:  "r.lifecycle_phase = 'active'",
	ID:     Key{"r.execution_id", "uuid"},
	Index:  "ff_exec_core_deadline_idx",
}

// DeadlineResult says what ExpireDeadlines did to one execution.
type DeadlineResult struct {
	// Applied: under its row lock the execution was still active with its
	// deadline passed; it is terminal now (public_state expired), its
	// current attempt (if it has one) ended with outcome expired, with an
	// `expired` completion event and an `expired` lease event. False: it had finished, or its deadline moved: nothing
	// changed.
	Applied bool
	// AttemptInterrupted: the execution's current attempt row existed and
	// was ended (outcome expired, lease released) (FlowFabric accepts an execution without one).
	AttemptInterrupted bool
	// RawFieldsMalformed: raw_fields is not a JSON object and was kept as
	// it was instead of taking last_failure_message.
	RawFieldsMalformed bool
	// EventID and CompletionEventID are the lease and completion events.
	EventID, CompletionEventID int64
	// DeadlineMs is the deadline the execution had under its lock, when
	// Applied: the deadline its lateness is measured from.
	DeadlineMs int64
}

// lockDeadlineExecutionsSQL takes the row locks of a batch of executions of
// one partition ($2 ids), whatever their state, as FlowFabric's
// SELECT … FOR UPDATE does before it decides. It runs just before
// expireDeadlinesSQL, in the same transaction and round trip (see
// batch.lock), so that statement's snapshot is taken once the locks are
// held: it sees the attempt row a transaction it waited on inserted (a
// reclaim that moved the execution on to a new attempt), which a statement
// that waited on the execution's lock itself would not (it re-reads the
// locked row only). Index: the primary key.
const lockDeadlineExecutionsSQL = `
SELECT e.execution_id
  FROM ff_exec_core e
 WHERE e.partition_key = $1 AND e.execution_id = ANY($2::uuid[])
 ORDER BY e.execution_id
   FOR UPDATE OF e`

// expireDeadlinesSQL is FlowFabric's execution_deadline
// expire_for_execution as one statement, for a batch of executions of one
// partition ($2 ids, in order; $3 now), run after
// lockDeadlineExecutionsSQL:
//   - ex locks each execution and re-checks it under the lock (still
//     active, deadline still passed): a completion or a moved deadline
//     committed meanwhile makes it match nothing; the deadline read there
//     is returned (lateness is measured from it);
//   - att ends the execution's current attempt (attempt_index of the
//     execution, older attempts untouched), if there is one, with outcome
//     `expired` (FlowFabric writes `interrupted`, from which its
//     read_execution_info derives no terminal outcome);
//   - up makes the execution terminal, as FlowFabric writes it, merging
//     last_failure_message into a raw_fields that is an object, with
//     public_state expired and no blocking reason, as FlowFabric's Valkey
//     engine writes it (its Postgres statement leaves the claim's
//     `running`); the deadline and attempt index are left as they are;
//   - ce and le write the `expired` completion and lease events with the
//     execution's namespace and instance tag (FlowFabric leaves the
//     completion event's NULL); the lease event is written even without an
//     attempt row, as FlowFabric does.
//
// Index: each table's primary key.
var expireDeadlinesSQL = `
WITH input AS (
    SELECT i.execution_id, i.ord FROM unnest($2::uuid[]) WITH ORDINALITY AS i(execution_id, ord)
), ex AS (
    SELECT e.execution_id, e.attempt_index, e.deadline_at_ms
      FROM ff_exec_core e
     WHERE e.partition_key = $1 AND e.execution_id IN (SELECT execution_id FROM input)
       AND e.lifecycle_phase = 'active' AND e.deadline_at_ms IS NOT NULL AND e.deadline_at_ms < $3
       AND ` + tenantSQL("e", 4) + `
     ORDER BY e.execution_id
       FOR UPDATE OF e
), att AS (
    UPDATE ff_attempt a
       SET outcome = 'expired',
           lease_expires_at_ms = NULL,
           terminal_at_ms = $3
      FROM ex
     WHERE a.partition_key = $1 AND a.execution_id = ex.execution_id AND a.attempt_index = ex.attempt_index
    RETURNING a.execution_id
), up AS (
    UPDATE ff_exec_core e
       SET lifecycle_phase = 'terminal',
           ownership_state = 'unowned',
           eligibility_state = 'not_applicable',
           attempt_state = 'attempt_terminal',
           terminal_at_ms = $3,
           public_state = 'expired',
           blocking_reason = NULL,
           raw_fields = CASE WHEN jsonb_typeof(e.raw_fields) = 'object'
                             THEN e.raw_fields || jsonb_build_object('last_failure_message', 'execution_deadline')
                             ELSE e.raw_fields END
      FROM ex
     WHERE e.partition_key = $1 AND e.execution_id = ex.execution_id
    RETURNING e.execution_id, e.flow_id, ex.deadline_at_ms, jsonb_typeof(e.raw_fields) = 'object' AS raw_ok,
              e.raw_fields->>'namespace' AS namespace, e.raw_fields->'tags'->>'cairn.instance_id' AS instance_tag
), ce AS (
    INSERT INTO ff_completion_event (partition_key, execution_id, flow_id, outcome, namespace, instance_tag, occurred_at_ms)
    SELECT $1, execution_id, flow_id, 'expired', namespace, instance_tag, $3
      FROM up
     ORDER BY execution_id
    RETURNING execution_id, event_id
), le AS (
    INSERT INTO ff_lease_event (execution_id, lease_id, event_type, occurred_at_ms, partition_key, namespace, instance_tag)
    SELECT execution_id::text, NULL, 'expired', $3, $1::int, namespace, instance_tag
      FROM up
     ORDER BY execution_id
    RETURNING execution_id, event_id
)
SELECT up.execution_id IS NOT NULL,
       att.execution_id IS NOT NULL,
       COALESCE(NOT up.raw_ok, false),
       COALESCE(le.event_id, 0),
       COALESCE(ce.event_id, 0),
       COALESCE(up.deadline_at_ms, 0)
  FROM input i
  LEFT JOIN up ON up.execution_id = i.execution_id
  LEFT JOIN att ON att.execution_id = i.execution_id
  LEFT JOIN le ON le.execution_id = i.execution_id::text
  LEFT JOIN ce ON ce.execution_id = i.execution_id
 ORDER BY i.ord`

// ExpireDeadlines expires executions of one partition whose deadline has
// passed, as FlowFabric's expire_for_execution does, with one result per id
// in order. Each is re-checked under its own row lock exactly as alone; an
// id repeated goes to a following statement, so it sees the first one's
// change (the execution terminal) as a second call would. db must also be
// able to send a batch (*pgxpool.Pool, *pgx.Conn and pgx.Tx can): each
// statement goes with its lock statement, in one round trip.
//
// f is the fleet's tenant filter: a row outside it is left unchanged
// (see tenantSQL).
func ExpireDeadlines(ctx context.Context, db DB, partition int16, executionIDs []string, nowMs int64, f Filter) ([]DeadlineResult, error) {
	var r DeadlineResult
	return batch[DeadlineResult]{
		sql: expireDeadlinesSQL,
		args: func(round []int) []any {
			return append([]any{partition, pick(executionIDs, round), nowMs}, f.args()...)
		},
		dest: []any{&r.Applied, &r.AttemptInterrupted, &r.RawFieldsMalformed, &r.EventID, &r.CompletionEventID, &r.DeadlineMs},
		read: func() DeadlineResult { return r },
		lock: lockDeadlineExecutionsSQL, lockArgs: 2,
		what: "expire execution past its deadline", partition: partition,
	}.run(ctx, db, executionIDs)
}
