package store

import "context"

// ExpiredWaitpoints are pending waitpoints whose expiry has passed, whatever
// their state (FlowFabric's suspend writes them 'active', create_waitpoint
// 'pending'; both expire). FlowFabric has no Postgres scan for them, only
// the per-row close_for_execution; this is the Valkey engine's
// pending_wp_expiry scanner over the Postgres columns, with the tenant
// filter applied through the waitpoint's execution. Index:
// ff_waitpoint_pending_expires_idx (partition_key, expires_at_ms) WHERE
// expires_at_ms IS NOT NULL.
var ExpiredWaitpoints = &Due{
	What:   "expired waitpoints",
	From:   "ff_waitpoint_pending r",
	Exec:   execJoin,
	Tenant: true,
	At:     "r.expires_at_ms",
	ID:     Key{"r.waitpoint_id", "uuid"},
	Index:  "ff_waitpoint_pending_expires_idx",
}

// WaitpointCloseResult says what CloseWaitpoints did to one waitpoint.
type WaitpointCloseResult struct {
	// Closed: under its row lock the waitpoint still existed with its
	// expiry passed, and it is deleted. False: a signal or a resume got
	// there first: nothing changed.
	Closed bool
	// ExecutionID and Key are the waitpoint's execution and the member_map
	// key its failure is recorded under (its waitpoint_key, or its id when
	// that is empty).
	ExecutionID, Key string
	// Marked: the execution's suspension existed and now holds the
	// never_committed marker under Key. False with Closed: no suspension
	// (the execution resumed another way); only the waitpoint was deleted.
	Marked bool
	// MemberMapReplaced holds the suspension's previous member_map (JSON
	// text) when it was not a JSON object and was replaced by one holding
	// the marker, as FlowFabric does.
	MemberMapReplaced string
	// ExecMissing: the waitpoint's execution row does not exist (the
	// waitpoint is closed all the same, as FlowFabric does).
	ExecMissing bool
	// DeadlineMs is the expiry the waitpoint had under its lock, when
	// Closed: the deadline its lateness is measured from.
	DeadlineMs int64
}

// lockWaitpointsSQL takes the row locks of a batch of waitpoints of one
// partition ($2 ids), whatever their expiry, as FlowFabric's
// SELECT … FOR UPDATE does before it decides. It runs just before
// closeWaitpointsSQL, in the same transaction and round trip (see
// batch.lock), so that statement's snapshot is taken once the locks are
// held: it sees the suspension a transaction it waited on created (a
// suspend that activated the pending waitpoint), which a statement that
// waited on the waitpoint's lock itself would not. Index: the primary key.
const lockWaitpointsSQL = `
SELECT w.waitpoint_id
  FROM ff_waitpoint_pending w
 WHERE w.partition_key = $1 AND w.waitpoint_id = ANY($2::uuid[])
 ORDER BY w.waitpoint_id
   FOR UPDATE OF w`

// closeWaitpointsSQL is FlowFabric's pending_wp_expiry close_for_execution
// as one statement, for a batch of waitpoints of one partition ($2 ids, in
// order; $3 now), run after lockWaitpointsSQL:
//   - wp locks each waitpoint and re-checks its expiry under the lock (a
//     signal that deleted it, or a cleared expiry, makes it match nothing);
//   - del deletes it, keeping its execution, its expiry (lateness is
//     measured from it) and the member_map key (the waitpoint_key, or the
//     waitpoint id when that is empty);
//   - marks gathers, per execution, the markers of all its waitpoints
//     closed here, so two waitpoints of one suspension in one batch both
//     land in its member_map (one UPDATE per row, each with every key);
//   - old locks the suspensions of the same partition and reads their
//     member_map under the lock (a signal that changed it meanwhile is
//     seen), before sus, which joins it, writes them: each key replaced
//     whole by {"status":"never_committed","closed_at_ms":now,
//     "source":"pending_wp_expiry"}, other keys kept, a member_map that is
//     not an object replaced by a new one. Nothing else changes: waking or
//     failing the execution is suspension_timeout's.
//
// Index: each table's primary key.
var closeWaitpointsSQL = `
WITH input AS (
    SELECT i.waitpoint_id, i.ord FROM unnest($2::uuid[]) WITH ORDINALITY AS i(waitpoint_id, ord)
), wp AS (
    SELECT w.waitpoint_id
      FROM ff_waitpoint_pending w
     WHERE w.partition_key = $1 AND w.waitpoint_id IN (SELECT waitpoint_id FROM input)
       AND w.expires_at_ms IS NOT NULL AND w.expires_at_ms < $3
       AND ` + tenantExecSQL("w.execution_id", 4) + `
     ORDER BY w.waitpoint_id
       FOR UPDATE OF w
), del AS (
    DELETE FROM ff_waitpoint_pending w
     USING wp
     WHERE w.partition_key = $1 AND w.waitpoint_id = wp.waitpoint_id
    RETURNING w.waitpoint_id, w.execution_id, w.expires_at_ms,
              CASE WHEN w.waitpoint_key = '' THEN w.waitpoint_id::text ELSE w.waitpoint_key END AS key
), marks AS (
    SELECT execution_id, jsonb_object_agg(key, jsonb_build_object(
               'status', 'never_committed', 'closed_at_ms', $3::bigint, 'source', 'pending_wp_expiry')) AS entries
      FROM del
     GROUP BY execution_id
), old AS (
    SELECT su.execution_id, su.member_map
      FROM ff_suspension_current su
     WHERE su.partition_key = $1 AND su.execution_id IN (SELECT execution_id FROM del)
     ORDER BY su.execution_id
       FOR UPDATE OF su
), sus AS (
    UPDATE ff_suspension_current su
       SET member_map = CASE WHEN jsonb_typeof(old.member_map) = 'object' THEN old.member_map ELSE '{}'::jsonb END
                        || marks.entries
      FROM marks JOIN old USING (execution_id)
     WHERE su.partition_key = $1 AND su.execution_id = marks.execution_id
    RETURNING su.execution_id
), ex AS (
    SELECT e.execution_id
      FROM ff_exec_core e
     WHERE e.partition_key = $1 AND e.execution_id IN (SELECT execution_id FROM del)
)
SELECT del.waitpoint_id IS NOT NULL,
       COALESCE(del.execution_id::text, ''),
       COALESCE(del.key, ''),
       sus.execution_id IS NOT NULL,
       COALESCE(CASE WHEN sus.execution_id IS NOT NULL AND jsonb_typeof(old.member_map) <> 'object'
                     THEN old.member_map::text END, ''),
       del.waitpoint_id IS NOT NULL AND ex.execution_id IS NULL,
       COALESCE(del.expires_at_ms, 0)
  FROM input i
  LEFT JOIN del ON del.waitpoint_id = i.waitpoint_id
  LEFT JOIN sus ON sus.execution_id = del.execution_id
  LEFT JOIN old ON old.execution_id = del.execution_id
  LEFT JOIN ex ON ex.execution_id = del.execution_id
 ORDER BY i.ord`

// CloseWaitpoints closes expired waitpoints of one partition, as
// FlowFabric's close_for_execution does, with one result per id in order.
// Each waitpoint is re-checked under its own row lock exactly as alone, and
// a second call changes nothing (the row is gone). db must also be able to
// send a batch, as for ExpireDeadlines.
//
// f is the fleet's tenant filter: a row outside it is left unchanged
// (see tenantSQL).
func CloseWaitpoints(ctx context.Context, db DB, partition int16, waitpointIDs []string, nowMs int64, f Filter) ([]WaitpointCloseResult, error) {
	var r WaitpointCloseResult
	return batch[WaitpointCloseResult]{
		sql: closeWaitpointsSQL,
		args: func(round []int) []any {
			return append([]any{partition, pick(waitpointIDs, round), nowMs}, f.args()...)
		},
		dest: []any{&r.Closed, &r.ExecutionID, &r.Key, &r.Marked, &r.MemberMapReplaced, &r.ExecMissing, &r.DeadlineMs},
		read: func() WaitpointCloseResult { return r },
		lock: lockWaitpointsSQL, lockArgs: 2,
		what: "close expired waitpoint", partition: partition,
	}.run(ctx, db, waitpointIDs)
}
