package store

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
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
//   - The claim and every hop of an event are one transaction (with the
//     other events of its batch, DispatchCompletions). FlowFabric
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
//     the hop). A batch locks all its groups in downstream order in one
//     statement, so two batches sharing groups cannot deadlock on them.
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

// BatchDispatchHook is DispatchHook for DispatchCompletions: it gets every
// event's result, in the order of the ids asked for.
type BatchDispatchHook func(ctx context.Context, tx pgx.Tx, res []CompletionResult) error

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
// DispatchCompletions with one event.
func DispatchCompletion(ctx context.Context, db Beginner, partition int16, eventID, nowMs int64, f Filter, hook DispatchHook) (CompletionResult, error) {
	var batchHook BatchDispatchHook
	if hook != nil {
		batchHook = func(ctx context.Context, tx pgx.Tx, res []CompletionResult) error { return hook(ctx, tx, res[0]) }
	}
	res, err := DispatchCompletions(ctx, db, partition, []int64{eventID}, nowMs, f, batchHook)
	if err != nil {
		return CompletionResult{}, err
	}
	return res[0], nil
}

// DispatchCompletions dispatches completion events of one partition in one
// transaction, one result per id in order: it claims the events that are
// still undispatched (and pass f), locks every edge group their edges lead
// to in downstream order, advances each edge (the events in event-id order,
// each event's edges in downstream order, exactly as one DispatchCompletion
// after another in one transaction would), runs hook (may be nil, and is
// skipped when nothing was claimed) and commits. An error leaves nothing
// behind, for any of the events: every claim rolls back with every hop, and
// the caller may run each event again alone (internal/coalesce does) without
// any hop applied twice. An id given twice is dispatched once; its later
// occurrences read as already dispatched.
//
// Five round trips whatever the number of events and edges: the begin, the
// claim with the edges (claimSQL), the locks of their groups
// (lockGroupsSQL), the writes (groupsSQL with eligibleSQL or decidedSQL, or,
// when hops of the batch depend on each other's writes, the per-hop
// statements) pipelined in one, and the commit; a probe more when an event
// was not claimed or a decided downstream did not change.
func DispatchCompletions(ctx context.Context, db Beginner, partition int16, eventIDs []int64, nowMs int64, f Filter, hook BatchDispatchHook) ([]CompletionResult, error) {
	return dispatchCompletions(ctx, db, nil, partition, eventIDs, nowMs, f, hook)
}

// DispatchCompletionsOnLeaves is DispatchCompletions with every statement
// naming the leaf partitions of partition (leaves) instead of FlowFabric's
// parents: for a connection that keeps a generic plan of each statement
// (plan_cache_mode force_generic_plan) and sees few partitions, so that a
// dispatch plans nothing once the connection has run it for the partition.
// Each plan costs the connection ~30-60 KB (docs/performance.md).
func DispatchCompletionsOnLeaves(ctx context.Context, db Beginner, leaves *Leaves, partition int16, eventIDs []int64, nowMs int64, f Filter, hook BatchDispatchHook) ([]CompletionResult, error) {
	return dispatchCompletions(ctx, db, leaves, partition, eventIDs, nowMs, f, hook)
}

func dispatchCompletions(ctx context.Context, db Beginner, lv *Leaves, partition int16, eventIDs []int64, nowMs int64, f Filter, hook BatchDispatchHook) ([]CompletionResult, error) {
	var res []CompletionResult
	var err error
	for try := 1; ; try++ {
		res = make([]CompletionResult, len(eventIDs))
		err = inTx(ctx, db, func(tx pgx.Tx) (bool, error) {
			claimed, err := dispatchInTx(ctx, tx, lv, partition, eventIDs, nowMs, f, res)
			if err != nil || !claimed {
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
		if len(eventIDs) == 1 {
			return nil, fmt.Errorf("dispatch completion event %d/%d: %w", partition, eventIDs[0], err)
		}
		return nil, fmt.Errorf("dispatch %d completion events of partition %d: %w", len(eventIDs), partition, err)
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

// claimSQL claims a partition's events and reads the edges out of their
// executions in one statement: c claims (the lock shared with FlowFabric's
// dispatcher: its autocommit claim waits for this transaction and then finds
// the events claimed). One row per claimed event and edge (the edge columns
// empty for an event without one), in event, downstream, edge order.
//
// $1 partition, $2 event ids, $3 now; the tenant filter follows. Index:
// ff_completion_event's primary key (partition_key, event_id) for the claim
// or, as the planner prefers it, ff_completion_event_pending_dispatch_idx:
// the partition's undispatched events, the batch's kept (a batch reads the
// partition's backlog of undispatched events, not the partition:
// TestRowStatementsReadByKey; written so that the partial index does not
// apply, num_nulls(…) = 1, it read the whole partition),
// ff_edge_upstream_idx for the edges; the partition is a constant, so the
// plan prunes to one child of each table. Cost: about 0.2 ms of planning
// per batch (two references to 256-way tables), an index probe per event.
const claimSQL = `
WITH c AS (
    UPDATE ff_completion_event r SET dispatched_at_ms = $3
     WHERE r.partition_key = $1 AND r.event_id = ANY($2::bigint[]) AND r.dispatched_at_ms IS NULL%s
    RETURNING r.event_id, r.execution_id, r.flow_id, r.outcome, r.committed_at_ms)
SELECT c.event_id, c.execution_id::text, COALESCE(c.flow_id::text, ''), c.outcome, c.committed_at_ms,
       COALESCE(e.downstream_eid::text, '')
  FROM c LEFT JOIN ff_edge e ON e.partition_key = $1 AND e.flow_id = c.flow_id AND e.upstream_eid = c.execution_id
 ORDER BY c.event_id, e.downstream_eid, e.edge_id`

// lockGroupsSQL locks the edge groups a batch's edges lead to FOR UPDATE, one
// primary-key probe each, in the order of the arrays, which the caller sorts
// by downstream (the lateral subquery runs once per key, in unnest's order):
// the order every dispatch locks groups in, so two dispatches sharing groups
// wait for each other instead of deadlocking. READ COMMITTED returns each row
// as its last holder committed it. $1 partition, $2 flows, $3 downstreams.
// Index: ff_edge_group's primary key (partition_key, flow_id,
// downstream_eid). Written as a join of the keys to the table, the planner
// read the partition's whole index and hashed the keys
// (TestRowStatementsReadByKey).
const lockGroupsSQL = `
SELECT g.flow_id::text, g.downstream_eid::text, g.policy::text, g.success_count, g.fail_count, g.skip_count,
       g.running_count, g.cancel_siblings_pending_flag
  FROM unnest($2::uuid[], $3::uuid[]) WITH ORDINALITY AS k(flow_id, downstream_eid, n)
 CROSS JOIN LATERAL (
       SELECT * FROM ff_edge_group g
        WHERE g.partition_key = $1 AND g.flow_id = k.flow_id AND g.downstream_eid = k.downstream_eid
          FOR UPDATE) g
 ORDER BY k.n`

// lockGroupSQL is lockGroupsSQL for one group, $2 flow, $3 downstream:
// about 0.05 ms of planning against 0.2 ms.
const lockGroupSQL = `
SELECT g.flow_id::text, g.downstream_eid::text, g.policy::text, g.success_count, g.fail_count, g.skip_count,
       g.running_count, g.cancel_siblings_pending_flag
  FROM ff_edge_group g
 WHERE g.partition_key = $1 AND g.flow_id = $2::uuid AND g.downstream_eid = $3::uuid
   FOR UPDATE`

// claimRow is a row of claimSQL.
type claimRow struct {
	eventID             int64
	exec, flow, outcome string
	committedAtMs       int64
	down                string
}

// groupKey is an edge group's key within a partition.
type groupKey struct{ flow, down string }

// groupState is a locked edge group as the batch's hops so far left it.
type groupState struct {
	policy                       EdgePolicy
	odd                          bool
	success, fail, skip, running int32
	flagged                      bool
}

// hopWrite is one hop's write: the group's counters after it and the
// decision, and the hop it reports to (res[res].Hops[hop]).
type hopWrite struct {
	key                          groupKey
	success, fail, skip, running int32
	decision                     Decision
	cancel                       bool   // satisfied, raising the sibling-cancel flag
	upstream                     string // the event's execution (the winner of a sibling cancel)
	res, hop                     int
}

// advance is FlowFabric's advance_edge_group on a locked group's state: its
// counters advanced by the event's bucket (running drops by one only while
// above 0), the decision taken, and the sibling-cancel flag raised when a
// satisfied group cancels its siblings and had not yet.
func advance(g *groupState, k groupKey, b Bucket, upstream string) hopWrite {
	if g.running > 0 {
		g.running--
	}
	g.running = max(g.running, 0)
	switch b {
	case BucketSuccess:
		g.success++
	case BucketSkip:
		g.skip++
	default:
		g.fail++
	}
	d, cancel := Decide(g.policy, g.success, g.fail, g.skip, g.success+g.fail+g.skip+g.running)
	cancel = d == Satisfied && cancel && !g.flagged
	if cancel {
		g.flagged = true
	}
	return hopWrite{key: k, success: g.success, fail: g.fail, skip: g.skip, running: g.running, decision: d, cancel: cancel, upstream: upstream}
}

// dispatchInTx claims the events, locks their groups, takes every hop's
// decision on them, and writes; claimed reports whether any event was
// claimed.
func dispatchInTx(ctx context.Context, tx pgx.Tx, lv *Leaves, partition int16, eventIDs []int64, nowMs int64, f Filter, res []CompletionResult) (claimed bool, err error) {
	p := params{partition, eventIDs, nowMs}
	rows, err := tx.Query(ctx, lv.sql(fmt.Sprintf(claimSQL, f.columnsSQL(&p, "r")), partition), p...)
	if err != nil {
		return false, fmt.Errorf("claim: %w", err)
	}
	claim, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (claimRow, error) {
		var x claimRow
		err := r.Scan(&x.eventID, &x.exec, &x.flow, &x.outcome, &x.committedAtMs, &x.down)
		return x, err
	})
	if err != nil {
		return false, fmt.Errorf("claim: %w", err)
	}
	groups, err := lockGroups(ctx, tx, lv, partition, claim)
	if err != nil {
		return false, err
	}
	// A claimed event's result is its id's first occurrence.
	at := make(map[int64]int, len(eventIDs))
	for i, id := range eventIDs {
		if _, dup := at[id]; dup {
			res[i].Outcome = CompletionAlreadyDispatched
		} else {
			at[id] = i
		}
	}
	var writes []hopWrite
	var bucket Bucket
	last := int64(-1)
	for _, x := range claim {
		ri := at[x.eventID]
		r := &res[ri]
		if x.eventID != last {
			last, claimed = x.eventID, true
			r.Outcome, r.ExecutionID, r.FlowID, r.EventOutcome, r.CommittedAtMs = CompletionDispatched, x.exec, x.flow, x.outcome, x.committedAtMs
			var known bool
			bucket, known = BucketOf(x.outcome)
			r.UnknownOutcome = !known
		}
		if x.down == "" || x.flow == "" {
			continue
		}
		r.Hops = append(r.Hops, Hop{DownstreamEID: x.down})
		h := &r.Hops[len(r.Hops)-1]
		k := groupKey{x.flow, x.down}
		g := groups[k]
		if g == nil {
			h.GroupMissing = true
			continue
		}
		w := advance(g, k, bucket, x.exec)
		w.res, w.hop = ri, len(r.Hops)-1
		h.Decision, h.OddPolicy, h.Flagged = w.decision, g.odd, w.cancel
		writes = append(writes, w)
	}
	if err := probeUnclaimed(ctx, tx, lv, partition, eventIDs, res); err != nil {
		return false, err
	}
	if len(writes) == 0 {
		return claimed, nil
	}
	// One hop: its own statement (hopSatisfiedSQL and the others) plans in
	// less time than the batch's two.
	if len(writes) > 1 && independent(writes) {
		return claimed, writeHopsAtOnce(ctx, tx, lv, partition, writes, nowMs, res)
	}
	return claimed, writeHopsInTurn(ctx, tx, lv, partition, writes, nowMs, res)
}

// lockGroups locks the groups the claimed events' edges lead to
// (lockGroupsSQL) and returns them as they stand.
func lockGroups(ctx context.Context, tx pgx.Tx, lv *Leaves, partition int16, claim []claimRow) (map[groupKey]*groupState, error) {
	groups := map[groupKey]*groupState{}
	var flows, downs []string
	for _, x := range claim {
		k := groupKey{x.flow, x.down}
		if x.down == "" || x.flow == "" {
			continue
		}
		if _, ok := groups[k]; !ok {
			groups[k] = nil
			flows, downs = append(flows, x.flow), append(downs, x.down)
		}
	}
	if len(flows) == 0 {
		return groups, nil
	}
	// Downstream order, then flow: the order every dispatch locks groups in.
	order := make([]int, len(flows))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		return cmp.Or(cmp.Compare(downs[a], downs[b]), cmp.Compare(flows[a], flows[b]))
	})
	sortedFlows, sortedDowns := make([]string, len(order)), make([]string, len(order))
	for i, j := range order {
		sortedFlows[i], sortedDowns[i] = flows[j], downs[j]
	}
	flows, downs = sortedFlows, sortedDowns
	var rows pgx.Rows
	var err error
	if len(flows) == 1 {
		// One group: the scalar form plans in a quarter of the time.
		rows, err = tx.Query(ctx, lv.sql(lockGroupSQL, partition), partition, flows[0], downs[0])
	} else {
		rows, err = tx.Query(ctx, lv.sql(lockGroupsSQL, partition), partition, flows, downs)
	}
	if err != nil {
		return nil, fmt.Errorf("lock edge groups: %w", err)
	}
	var (
		k      groupKey
		policy string
		g      groupState
	)
	_, err = pgx.ForEachRow(rows, []any{&k.flow, &k.down, &policy, &g.success, &g.fail, &g.skip, &g.running, &g.flagged}, func() error {
		st := g
		st.policy, st.odd = DecodePolicy([]byte(policy))
		groups[k] = &st
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("lock edge groups: %w", err)
	}
	return groups, nil
}

// probeUnclaimed tells the events that were not claimed (their result still
// zero) outside the filter (undispatched, so left to another fleet) from
// those already claimed or gone. Index: ff_completion_event's primary key.
func probeUnclaimed(ctx context.Context, tx pgx.Tx, lv *Leaves, partition int16, eventIDs []int64, res []CompletionResult) error {
	var ids []int64
	for i, id := range eventIDs {
		if res[i].Outcome == 0 {
			res[i].Outcome = CompletionAlreadyDispatched
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	rows, err := tx.Query(ctx, lv.sql(`SELECT event_id FROM ff_completion_event
		 WHERE partition_key = $1 AND event_id = ANY($2::bigint[]) AND dispatched_at_ms IS NULL`, partition), partition, ids)
	if err != nil {
		return fmt.Errorf("probe events: %w", err)
	}
	pending, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return fmt.Errorf("probe events: %w", err)
	}
	for i, id := range eventIDs {
		if res[i].Outcome == CompletionAlreadyDispatched && res[i].ExecutionID == "" && slices.Contains(pending, id) {
			res[i].Outcome = CompletionOutsideTenant
		}
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

// independent reports whether a batch's hop writes can be set-based
// statements (writeHopsAtOnce), which see the rows as they were before any of
// them: no hop raises a sibling-cancel flag (its member query reads the
// siblings other hops may skip), and no group and no downstream has more
// than one hop that decides something (a group's pending hops only write
// counters, and the last hop's counters are the group's).
func independent(writes []hopWrite) bool {
	decided := make(map[string]bool, len(writes))
	for _, w := range writes {
		if w.cancel {
			return false
		}
		if w.decision == Pending {
			continue
		}
		if decided[w.key.down] {
			return false
		}
		decided[w.key.down] = true
	}
	return true
}

// The writes of a batch's independent hops, plain statements sent in one
// round trip (plain statements plan in less time than one joining them in
// CTEs: 0.11 + 0.13 ms against 0.31 ms for one group on this machine): each
// group's counters after the batch, whatever the decision, as FlowFabric
// does (hopGroupSQL, one statement a group, ~0.05 ms of planning: a group
// is keyed by two columns, and written as a join of the batch's keys to
// ff_edge_group the planner read the partition's whole index,
// TestRowStatementsReadByKey), then the decided downstreams.
//
// eligibleSQL is FlowFabric's satisfied UPDATE (hopEligibleSQL's columns)
// for the downstreams of satisfied groups, when no hop of the batch is
// impossible; one row per downstream changed. $1 partition, $2 downstreams.
// Index: ff_exec_core's primary key, one probe per downstream.
const eligibleSQL = `
UPDATE ff_exec_core x
   SET eligibility_state = 'eligible_now',
       lifecycle_phase = CASE WHEN x.lifecycle_phase = 'blocked' THEN 'runnable' ELSE x.lifecycle_phase END,
       public_state = CASE WHEN x.lifecycle_phase IN ('blocked', 'runnable', 'submitted') THEN 'waiting' ELSE x.public_state END,
       blocking_reason = CASE WHEN x.lifecycle_phase IN ('blocked', 'runnable', 'submitted') THEN 'waiting_for_worker'
                              ELSE x.blocking_reason END
 WHERE x.partition_key = $1 AND x.execution_id = ANY($2::uuid[]) AND x.lifecycle_phase NOT IN ('terminal', 'cancelled')
RETURNING x.execution_id::text, 0::bigint`

// decidedSQL is FlowFabric's satisfied and impossible UPDATEs in one (x,
// hopEligibleSQL's and hopImpossibleSQL's columns, by decision), and ev the
// skipped event of each downstream skipped now, carrying its tenant; one row
// per downstream changed, with its skip event (0: none). $1 partition, $2
// downstreams, $3 decisions (store.Decision), $4 flows, $5 now. Index:
// ff_exec_core's primary key, one probe per downstream.
const decidedSQL = `
WITH x AS (
    UPDATE ff_exec_core x
       SET eligibility_state = CASE WHEN h.decision = 3 THEN 'not_applicable' ELSE 'eligible_now' END,
           lifecycle_phase = CASE WHEN h.decision = 3 THEN 'terminal'
                                  WHEN x.lifecycle_phase = 'blocked' THEN 'runnable' ELSE x.lifecycle_phase END,
           public_state = CASE WHEN h.decision = 3 THEN 'skipped'
                               WHEN x.lifecycle_phase IN ('blocked', 'runnable', 'submitted') THEN 'waiting' ELSE x.public_state END,
           blocking_reason = CASE WHEN h.decision = 3 THEN NULL
                                  WHEN x.lifecycle_phase IN ('blocked', 'runnable', 'submitted') THEN 'waiting_for_worker'
                                  ELSE x.blocking_reason END,
           attempt_state = CASE WHEN h.decision = 3 THEN 'attempt_terminal' ELSE x.attempt_state END,
           terminal_at_ms = CASE WHEN h.decision = 3 THEN COALESCE(x.terminal_at_ms, $5) ELSE x.terminal_at_ms END
      FROM unnest($2::uuid[], $3::int[], $4::uuid[]) AS h(downstream_eid, decision, flow_id)
     WHERE x.partition_key = $1 AND x.execution_id = h.downstream_eid AND x.lifecycle_phase NOT IN ('terminal', 'cancelled')
    RETURNING x.execution_id, x.raw_fields, h.flow_id, h.decision),
ev AS (
    INSERT INTO ff_completion_event (partition_key, execution_id, flow_id, outcome, namespace, instance_tag, occurred_at_ms)
    SELECT $1, x.execution_id, x.flow_id, 'skipped', x.raw_fields->>'namespace', x.raw_fields->'tags'->>'cairn.instance_id', $5
      FROM x WHERE x.decision = 3
    RETURNING execution_id, event_id)
SELECT x.execution_id::text, COALESCE(ev.event_id, 0) FROM x LEFT JOIN ev ON ev.execution_id = x.execution_id`

// writeHopsAtOnce writes independent hops: hopGroupSQL for each group, then eligibleSQL or
// decidedSQL for the groups decided, in one round trip. A deciding hop whose
// downstream did not change is probed apart (probeDownstreams): rare, and
// a reference to ff_exec_core in the statements would be planned every time.
func writeHopsAtOnce(ctx context.Context, tx pgx.Tx, lv *Leaves, partition int16, writes []hopWrite, nowMs int64, res []CompletionResult) error {
	// One row per group: its last hop's counters. A pending hop changes no
	// downstream and reads none (hopPendingSQL): its Hop stays as it is.
	row := make(map[groupKey]int, len(writes))
	var flows, downs []string
	var success, fail, skip, running []int32
	decider := map[string]*hopWrite{} // downstream → its deciding hop
	var decFlows, decDowns []string
	var decisions []int32
	skips := false
	for i := range writes {
		w := &writes[i]
		j, ok := row[w.key]
		if !ok {
			j = len(flows)
			row[w.key] = j
			flows, downs = append(flows, w.key.flow), append(downs, w.key.down)
			success, fail, skip, running = append(success, 0), append(fail, 0), append(skip, 0), append(running, 0)
		}
		success[j], fail[j], skip[j], running[j] = w.success, w.fail, w.skip, w.running
		if w.decision != Pending {
			decider[w.key.down] = w
			decFlows, decDowns, decisions = append(decFlows, w.key.flow), append(decDowns, w.key.down), append(decisions, int32(w.decision))
			skips = skips || w.decision == Impossible
		}
	}
	b := &pgx.Batch{}
	for j := range flows {
		b.Queue(lv.sql(hopGroupSQL, partition), partition, flows[j], downs[j], success[j], fail[j], skip[j], running[j])
	}
	switch {
	case skips:
		b.Queue(lv.sql(decidedSQL, partition), partition, decDowns, decisions, decFlows, nowMs)
	case len(decDowns) > 0:
		b.Queue(lv.sql(eligibleSQL, partition), partition, decDowns)
	}
	br := tx.SendBatch(ctx, b)
	for range flows {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return fmt.Errorf("write %d edge groups: %w", len(flows), err)
		}
	}
	if len(decDowns) > 0 {
		rows, err := br.Query()
		if err == nil {
			var (
				down        string
				skipEventID int64
			)
			_, err = pgx.ForEachRow(rows, []any{&down, &skipEventID}, func() error {
				w := decider[down]
				if w == nil {
					return fmt.Errorf("a row for downstream %s, which no hop decided", down)
				}
				h := &res[w.res].Hops[w.hop]
				h.Changed, h.SkipEventID = true, skipEventID
				return nil
			})
		}
		if err != nil {
			_ = br.Close()
			return fmt.Errorf("write %d decided downstreams: %w", len(decDowns), err)
		}
	}
	if err := br.Close(); err != nil {
		return fmt.Errorf("write edge groups: %w", err)
	}
	var unchanged []string
	for d, w := range decider {
		if !res[w.res].Hops[w.hop].Changed {
			unchanged = append(unchanged, d)
		}
	}
	if len(unchanged) == 0 {
		return nil
	}
	existing, err := probeDownstreams(ctx, tx, lv, partition, unchanged)
	if err != nil {
		return err
	}
	for _, d := range unchanged {
		w := decider[d]
		res[w.res].Hops[w.hop].DownstreamMissing = !slices.Contains(existing, d)
	}
	return nil
}

// probeDownstreams returns which of downs have an ff_exec_core row. Index:
// ff_exec_core's primary key.
func probeDownstreams(ctx context.Context, tx pgx.Tx, lv *Leaves, partition int16, downs []string) ([]string, error) {
	rows, err := tx.Query(ctx, lv.sql(`SELECT execution_id::text FROM ff_exec_core
		 WHERE partition_key = $1 AND execution_id = ANY($2::uuid[])`, partition), partition, downs)
	if err != nil {
		return nil, fmt.Errorf("probe downstreams: %w", err)
	}
	existing, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("probe downstreams: %w", err)
	}
	return existing, nil
}

// writeHopsInTurn writes hops that depend on each other's writes one
// statement each, in order (each sees the ones before it), pipelined in one
// round trip: FlowFabric's statements for its three decisions.
func writeHopsInTurn(ctx context.Context, tx pgx.Tx, lv *Leaves, partition int16, writes []hopWrite, nowMs int64, res []CompletionResult) error {
	b := &pgx.Batch{}
	for _, w := range writes {
		args := []any{partition, w.key.flow, w.key.down, w.success, w.fail, w.skip, w.running, nowMs}
		var sql string
		switch {
		case w.decision == Satisfied && w.cancel:
			sql, args = hopSatisfiedCancelSQL, append(args, w.upstream)
		case w.decision == Satisfied:
			sql, args = hopSatisfiedSQL, args[:7]
		case w.decision == Impossible:
			sql = hopImpossibleSQL
		default:
			sql, args = hopPendingSQL, args[:7]
		}
		b.Queue(lv.sql(sql, partition), args...)
	}
	br := tx.SendBatch(ctx, b)
	for _, w := range writes {
		h := &res[w.res].Hops[w.hop]
		var exists bool
		if err := br.QueryRow().Scan(&h.Changed, &exists, &h.SkipEventID); err != nil {
			_ = br.Close()
			return fmt.Errorf("write %s group of downstream %s: %w", w.decision, w.key.down, err)
		}
		h.DownstreamMissing = !exists
	}
	if err := br.Close(); err != nil {
		return fmt.Errorf("write edge groups: %w", err)
	}
	return nil
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
//
// The statement reads every partition, so it runs with a generic plan (SET
// LOCAL plan_cache_mode, in a transaction of its own on db's connection,
// whose own setting it leaves alone): a custom plan over the 256 children
// took 16-33 ms of planning per call on this machine (1 to 100 ids), the
// generic plan, cached with the prepared statement, 1.4-4.6 ms to run. It
// locks all 256 children and their event-id indexes for the statement, as
// the custom plan did (nothing prunes them).
func UndispatchedEvents(ctx context.Context, db Beginner, ids []int64, f Filter) ([]EventKey, error) {
	var keys []EventKey
	err := inTx(ctx, db, func(tx pgx.Tx) (bool, error) {
		if _, err := tx.Exec(ctx, `SET LOCAL plan_cache_mode = force_generic_plan`); err != nil {
			return false, err
		}
		p := params{ids}
		rows, err := tx.Query(ctx, `SELECT r.partition_key, r.event_id FROM ff_completion_event r
			 WHERE r.event_id = ANY($1::bigint[]) AND r.dispatched_at_ms IS NULL`+f.columnsSQL(&p, "r")+`
			 ORDER BY r.event_id`, p...)
		if err != nil {
			return false, err
		}
		keys, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (EventKey, error) {
			var k EventKey
			err := r.Scan(&k.Partition, &k.EventID)
			return k, err
		})
		// Read only: the transaction ends with a rollback.
		return false, err
	})
	if err != nil {
		return nil, fmt.Errorf("read notified completion events: %w", err)
	}
	return keys, nil
}

// DispatchTables are the tables a completion event's dispatch names: the
// Leaves DispatchCompletionsOnLeaves needs (LoadLeaves(ctx, db,
// DispatchTables...)).
var DispatchTables = []string{"ff_completion_event", "ff_edge", "ff_edge_group", "ff_exec_core", "ff_pending_cancel_groups"}

// WarmDispatchOnLeaves has db's connection plan, for each of partitions, the
// statements a single event's dispatch runs most (the claim, the lock of one
// group, a pending and a satisfied hop: DispatchCompletionsOnLeaves), with
// keys that match no row, in a transaction rolled back. On a connection
// with plan_cache_mode force_generic_plan each plan is then cached with its
// prepared statement, as after the partition's first event; the rarer hop
// statements are planned when first needed. f must be the filter the
// dispatches use: it is part of the claim's text. For a benchmark's
// connections, and a process that wants its first events fast.
func WarmDispatchOnLeaves(ctx context.Context, db Beginner, leaves *Leaves, partitions []int16, f Filter) error {
	return inTx(ctx, db, func(tx pgx.Tx) (bool, error) {
		const none = "00000000-0000-0000-0000-000000000000"
		for _, p := range partitions {
			claim := params{p, []int64{-1}, int64(0)}
			hop := []any{p, none, none, int32(0), int32(0), int32(0), int32(0)}
			b := &pgx.Batch{}
			b.Queue(leaves.sql(fmt.Sprintf(claimSQL, f.columnsSQL(&claim, "r")), p), claim...)
			b.Queue(leaves.sql(lockGroupSQL, p), hop[:3]...)
			b.Queue(leaves.sql(hopPendingSQL, p), hop...)
			b.Queue(leaves.sql(hopSatisfiedSQL, p), hop...)
			if err := tx.SendBatch(ctx, b).Close(); err != nil {
				return false, fmt.Errorf("warm the dispatch statements of partition %d: %w", p, err)
			}
		}
		return false, nil
	})
}
