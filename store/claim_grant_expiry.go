package store

import "context"

// ExpiredClaimGrants are claim grants (ff_claim_grant, either kind: a
// scheduler's 'claim' or a 'reclaim') that no claim can consume any more:
// expires_at_ms is set (FlowFabric's claim_execution takes a grant whose
// expiry is 0 as never expiring; the 0017 backfill writes 0 for a legacy
// grant without one) and before now, claim_execution's own comparison
// (typed_ops.rs: a grant expired at expires_at_ms < now). The tenant filter
// applies through the grant's execution. FlowFabric has no Postgres scan for
// them: its migration 0017 leaves them to "a future reaper"; on Valkey a
// grant is a key that expires by its TTL, leaving its execution eligible.
//
// Index: ff_claim_grant_expiry_idx (expires_at_ms), FlowFabric's own
// (0017), built in each of the table's 256 hash children: a partition's
// probe and scan prune to the one child holding it and read that child's
// index from its oldest entry, filtering partition_key (a child holds one
// or a few partitions' rows), so a scan costs O(due rows of the child).
var ExpiredClaimGrants = &Due{
	What:   "expired claim grants",
	From:   "ff_claim_grant r",
	Exec:   execJoin,
	Tenant: true,
	At:     "r.expires_at_ms",
	Where:  "r.expires_at_ms > 0",
	ID:     Key{"encode(r.grant_id, 'hex')", "text"},
	Index:  "ff_claim_grant_expiry_idx",
}

// ClaimGrantExpiryResult says what ExpireClaimGrants did to one grant.
type ClaimGrantExpiryResult struct {
	// Deleted: under its row lock (and its execution's) the grant was
	// still expired, and it is deleted. False: a claim consumed it, or it
	// is gone: nothing changed.
	Deleted bool
	// ExecutionID and Kind are the grant's execution and kind, when
	// Deleted.
	ExecutionID, Kind string
	// Reset: the execution was runnable in pending_claim with no live grant
	// left, and it is eligible again: eligibility_state eligible_now,
	// public_state waiting, blocking_reason waiting_for_worker, as
	// FlowFabric's Valkey engine leaves an execution whose grant expired.
	// False with Deleted: the execution was claimed, or moved on, or holds
	// another live grant; only the grant was deleted.
	Reset bool
	// ExecMissing: the grant's execution row does not exist (the grant is
	// deleted all the same).
	ExecMissing bool
	// DeadlineMs is the expiry the grant had under its lock, when Deleted.
	DeadlineMs int64
}

// lockClaimGrantExecsSQL locks the executions of a batch of grants ($2 ids)
// FOR UPDATE, as FlowFabric's claims lock an execution before its grant
// (claim_execution, issue_grant_and_claim; the scheduler's pick and
// issue_reclaim_grant lock it before writing one). It runs just before
// expireClaimGrantsSQL, in the same transaction and round trip (batch.lock),
// so that statement's snapshot follows the locks: a claim that held the
// execution has committed (its grant consumed, the execution active), and
// no grant can be issued for the execution until the reset commits. Index:
// each table's primary key.
const lockClaimGrantExecsSQL = `
SELECT e.execution_id
  FROM ff_exec_core e
 WHERE e.partition_key = $1
   AND e.execution_id IN (SELECT g.execution_id FROM ff_claim_grant g
                           WHERE g.partition_key = $1
                             AND g.grant_id IN (SELECT decode(x, 'hex') FROM unnest($2::text[]) AS x))
 ORDER BY e.execution_id
   FOR UPDATE OF e`

// expireClaimGrantsSQL deletes a batch of expired grants of one partition
// ($2 ids, in order; $3 now; $4-$6 the tenant filter) and resets the
// executions they leave stranded, run after lockClaimGrantExecsSQL:
//   - g locks each grant (SKIP LOCKED: a grant a reclaim_execution holds,
//     which locks the grant before the execution, is left to the next tick
//     rather than waited for) and re-checks its expiry;
//   - del deletes it, whatever its execution's state;
//   - reset sets an execution of a deleted grant to eligible_now, with the
//     public_state and blocking_reason the Valkey engine has for an eligible
//     execution, when it is still runnable in pending_claim and no other
//     grant of it is live (expiry 0 or not before now; the NOT EXISTS
//     reads the statement's snapshot, taken after the execution's lock, so
//     it sees every grant issued for it). attempt_state and the rest are
//     kept, as the scheduler's grant changed only eligibility_state.
//
// Index: each table's primary key, ff_claim_grant_execution_idx for the
// execution's other grants.
var expireClaimGrantsSQL = `
WITH input AS (
    SELECT decode(i.hex, 'hex') AS grant_id, i.ord FROM unnest($2::text[]) WITH ORDINALITY AS i(hex, ord)
), g AS (
    SELECT c.grant_id
      FROM ff_claim_grant c
     WHERE c.partition_key = $1 AND c.grant_id IN (SELECT grant_id FROM input)
       AND c.expires_at_ms > 0 AND c.expires_at_ms < $3
       AND ` + tenantExecSQL("c.execution_id", 4) + `
     ORDER BY c.grant_id
       FOR UPDATE OF c SKIP LOCKED
), del AS (
    DELETE FROM ff_claim_grant c
     USING g
     WHERE c.partition_key = $1 AND c.grant_id = g.grant_id
    RETURNING c.grant_id, c.execution_id, c.kind, c.expires_at_ms
), reset AS (
    UPDATE ff_exec_core e
       SET eligibility_state = 'eligible_now',
           public_state = 'waiting',
           blocking_reason = 'waiting_for_worker'
     WHERE e.partition_key = $1 AND e.execution_id IN (SELECT execution_id FROM del)
       AND e.lifecycle_phase = 'runnable' AND e.eligibility_state = 'pending_claim'
       AND NOT EXISTS (SELECT 1 FROM ff_claim_grant o
                        WHERE o.partition_key = $1 AND o.execution_id = e.execution_id
                          AND o.grant_id NOT IN (SELECT grant_id FROM del)
                          AND (o.expires_at_ms <= 0 OR o.expires_at_ms >= $3))
    RETURNING e.execution_id
), ex AS (
    SELECT e.execution_id
      FROM ff_exec_core e
     WHERE e.partition_key = $1 AND e.execution_id IN (SELECT execution_id FROM del)
)
SELECT del.grant_id IS NOT NULL,
       COALESCE(del.execution_id::text, ''),
       COALESCE(del.kind, ''),
       reset.execution_id IS NOT NULL,
       del.grant_id IS NOT NULL AND ex.execution_id IS NULL,
       COALESCE(del.expires_at_ms, 0)
  FROM input i
  LEFT JOIN del ON del.grant_id = i.grant_id
  LEFT JOIN reset ON reset.execution_id = del.execution_id
  LEFT JOIN ex ON ex.execution_id = del.execution_id
 ORDER BY i.ord`

// ExpireClaimGrants deletes expired claim grants of one partition and makes
// the executions they stranded in pending_claim eligible again, with one
// result per grant id (as a scan returns it: the bytea in hex, no \x) in
// order. Each grant is re-checked under its execution's lock and its own;
// a claim that consumes the grant at that moment wins (the grant is gone
// when this reads it), and a second call changes nothing. db must also be
// able to send a batch, as for CloseWaitpoints.
//
// f is the fleet's tenant filter: a grant whose execution is outside it
// (or missing, with a filter set) is left unchanged (see tenantSQL).
func ExpireClaimGrants(ctx context.Context, db DB, partition int16, grantIDs []string, nowMs int64, f Filter) ([]ClaimGrantExpiryResult, error) {
	var r ClaimGrantExpiryResult
	return batch[ClaimGrantExpiryResult]{
		sql: expireClaimGrantsSQL,
		args: func(round []int) []any {
			return append([]any{partition, pick(grantIDs, round), nowMs}, f.args()...)
		},
		dest: []any{&r.Deleted, &r.ExecutionID, &r.Kind, &r.Reset, &r.ExecMissing, &r.DeadlineMs},
		read: func() ClaimGrantExpiryResult { return r },
		lock: lockClaimGrantExecsSQL, lockArgs: 2,
		what: "expire claim grant", partition: partition,
	}.run(ctx, db, grantIDs)
}
