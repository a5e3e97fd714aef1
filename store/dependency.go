package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Dependency resolution: FlowFabric's dependency reconciler and the dispatch
// cascade it runs (ff-backend-postgres dispatch.rs, reconcilers/
// dependency.rs; ../shared/flowfabric/dependency.md). A completion event
// nobody dispatched is claimed by flipping its dispatched_at_ms, and every
// edge out of its execution advances its downstream's edge group: counters,
// policy decision, the downstream made eligible or skipped, sibling-cancel
// groups queued.
//
// What differs from FlowFabric, on purpose:
//
//   - The claim and every hop of an event are one transaction. FlowFabric
//     commits the claim first and each hop in its own transaction, so a
//     crash, a non-retried error or a hop out of retries after the claim
//     loses the event's remaining hops for good (its reconciler sees only
//     unclaimed events). Here a failure rolls the claim back with the hops:
//     the event is unclaimed again and dispatched whole by a retry or a
//     later scan. Each edge is advanced exactly once, by whoever flips
//     dispatched_at_ms first; the claim stays that lock, shared with
//     FlowFabric's own dispatcher (its autocommit claim waits for ours and
//     then finds the event claimed, or ours finds FlowFabric's).
//   - READ COMMITTED with the group locked FOR UPDATE, not SERIALIZABLE: the
//     lock serialises the hops of one group, and READ COMMITTED reads the
//     row as its last holder committed it once the lock is granted, so a
//     hot fan-in group contended by several dispatchers queues on its lock
//     instead of failing serialisation (FlowFabric's three tries then lose
//     the hop). Hops of one event lock their groups in downstream order, so
//     two events sharing groups cannot deadlock on them.
//   - The skipped event written for an impossible downstream carries that
//     execution's namespace and cairn.instance_id tag, as the fleet's other
//     completion events do (FlowFabric writes NULL, so a filtered dispatcher
//     stops an impossible cascade after one hop), and the caller dispatches
//     it in the same commit (DispatchHook) instead of after the threshold.

// CompletionEvents are ff_completion_event rows not yet dispatched, due once
// committed_at_ms is older than the stale threshold (Reconciler.Behind: the
// tick and the scan compare with now less it, strictly, as FlowFabric's
// reconciler does) and taken oldest committed first. The tenant filter reads
// the event's own namespace and instance_tag columns, the tag by value (see
// Due.TenantColumns; the column is text, so TagText). Index: ff_completion_event_pending_dispatch_idx
// (partition_key, committed_at_ms) WHERE dispatched_at_ms IS NULL.
var CompletionEvents = &Due{
	What:          "undispatched completion events",
	From:          "ff_completion_event r",
	Tenant:        true,
	TenantColumns: true,
	// The instance_tag column is text: a tag the writer copied from a
	// number (raw_fields->'tags'->>'cairn.instance_id') matches its text.
	TagText: true,
	At:      "r.committed_at_ms",
	Where:   "r.dispatched_at_ms IS NULL",
	ID:      Key{"r.event_id", "bigint"},
	Index:   "ff_completion_event_pending_dispatch_idx",
}

// PolicyKind is an edge group's dependency policy kind.
type PolicyKind int

// Policy kinds, FlowFabric's EdgeDependencyPolicy.
const (
	AllOf PolicyKind = iota + 1
	AnyOf
	Quorum
)

func (k PolicyKind) String() string {
	return outcomeName(k, "PolicyKind", "all_of", "any_of", "quorum")
}

// EdgePolicy is an edge group's policy as FlowFabric's dispatcher decodes it.
type EdgePolicy struct {
	Kind PolicyKind
	// K is a quorum's k, as FlowFabric's `k as i32` leaves it (a k of 2^31
	// or more wraps negative).
	K int32
	// LetRun: on_satisfied is "let_run"; otherwise the siblings left are
	// cancelled (cancel_remaining, FlowFabric's default).
	LetRun bool
}

// quorumK is what FlowFabric's as_u64 accepts: a JSON number written as an
// unsigned integer (Postgres prints a jsonb number as it stores it, so 3.0
// stays 3.0 and is not one).
var quorumK = regexp.MustCompile(`^[0-9]+$`)

// DecodePolicy decodes ff_edge_group.policy (its JSON text) with FlowFabric's
// defaults (dispatch.rs decode_policy): a policy that is not an object, or
// whose kind is absent, not a string or unknown, is all_of; a quorum's k that
// is not an unsigned integer of at most 2^32-1 is 1; on_satisfied other than
// the string "let_run" is cancel_remaining. odd reports a policy FlowFabric
// never writes (not an object, or a kind it does not know), so the caller
// can warn about the row.
func DecodePolicy(raw []byte) (p EdgePolicy, odd bool) {
	p = EdgePolicy{Kind: AllOf}
	var obj map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(raw))
	if err := dec.Decode(&obj); err != nil || obj == nil {
		return p, true
	}
	var kind string
	if err := json.Unmarshal(obj["kind"], &kind); err != nil {
		return p, true
	}
	var onSatisfied string
	_ = json.Unmarshal(obj["on_satisfied"], &onSatisfied) // not a string: cancel_remaining
	p.LetRun = onSatisfied == "let_run"
	switch kind {
	case "all_of":
		p.LetRun = false
		return p, false
	case "any_of":
		p.Kind = AnyOf
	case "quorum":
		p.Kind, p.K = Quorum, 1
		if k := string(bytes.TrimSpace(obj["k"])); quorumK.MatchString(k) {
			if n, err := strconv.ParseUint(k, 10, 32); err == nil {
				p.K = int32(uint32(n)) //nolint:gosec // FlowFabric's `k as i32` wraps the same way
			}
		}
	default:
		return EdgePolicy{Kind: AllOf}, true
	}
	return p, false
}

// Decision is what an edge group's counters say of its downstream.
type Decision int

// Decisions, FlowFabric's dispatch.rs Decision.
const (
	Pending Decision = iota + 1
	Satisfied
	Impossible
)

func (d Decision) String() string {
	return outcomeName(d, "Decision", "pending", "satisfied", "impossible")
}

// Decide is FlowFabric's evaluate: the decision on the counters after an
// event (total = success + fail + skip + running), first match wins, and
// whether a satisfied group cancels the siblings left.
func Decide(p EdgePolicy, success, fail, skip, total int32) (d Decision, cancelSiblings bool) {
	nonsuccess := fail + skip
	switch p.Kind {
	case AnyOf:
		switch {
		case success >= 1:
			return Satisfied, !p.LetRun
		case nonsuccess >= total && total > 0:
			return Impossible, false
		}
	case Quorum:
		switch {
		case success >= p.K:
			return Satisfied, !p.LetRun
		case total-nonsuccess < p.K:
			return Impossible, false
		}
	default:
		switch {
		case success == total && total > 0:
			return Satisfied, false
		case nonsuccess > 0:
			return Impossible, false
		}
	}
	return Pending, false
}

// Bucket is the counter an event's outcome advances.
type Bucket int

// Buckets: "success", "skipped", and anything else a failure (FlowFabric's
// OutcomeKind::from_str).
const (
	BucketSuccess Bucket = iota + 1
	BucketFail
	BucketSkip
)

// BucketOf returns the counter outcome advances, and whether the outcome is
// one FlowFabric writes (an unknown one counts as a failure, as there).
func BucketOf(outcome string) (b Bucket, known bool) {
	switch outcome {
	case "success":
		return BucketSuccess, true
	case "skipped":
		return BucketSkip, true
	case "failed", "cancelled", "expired", "timed_out", "resumable":
		return BucketFail, true
	}
	return BucketFail, false
}

// CompletionOutcome is what DispatchCompletion did with an event.
type CompletionOutcome int

// Completion outcomes.
const (
	// CompletionDispatched: this call claimed the event and advanced every
	// edge out of its execution, in one commit.
	CompletionDispatched CompletionOutcome = iota + 1
	// CompletionAlreadyDispatched: the event was already claimed (by
	// FlowFabric or an earlier job) or is gone; nothing changed.
	CompletionAlreadyDispatched
	// CompletionOutsideTenant: the event is undispatched but outside the
	// fleet's filter; nothing changed.
	CompletionOutsideTenant
)

func (o CompletionOutcome) String() string {
	return outcomeName(o, "CompletionOutcome", "dispatched", "already_dispatched", "outside_tenant")
}

// Hop is one edge advanced by a dispatch.
type Hop struct {
	DownstreamEID string
	// Decision is the group's decision after the event; zero when the
	// group row is missing (FlowFabric counts the edge as advanced and
	// changes nothing).
	Decision Decision
	// Changed: the downstream's row was updated (eligible, or skipped).
	Changed bool
	// Flagged: the group's sibling-cancel flag was raised and its pending
	// cancel group queued.
	Flagged bool
	// SkipEventID is the skipped completion event written for an impossible
	// downstream (0 when none was).
	SkipEventID int64
	// GroupMissing: no ff_edge_group row for the edge's downstream.
	GroupMissing bool
	// DownstreamMissing: the group was decided but its downstream has no
	// ff_exec_core row (nothing to make eligible or skip).
	DownstreamMissing bool
	// OddPolicy: the group's policy is not one FlowFabric writes; it was
	// read with FlowFabric's defaults (all_of).
	OddPolicy bool
}

// CompletionResult says what DispatchCompletion did.
type CompletionResult struct {
	Outcome      CompletionOutcome
	ExecutionID  string
	FlowID       string // "" for a standalone execution
	EventOutcome string
	// UnknownOutcome: the event's outcome is none FlowFabric writes; it
	// counted as a failure, as there.
	UnknownOutcome bool
	// CommittedAtMs is the event's committed_at_ms (its lateness origin).
	CommittedAtMs int64
	Hops          []Hop
}

// SkipEvents returns the partition's skipped completion events the dispatch
// wrote, to be dispatched at once.
func (r CompletionResult) SkipEvents() []int64 {
	var ids []int64
	for _, h := range r.Hops {
		if h.SkipEventID != 0 {
			ids = append(ids, h.SkipEventID)
		}
	}
	return ids
}

// DispatchHook runs inside a dispatch's transaction after its hops, before
// the commit: the fleet enqueues the dispatch of the skipped events the
// hops wrote there, so they commit together or not at all.
type DispatchHook func(ctx context.Context, tx pgx.Tx, res CompletionResult) error

// dispatchTries is how often a dispatch transaction that failed on contention
// (serialisation failure, deadlock, lock timeout: it rolled back, claim
// included) runs again at once before its error is returned; the event stays
// unclaimed either way, so a retry of the job or a later scan dispatches it.
const dispatchTries = 3

// DispatchCompletion dispatches one completion event in one transaction: it
// claims the event (dispatched_at_ms = nowMs where it is NULL), advances every
// edge out of its execution in downstream order, runs hook (may be nil) and
// commits. An event already claimed, gone or outside f changes nothing. An
// error leaves nothing behind: the claim rolls back with the hops.
//
// Index: ff_completion_event's primary key (partition_key, event_id) for the
// claim, ff_edge_upstream_idx for the edges, ff_edge_group's and
// ff_exec_core's primary keys for each hop.
func DispatchCompletion(ctx context.Context, db Beginner, partition int16, eventID, nowMs int64, f Filter, hook DispatchHook) (CompletionResult, error) {
	var res CompletionResult
	var err error
	for try := 1; ; try++ {
		res = CompletionResult{}
		err = inTx(ctx, db, func(tx pgx.Tx) (bool, error) {
			if err := dispatchInTx(ctx, tx, partition, eventID, nowMs, f, &res); err != nil || res.Outcome != CompletionDispatched {
				return false, err
			}
			if hook != nil {
				if err := hook(ctx, tx, res); err != nil {
					return false, err
				}
			}
			return true, nil
		})
		if err == nil || !isContention(err) || try == dispatchTries || ctx.Err() != nil {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(try*5) * time.Millisecond):
		}
	}
	if err != nil {
		return CompletionResult{}, fmt.Errorf("dispatch completion event %d/%d: %w", partition, eventID, err)
	}
	return res, nil
}

// isContention reports a transaction Postgres rolled back for contention:
// serialization_failure, deadlock_detected or lock_not_available (the codes
// FlowFabric's dispatcher retries).
func isContention(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01" || pgErr.Code == "55P03")
}

// claimSQL claims the event and reads the edges out of its execution in one
// statement, ordered by downstream (the order hops lock their groups in).
// $1 partition, $2 event id, $3 now; the tenant filter follows.
const claimSQL = `
WITH c AS (
    UPDATE ff_completion_event r SET dispatched_at_ms = $3
     WHERE r.partition_key = $1 AND r.event_id = $2 AND r.dispatched_at_ms IS NULL%s
    RETURNING r.execution_id, r.flow_id, r.outcome, r.committed_at_ms)
SELECT c.execution_id::text, COALESCE(c.flow_id::text, ''), c.outcome, c.committed_at_ms, COALESCE(e.downstream_eid::text, '')
  FROM c LEFT JOIN ff_edge e ON e.partition_key = $1 AND e.flow_id = c.flow_id AND e.upstream_eid = c.execution_id
 ORDER BY e.downstream_eid, e.edge_id`

func dispatchInTx(ctx context.Context, tx pgx.Tx, partition int16, eventID, nowMs int64, f Filter, res *CompletionResult) error {
	p := params{partition, eventID, nowMs}
	rows, err := tx.Query(ctx, fmt.Sprintf(claimSQL, f.columnsSQL(&p, "r")), p...)
	if err != nil {
		return fmt.Errorf("claim: %w", err)
	}
	type claimRow struct {
		exec, flow, outcome string
		committedAtMs       int64
		down                string
	}
	claim, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (claimRow, error) {
		var x claimRow
		err := r.Scan(&x.exec, &x.flow, &x.outcome, &x.committedAtMs, &x.down)
		return x, err
	})
	if err != nil {
		return fmt.Errorf("claim: %w", err)
	}
	if len(claim) == 0 {
		return probeUnclaimed(ctx, tx, partition, eventID, res)
	}
	res.ExecutionID, res.FlowID, res.EventOutcome, res.CommittedAtMs = claim[0].exec, claim[0].flow, claim[0].outcome, claim[0].committedAtMs
	var downs []string
	for _, x := range claim {
		if x.down != "" {
			downs = append(downs, x.down)
		}
	}
	res.Outcome = CompletionDispatched
	if res.FlowID == "" {
		return nil
	}
	bucket, known := BucketOf(res.EventOutcome)
	res.UnknownOutcome = !known
	for _, d := range downs {
		h, err := advanceEdgeGroup(ctx, tx, partition, res.FlowID, res.ExecutionID, d, bucket, nowMs)
		if err != nil {
			return fmt.Errorf("advance edge group of downstream %s: %w", d, err)
		}
		res.Hops = append(res.Hops, h)
	}
	return nil
}

// probeUnclaimed tells an event outside the filter (undispatched, so left
// to another fleet) from one already claimed or gone.
func probeUnclaimed(ctx context.Context, tx pgx.Tx, partition int16, eventID int64, res *CompletionResult) error {
	var pending bool
	err := tx.QueryRow(ctx, `SELECT dispatched_at_ms IS NULL FROM ff_completion_event
		 WHERE partition_key = $1 AND event_id = $2`, partition, eventID).Scan(&pending)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		res.Outcome = CompletionAlreadyDispatched
	case err != nil:
		return fmt.Errorf("probe event: %w", err)
	case pending:
		res.Outcome = CompletionOutsideTenant
	default:
		res.Outcome = CompletionAlreadyDispatched
	}
	return nil
}

// Hop statements. $1 partition, $2 flow, $3 downstream, $4-$7 the counters
// after the event (success, fail, skip, running), $8 now (for the statements
// that write a time); the satisfied statement with a sibling cancel adds $9, the event's execution (the
// winner, not a sibling). Each writes the group's counters whatever the
// decision, as FlowFabric does, and reports whether the downstream's row was
// changed and whether it exists.
const (
	hopGroupSQL = `UPDATE ff_edge_group SET success_count = $4, fail_count = $5, skip_count = $6, running_count = $7
	 WHERE partition_key = $1 AND flow_id = $2::uuid AND downstream_eid = $3::uuid`

	hopPendingSQL = `WITH g AS (` + hopGroupSQL + `)
SELECT false, true, 0::bigint`

	hopExistsSQL = `EXISTS (SELECT 1 FROM ff_exec_core WHERE partition_key = $1 AND execution_id = $3::uuid)`

	// FlowFabric's satisfied UPDATE: eligibility, the phase out of
	// blocked; and, for a downstream left waiting for a worker (runnable or
	// submitted, as the phase now reads), what FlowFabric's Valkey engine
	// writes for it (public_state waiting, blocking_reason
	// waiting_for_worker), where the Postgres statement leaves a replayed
	// member's `waiting_children`. A downstream in any other phase keeps
	// both: the group's satisfaction does not make it waiting.
	hopEligibleSQL = `x AS (
    UPDATE ff_exec_core
       SET eligibility_state = 'eligible_now',
           lifecycle_phase = CASE WHEN lifecycle_phase = 'blocked' THEN 'runnable' ELSE lifecycle_phase END,
           public_state = CASE WHEN lifecycle_phase IN ('blocked', 'runnable', 'submitted') THEN 'waiting' ELSE public_state END,
           blocking_reason = CASE WHEN lifecycle_phase IN ('blocked', 'runnable', 'submitted') THEN 'waiting_for_worker' ELSE blocking_reason END
     WHERE partition_key = $1 AND execution_id = $3::uuid AND lifecycle_phase NOT IN ('terminal', 'cancelled')
    RETURNING 1)`

	hopSatisfiedSQL = `WITH g AS (` + hopGroupSQL + `), ` + hopEligibleSQL + `
SELECT EXISTS (SELECT 1 FROM x), ` + hopExistsSQL + `, 0::bigint`

	// With a sibling cancel (the flag clear when locked): the live
	// siblings, not the winner, FlowFabric's member query (no DISTINCT: a
	// duplicate edge lists its sibling twice, as there), the pending
	// cancel group (an existing row keeps its time) and the flag.
	hopSatisfiedCancelSQL = `WITH m AS (
    SELECT COALESCE(array_agg(c.execution_id::text), '{}'::text[]) AS members
      FROM ff_exec_core c JOIN ff_edge e ON e.upstream_eid = c.execution_id
     WHERE c.partition_key = $1 AND e.partition_key = $1 AND e.flow_id = $2::uuid AND e.downstream_eid = $3::uuid
       AND c.lifecycle_phase NOT IN ('terminal', 'cancelled') AND c.public_state <> 'skipped'
       AND c.execution_id <> $9::uuid),
g AS (
    UPDATE ff_edge_group SET success_count = $4, fail_count = $5, skip_count = $6, running_count = $7,
           cancel_siblings_pending_flag = true, cancel_siblings_pending_members = (SELECT members FROM m)
     WHERE partition_key = $1 AND flow_id = $2::uuid AND downstream_eid = $3::uuid),
pc AS (
    INSERT INTO ff_pending_cancel_groups (partition_key, flow_id, downstream_eid, enqueued_at_ms)
    VALUES ($1, $2::uuid, $3::uuid, $8) ON CONFLICT DO NOTHING), ` + hopEligibleSQL + `
SELECT EXISTS (SELECT 1 FROM x), ` + hopExistsSQL + `, 0::bigint`

	// FlowFabric's impossible UPDATE, clearing the blocking reason as its
	// Valkey engine does for a terminal execution, and the downstream's own
	// skipped event only when it was skipped now, carrying its tenant.
	hopImpossibleSQL = `WITH g AS (` + hopGroupSQL + `),
x AS (
    UPDATE ff_exec_core
       SET lifecycle_phase = 'terminal', eligibility_state = 'not_applicable', public_state = 'skipped',
           blocking_reason = NULL,
           attempt_state = 'attempt_terminal', terminal_at_ms = COALESCE(terminal_at_ms, $8)
     WHERE partition_key = $1 AND execution_id = $3::uuid AND lifecycle_phase NOT IN ('terminal', 'cancelled')
    RETURNING execution_id, raw_fields),
ev AS (
    INSERT INTO ff_completion_event (partition_key, execution_id, flow_id, outcome, namespace, instance_tag, occurred_at_ms)
    SELECT $1, x.execution_id, $2::uuid, 'skipped', x.raw_fields->>'namespace', x.raw_fields->'tags'->>'cairn.instance_id', $8
      FROM x
    RETURNING event_id)
SELECT EXISTS (SELECT 1 FROM x), ` + hopExistsSQL + `, COALESCE((SELECT event_id FROM ev), 0)`
)

// advanceEdgeGroup is one hop, FlowFabric's advance_edge_group, inside the
// dispatch's transaction: the group locked FOR UPDATE (READ COMMITTED reads
// it as its last holder committed it), its counters advanced (running drops
// by one only while above 0), the decision taken and written. Two round
// trips: the locking read, then one statement for every write.
func advanceEdgeGroup(ctx context.Context, tx pgx.Tx, partition int16, flowID, upstream, downstream string, b Bucket, nowMs int64) (Hop, error) {
	h := Hop{DownstreamEID: downstream}
	var (
		policy                       []byte
		success, fail, skip, running int32
		flagged                      bool
	)
	err := tx.QueryRow(ctx, `
		SELECT policy::text, success_count, fail_count, skip_count, running_count, cancel_siblings_pending_flag
		  FROM ff_edge_group
		 WHERE partition_key = $1 AND flow_id = $2::uuid AND downstream_eid = $3::uuid
		   FOR UPDATE`, partition, flowID, downstream).Scan(&policy, &success, &fail, &skip, &running, &flagged)
	if errors.Is(err, pgx.ErrNoRows) {
		h.GroupMissing = true
		return h, nil
	}
	if err != nil {
		return h, fmt.Errorf("lock edge group: %w", err)
	}
	if running > 0 {
		running--
	}
	switch b {
	case BucketSuccess:
		success++
	case BucketSkip:
		skip++
	default:
		fail++
	}
	p, odd := DecodePolicy(policy)
	h.OddPolicy = odd
	var cancel bool
	h.Decision, cancel = Decide(p, success, fail, skip, success+fail+skip+max(running, 0))

	args := []any{partition, flowID, downstream, success, fail, skip, max(running, 0), nowMs}
	var sql string
	switch {
	case h.Decision == Satisfied && cancel && !flagged:
		sql, args, h.Flagged = hopSatisfiedCancelSQL, append(args, upstream), true
	case h.Decision == Satisfied:
		sql, args = hopSatisfiedSQL, args[:7]
	case h.Decision == Impossible:
		sql = hopImpossibleSQL
	default:
		sql, args = hopPendingSQL, args[:7]
	}
	var exists bool
	if err := tx.QueryRow(ctx, sql, args...).Scan(&h.Changed, &exists, &h.SkipEventID); err != nil {
		return h, fmt.Errorf("write %s group: %w", h.Decision, err)
	}
	h.DownstreamMissing = !exists
	return h, nil
}

// EventKey is a completion event's key.
type EventKey struct {
	Partition int16
	EventID   int64
}

// UndispatchedEvents returns the keys of the events among ids that are still
// undispatched and pass f, in event order: FlowFabric's ff_completion
// notification carries the event id alone. Index:
// ff_completion_event_event_id_idx (event_id), one probe per partition's
// index for the whole batch.
func UndispatchedEvents(ctx context.Context, db DB, ids []int64, f Filter) ([]EventKey, error) {
	p := params{ids}
	rows, err := db.Query(ctx, `SELECT r.partition_key, r.event_id FROM ff_completion_event r
		 WHERE r.event_id = ANY($1::bigint[]) AND r.dispatched_at_ms IS NULL`+f.columnsSQL(&p, "r")+`
		 ORDER BY r.event_id`, p...)
	if err != nil {
		return nil, fmt.Errorf("read notified completion events: %w", err)
	}
	keys, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (EventKey, error) {
		var k EventKey
		err := r.Scan(&k.Partition, &k.EventID)
		return k, err
	})
	if err != nil {
		return nil, fmt.Errorf("read notified completion events: %w", err)
	}
	return keys, nil
}
