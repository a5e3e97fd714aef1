package store

import (
	"context"
)

// TimedOutSuspensions are suspensions whose timeout has lapsed. A scan does
// not read the timeout behaviour: the row action reads it under the row
// lock, so a behaviour changed since the scan is honoured. Index:
// ff_suspension_current_timeout_idx (partition_key, timeout_at_ms) WHERE
// timeout_at_ms IS NOT NULL.
var TimedOutSuspensions = &Due{
	What:   "timed-out suspensions",
	From:   "ff_suspension_current r",
	Exec:   execJoin,
	Tenant: true,
	At:     "r.timeout_at_ms",
	ID:     Key{"r.execution_id", "uuid"},
	Index:  "ff_suspension_current_timeout_idx",
}

// Timeout behaviours, as stored in ff_suspension_current.timeout_behavior.
const (
	TimeoutFail       = "fail" // also what NULL and unknown values mean
	TimeoutCancel     = "cancel"
	TimeoutExpire     = "expire"
	TimeoutEscalate   = "escalate"
	TimeoutAutoResume = "auto_resume_with_timeout_signal"
)

// SuspensionExpireResult says what ExpireSuspension did.
type SuspensionExpireResult struct {
	// Applied: the suspension still existed with a lapsed timeout under its
	// row lock, its execution was still suspended (or its row missing), and
	// its behaviour was applied. False means a resume or a timeout change
	// got there first: nothing changed, but for NotSuspended.
	Applied bool
	// NotSuspended is the lifecycle phase of an execution found no longer
	// suspended under its lock while its suspension's timeout had lapsed
	// (FlowFabric's deliver_signal resumes an execution and leaves its
	// suspension and timeout in place): the execution was left untouched,
	// no event written, and the suspension's timeout cleared so that it is
	// not due again. "" otherwise.
	NotSuspended string
	// Behavior is the stored timeout_behavior read under the lock ("" for
	// NULL).
	Behavior string
	// Action is the behaviour applied: one of the Timeout* constants. NULL
	// and unknown behaviours are applied as TimeoutFail.
	Action string
	// UnknownBehavior: Behavior is none of the known values and was applied
	// as fail.
	UnknownBehavior bool
	// DeadlineMs is the timeout the suspension had under its lock, when
	// Applied: the deadline its lateness is measured from.
	DeadlineMs int64

	// Terminal actions (every action but TimeoutAutoResume).

	// ExecMissing: no ff_exec_core row exists for the suspension. The
	// suspension was deleted but, as in FlowFabric, no completion event was
	// written (its INSERT … SELECT reads the execution row).
	ExecMissing bool
	// RawFieldsMalformed: the execution's raw_fields is not a JSON object;
	// the lifecycle columns were set but raw_fields was kept as it was
	// instead of being turned into an array.
	RawFieldsMalformed bool
	// Outcome is the completion event's outcome: cancelled or expired.
	Outcome string
	// EventID is the ff_completion_event row written (0 when ExecMissing).
	EventID int64

	// Auto-resume.

	// TimeoutSignals is the number of entries in member_map.__timeout__
	// after the append (0 when the signal was dropped).
	TimeoutSignals int
	// MemberMapReplaced holds the previous member_map (JSON text) when it
	// was not an object and was replaced by a new one, as the seed does.
	MemberMapReplaced string
	// TimeoutEntryNotArray holds the JSON type of member_map.__timeout__
	// when it exists but is not an array. As in the seed, the value is kept
	// and the timeout signal is dropped; the timeout is still cleared.
	TimeoutEntryNotArray string
}

// expireSuspensionSQL is the seed's expire_one transaction as one statement,
// for a batch of suspensions of one partition, acting only on executions
// still suspended. Parameters: $1 partition, $2 execution ids (distinct, in
// order), $3 now (ms).
//
//   - sus locks each suspension and re-checks its deadline. Under READ
//     COMMITTED, SELECT … FOR UPDATE waits for a concurrent writer and then
//     re-evaluates its WHERE clause against the newest committed version: a
//     resume that deleted the row, or a timeout cleared or moved to the
//     future, makes it return nothing for that row, and then nothing else
//     happens to it. The behaviour, member_map and the timeout (the
//     deadline the caller measures lateness from) are read from that
//     locked version. The later CTEs reach the rows only through sus, so
//     they run after the locks are taken, which are taken in execution id
//     order, suspension first (the seed's order, and deliver_signal's).
//   - ex then locks each execution and reads its phase from the newest
//     committed version (FOR UPDATE returns the version it locked). Only a
//     suspended execution is acted on: FlowFabric's deliver_signal leaves a
//     satisfied suspension in place, its lapsed timeout too, on an
//     execution it made runnable (public_state resumable), which a worker
//     may have claimed since; the seed would end it. Valkey cannot:
//     ff_expire_suspension requires the execution suspended, and a signal
//     removes the suspension from the timeout index.
//   - stale is that removal here: for an execution no longer suspended
//     (resumable, active, terminal) it clears the suspension's timeout and
//     nothing else, so the suspension is never due again, and keeps the row
//     (its member_map is what the resumed worker's observe_signals reads);
//   - resume appends the synthetic timeout signal to member_map.__timeout__
//     and clears timeout_at_ms, so the row never fires again;
//   - del deletes the suspension for the terminal behaviours (also when
//     the execution row is missing, as the seed does);
//   - ec makes the execution terminal as the seed writes it, keeping a
//     raw_fields that is not an object unchanged, with the public_state
//     FlowFabric's Valkey engine writes for the behaviour (failed,
//     cancelled, expired; escalate, which Postgres makes terminal, expired)
//     and no blocking reason, where the seed leaves `suspended`;
//   - att gives the execution's current attempt the outcome
//     read_execution_info derives the terminal outcome from (failed,
//     cancelled, expired), where suspend left `attempt_interrupted`;
//   - ev writes the completion event from the execution row (none when it
//     is missing, as the seed's INSERT … SELECT does), with the seed's
//     outcome and namespace and instance tag copied from the execution,
//     which FlowFabric leaves NULL.
//
// The partition is a constant so the planner prunes to one child of each
// table. Index: each table's primary key.
var expireSuspensionSQL = `
WITH input AS (
    SELECT i.execution_id, i.ord FROM unnest($2::uuid[]) WITH ORDINALITY AS i(execution_id, ord)
), sus AS (
    SELECT su.execution_id, su.timeout_behavior, su.member_map, su.timeout_at_ms,
           CASE WHEN su.timeout_behavior = 'auto_resume_with_timeout_signal' THEN 'auto_resume_with_timeout_signal'
                WHEN su.timeout_behavior IN ('fail', 'cancel', 'expire', 'escalate') THEN su.timeout_behavior
                ELSE 'fail' END AS action
      FROM ff_suspension_current su
     WHERE su.partition_key = $1 AND su.execution_id IN (SELECT execution_id FROM input)
       AND su.timeout_at_ms IS NOT NULL AND su.timeout_at_ms < $3
       AND ` + tenantExecSQL("su.execution_id", 4) + `
     ORDER BY su.execution_id
       FOR UPDATE OF su
), ex AS (
    SELECT e.execution_id, e.lifecycle_phase, e.attempt_index
      FROM ff_exec_core e
     WHERE e.partition_key = $1 AND e.execution_id IN (SELECT execution_id FROM sus)
     ORDER BY e.execution_id
       FOR UPDATE OF e
), st AS (
    SELECT sus.execution_id, sus.action, sus.member_map, ex.attempt_index, ex.lifecycle_phase,
           ex.execution_id IS NULL OR ex.lifecycle_phase = 'suspended' AS acts
      FROM sus LEFT JOIN ex ON ex.execution_id = sus.execution_id
), sig AS (
    SELECT jsonb_build_array(jsonb_build_object(
               'signal_name', 'timeout', 'payload', NULL,
               'delivered_at_ms', $3::bigint, 'source', 'suspension_timeout')) AS entry
), resume AS (
    UPDATE ff_suspension_current su
       SET member_map = CASE
               WHEN jsonb_typeof(st.member_map) <> 'object' THEN jsonb_build_object('__timeout__', sig.entry)
               WHEN NOT st.member_map ? '__timeout__' THEN st.member_map || jsonb_build_object('__timeout__', sig.entry)
               WHEN jsonb_typeof(st.member_map->'__timeout__') = 'array'
                   THEN jsonb_set(st.member_map, '{__timeout__}', (st.member_map->'__timeout__') || sig.entry)
               ELSE st.member_map END,
           timeout_at_ms = NULL
      FROM st, sig
     WHERE su.partition_key = $1 AND su.execution_id = st.execution_id
       AND st.acts AND st.action = 'auto_resume_with_timeout_signal'
    RETURNING su.execution_id, su.member_map
), stale AS (
    UPDATE ff_suspension_current su
       SET timeout_at_ms = NULL
      FROM st
     WHERE su.partition_key = $1 AND su.execution_id = st.execution_id AND NOT st.acts
    RETURNING su.execution_id
), del AS (
    DELETE FROM ff_suspension_current su
     USING st
     WHERE su.partition_key = $1 AND su.execution_id = st.execution_id
       AND st.acts AND st.action <> 'auto_resume_with_timeout_signal'
    RETURNING su.execution_id, st.action, st.attempt_index,
              CASE st.action WHEN 'fail' THEN 'failed' WHEN 'cancel' THEN 'cancelled' ELSE 'expired' END AS ended
), ec AS (
    UPDATE ff_exec_core e
       SET lifecycle_phase = 'terminal',
           ownership_state = 'unowned',
           eligibility_state = 'not_applicable',
           attempt_state = 'attempt_terminal',
           public_state = del.ended,
           blocking_reason = NULL,
           terminal_at_ms = $3,
           cancellation_reason = 'suspension_timeout_' || del.action,
           raw_fields = CASE WHEN jsonb_typeof(e.raw_fields) = 'object'
                             THEN e.raw_fields || jsonb_build_object('last_failure_message', 'suspension_timeout')
                             ELSE e.raw_fields END
      FROM del
     WHERE e.partition_key = $1 AND e.execution_id = del.execution_id
    RETURNING e.execution_id, e.flow_id, e.raw_fields->>'namespace' AS namespace,
              e.raw_fields->'tags'->>'cairn.instance_id' AS instance_tag,
              jsonb_typeof(e.raw_fields) = 'object' AS raw_ok,
              CASE WHEN del.action = 'cancel' THEN 'cancelled' ELSE 'expired' END AS outcome
), att AS (
    UPDATE ff_attempt a
       SET outcome = del.ended
      FROM del
     WHERE a.partition_key = $1 AND a.execution_id = del.execution_id AND a.attempt_index = del.attempt_index
    RETURNING a.execution_id
), ev AS (
    INSERT INTO ff_completion_event (partition_key, execution_id, flow_id, outcome, namespace, instance_tag, occurred_at_ms)
    SELECT $1, ec.execution_id, ec.flow_id, ec.outcome, ec.namespace, ec.instance_tag, $3
      FROM ec
     ORDER BY ec.execution_id
    RETURNING execution_id, event_id
)
SELECT COALESCE(st.acts, false),
       sus.timeout_behavior,
       COALESCE(sus.action, ''),
       del.execution_id IS NOT NULL AND ec.execution_id IS NULL,
       COALESCE(NOT ec.raw_ok, false),
       COALESCE(ec.outcome, ''),
       COALESCE(ev.event_id, 0),
       COALESCE(CASE WHEN jsonb_typeof(resume.member_map->'__timeout__') = 'array'
                     THEN jsonb_array_length(resume.member_map->'__timeout__') END, 0),
       COALESCE(CASE WHEN resume.execution_id IS NOT NULL AND jsonb_typeof(sus.member_map) <> 'object'
                     THEN sus.member_map::text END, ''),
       COALESCE(CASE WHEN resume.execution_id IS NOT NULL AND jsonb_typeof(sus.member_map) = 'object'
                      AND jsonb_typeof(sus.member_map->'__timeout__') <> 'array'
                     THEN jsonb_typeof(sus.member_map->'__timeout__') END, ''),
       COALESCE(CASE WHEN st.acts THEN sus.timeout_at_ms END, 0),
       COALESCE(CASE WHEN stale.execution_id IS NOT NULL THEN st.lifecycle_phase END, '')
  FROM input i
  LEFT JOIN sus ON sus.execution_id = i.execution_id
  LEFT JOIN st ON st.execution_id = i.execution_id
  LEFT JOIN resume ON resume.execution_id = i.execution_id
  LEFT JOIN stale ON stale.execution_id = i.execution_id
  LEFT JOIN del ON del.execution_id = i.execution_id
  LEFT JOIN ec ON ec.execution_id = i.execution_id
  LEFT JOIN ev ON ev.execution_id = i.execution_id
 ORDER BY i.ord`

// ExpireSuspension applies the timeout behaviour of one suspension if, under
// its row lock, it still exists with a timeout lapsed at nowMs and its
// execution is still suspended (see SuspensionExpireResult.NotSuspended for
// one that is not). It runs in
// one statement (one implicit transaction when db is a pool), so the check
// and the change are atomic and a second call for the same suspension is a
// no-op: the terminal behaviours delete the row and auto-resume clears its
// timeout.
//
// One statement rather than a transaction with SELECT … FOR UPDATE: the
// branches differ only in which data-modifying CTE matches, the outcome
// comes back in the same round trip, and the package's other row actions
// have the same shape.
func ExpireSuspension(ctx context.Context, db DB, partition int16, executionID string, nowMs int64, f Filter) (SuspensionExpireResult, error) {
	return one(ExpireSuspensions(ctx, db, partition, []string{executionID}, nowMs, f))
}

// ExpireSuspensions is ExpireSuspension for several suspensions of one
// partition, with one result per execution id in order. Each suspension is
// re-checked under its own lock exactly as alone; an id repeated goes to a
// following statement, so it sees the first one's change as a second call
// would.
//
// f is the fleet's tenant filter: a row outside it is left unchanged
// (see tenantSQL).
func ExpireSuspensions(ctx context.Context, db DB, partition int16, executionIDs []string, nowMs int64, f Filter) ([]SuspensionExpireResult, error) {
	var (
		r        SuspensionExpireResult
		behavior *string // NULL (means fail) and '' (unknown) must differ
	)
	return batch[SuspensionExpireResult]{
		sql: expireSuspensionSQL,
		args: func(round []int) []any {
			return append([]any{partition, pick(executionIDs, round), nowMs}, f.args()...)
		},
		dest: []any{&r.Applied, &behavior, &r.Action, &r.ExecMissing, &r.RawFieldsMalformed, &r.Outcome,
			&r.EventID, &r.TimeoutSignals, &r.MemberMapReplaced, &r.TimeoutEntryNotArray, &r.DeadlineMs, &r.NotSuspended},
		read: func() SuspensionExpireResult {
			res := r
			res.Behavior = ""
			if behavior != nil {
				res.Behavior = *behavior
			}
			res.UnknownBehavior = res.Applied && behavior != nil && *behavior != res.Action
			return res
		},
		what: "expire suspension", partition: partition,
	}.run(ctx, db, executionIDs)
}
