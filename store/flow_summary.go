package store

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Flow summaries: FlowFabric's flow projector (Valkey's flow_projector
// scanner; on Postgres project_flow_summary_impl, which nothing schedules)
// keeps ff_flow_summary, a rollup of each flow's members by public_state.
//
// Which flows are projected, and what that costs:
//   - a flow with a live member (not terminal, not cancelled) is projected
//     at every tick, as Valkey's projector does every 15 s: found through
//     ffreconcile_exec_core_flow_live_idx (partition_key, flow_id), partial
//     on live flow members, so the cost is O(live flow members);
//   - a flow whose member ended since the last pass is projected once more
//     after it (its final counts): found through
//     ffreconcile_exec_core_flow_ended_idx (partition_key, terminal_at_ms,
//     execution_id), partial on ended flow members, read from a mark kept
//     per partition and tenant filter (ffreconcile_flow_summary_mark) that
//     the passes move forward, so the cost is O(members ended since);
//   - every other flow (all members ended before the mark: a completed or
//     failed flow, or one that ends with its members) is never read again,
//     so idle cost does not grow with finished flows. A member replayed out
//     of its terminal state is live again, and its flow projected again.
//
// The mark trails the pass's clock by FlowSummarySettle: a member whose
// terminal_at_ms (its writer's clock) is older than the mark but whose
// commit came later would otherwise be missed. A mark missing (a fleet
// never ran there with this filter) reads every ended member once: the
// backfill of flows that ended before the fleet started.

// FlowSummarySettle is how far behind its pass's clock the mark of ended
// flow members stays: a member's end committed later than this after its
// terminal_at_ms (a long transaction, another host's clock) would be
// missed.
const FlowSummarySettle int64 = 10_000

// FlowFilterKey is the key of a fleet's marks: each tenant filter projects
// its own flows and keeps its own marks ("" without a filter).
func FlowFilterKey(f Filter) string {
	if f.Empty() {
		return ""
	}
	return fmt.Sprintf("namespace %d:%s tag %d:%s=%d:%s", len(f.Namespace), f.Namespace, len(f.TagKey), f.TagKey, len(f.TagValue), f.TagValue)
}

// flowTenantSQL is f's condition on the flow aliased alias, read as
// FlowFabric reads a flow's tenant: raw_fields.namespace, "default" when
// absent, and the tag as a top-level namespaced key of raw_fields
// ("cairn.instance_id"), matching a JSON string only, unlike an
// execution's raw_fields.tags. Each part starts with " AND ".
func (f Filter) flowTenantSQL(p *params, alias string) string {
	var b strings.Builder
	if f.Namespace != "" {
		fmt.Fprintf(&b, " AND COALESCE(%s.raw_fields->>'namespace', 'default') = %s::text", alias, p.add(f.Namespace))
	}
	if f.TagKey != "" {
		fmt.Fprintf(&b, " AND %s.raw_fields->%s::text = to_jsonb(%s::text)", alias, p.add(f.TagKey), p.add(f.TagValue))
	}
	return b.String()
}

// FlowSummaryPartitions returns, in order, the partitions 0..partitionCount-1
// holding a flow to project under f: a live flow member, or a flow member
// ended after the partition's mark for f (or any, without a mark). One
// query: as store.Due's, a LATERAL … LIMIT 1 per partition, pruned at run
// time to one child, probing each partial index from its bound (the live one
// steps over members of flows outside f, and of flows missing from
// ff_flow_core); a partition with a live flow reads no further. Each probe
// is ordered by its index's column: with LIMIT 1 and a bound only known at
// run time, a planner estimating a third of the partition past the mark
// would otherwise read the partition whole for its first row.
func FlowSummaryPartitions(ctx context.Context, db DB, partitionCount int, f Filter) ([]int16, error) {
	p := params{partitionCount, FlowFilterKey(f)}
	tenant, tenantJoin := f.flowTenantSQL(&p, "fc"), ""
	if !f.Empty() {
		tenantJoin = ` JOIN ff_flow_core fc ON fc.partition_key = e.partition_key AND fc.flow_id = e.flow_id`
	}
	rows, err := db.Query(ctx, `
SELECT s.p FROM (SELECT g::smallint AS p FROM generate_series(0, $1::int - 1) AS g) AS s
 LEFT JOIN ffreconcile_flow_summary_mark m ON m.partition_key = s.p AND m.filter_key = $2
 CROSS JOIN LATERAL (
     SELECT 1 FROM (
         (SELECT 1 FROM ff_exec_core e`+tenantJoin+`
           WHERE e.partition_key = s.p AND e.flow_id IS NOT NULL AND e.lifecycle_phase NOT IN ('terminal', 'cancelled')`+tenant+`
           ORDER BY e.flow_id LIMIT 1)
         UNION ALL
         (SELECT 1 FROM ff_exec_core e
           WHERE e.partition_key = s.p AND e.flow_id IS NOT NULL AND e.lifecycle_phase IN ('terminal', 'cancelled')
             AND e.terminal_at_ms IS NOT NULL AND e.terminal_at_ms > COALESCE(m.ended_through_ms, -1)
           ORDER BY e.terminal_at_ms LIMIT 1)
     ) x LIMIT 1) AS due
 ORDER BY s.p`, p...)
	if err != nil {
		return nil, fmt.Errorf("find partitions with flows to project: %w", err)
	}
	parts, err := pgx.CollectRows(rows, pgx.RowTo[int16])
	if err != nil {
		return nil, fmt.Errorf("find partitions with flows to project: %w", err)
	}
	return parts, nil
}

// EndedFlowMember is a flow member ended after a mark: the position of the
// ended pass.
type EndedFlowMember struct {
	TerminalAtMs int64
	ExecutionID  string
	FlowID       string
}

// FlowSummaryMark is a partition's mark for a filter: every flow member that
// ended at or before it (by terminal_at_ms, then execution id) has been
// projected. Found is false without one.
type FlowSummaryMark struct {
	ThroughMs int64
	ThroughID string
	Found     bool
}

// ReadFlowSummaryMark returns partition's mark for f. Index: the mark
// table's primary key.
func ReadFlowSummaryMark(ctx context.Context, db DB, partition int16, f Filter) (FlowSummaryMark, error) {
	var m FlowSummaryMark
	err := db.QueryRow(ctx, `SELECT ended_through_ms, ended_through_id::text FROM ffreconcile_flow_summary_mark
		 WHERE partition_key = $1 AND filter_key = $2`, partition, FlowFilterKey(f)).Scan(&m.ThroughMs, &m.ThroughID)
	switch {
	case err == pgx.ErrNoRows:
		return FlowSummaryMark{ThroughMs: -1, ThroughID: zeroUUID}, nil
	case err != nil:
		return m, fmt.Errorf("read flow summary mark of partition %d: %w", partition, err)
	}
	m.Found = true
	return m, nil
}

// zeroUUID and maxUUID are the least and greatest execution ids.
const (
	zeroUUID = "00000000-0000-0000-0000-000000000000"
	maxUUID  = "ffffffff-ffff-ffff-ffff-ffffffffffff"
)

// EndedFlowMembers returns up to limit flow members of partition that ended
// after the position after (by terminal_at_ms, then execution id), oldest
// first. Index: ffreconcile_exec_core_flow_ended_idx, a range from the
// position: O(limit).
func EndedFlowMembers(ctx context.Context, db DB, partition int16, afterMs int64, afterID string, limit int) ([]EndedFlowMember, error) {
	rows, err := db.Query(ctx, `
SELECT e.terminal_at_ms, e.execution_id::text, e.flow_id::text FROM ff_exec_core e
 WHERE e.partition_key = $1 AND e.flow_id IS NOT NULL AND e.lifecycle_phase IN ('terminal', 'cancelled')
   AND e.terminal_at_ms IS NOT NULL AND e.terminal_at_ms >= $2 AND (e.terminal_at_ms, e.execution_id) > ($2, $3::uuid)
 ORDER BY e.terminal_at_ms, e.execution_id
 LIMIT $4`, partition, afterMs, afterID, limit)
	if err != nil {
		return nil, fmt.Errorf("read ended flow members of partition %d: %w", partition, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (EndedFlowMember, error) {
		var m EndedFlowMember
		return m, r.Scan(&m.TerminalAtMs, &m.ExecutionID, &m.FlowID)
	})
	if err != nil {
		return nil, fmt.Errorf("read ended flow members of partition %d: %w", partition, err)
	}
	return out, nil
}

// AdvanceFlowSummaryMark moves partition's mark for f forward to (ms, id),
// never back (two passes of a partition may run at once). Index: the mark
// table's primary key.
func AdvanceFlowSummaryMark(ctx context.Context, db DB, partition int16, f Filter, ms int64, id string) error {
	_, err := db.Exec(ctx, `
INSERT INTO ffreconcile_flow_summary_mark AS m (partition_key, filter_key, ended_through_ms, ended_through_id)
VALUES ($1, $2, $3, $4::uuid)
ON CONFLICT (partition_key, filter_key) DO UPDATE
   SET ended_through_ms = EXCLUDED.ended_through_ms, ended_through_id = EXCLUDED.ended_through_id
 WHERE (m.ended_through_ms, m.ended_through_id) < (EXCLUDED.ended_through_ms, EXCLUDED.ended_through_id)`,
		partition, FlowFilterKey(f), ms, id)
	if err != nil {
		return fmt.Errorf("advance flow summary mark of partition %d: %w", partition, err)
	}
	return nil
}

// MaxExecutionID is the greatest execution id: a mark at (ms, it) covers
// every member that ended at ms.
const MaxExecutionID = maxUUID

// LiveFlows returns up to limit flows of partition with a live member
// (neither terminal nor cancelled), in flow id order after afterFlow ("" for
// the first). Index: ffreconcile_exec_core_flow_live_idx (partition_key,
// flow_id), read in order from afterFlow: O(live members of the flows
// returned).
func LiveFlows(ctx context.Context, db DB, partition int16, afterFlow string, limit int) ([]string, error) {
	if afterFlow == "" {
		afterFlow = zeroUUID
	}
	rows, err := db.Query(ctx, `
SELECT DISTINCT e.flow_id::text FROM ff_exec_core e
 WHERE e.partition_key = $1 AND e.flow_id IS NOT NULL AND e.lifecycle_phase NOT IN ('terminal', 'cancelled')
   AND e.flow_id > $2::uuid
 ORDER BY 1
 LIMIT $3`, partition, afterFlow, limit)
	if err != nil {
		return nil, fmt.Errorf("read live flows of partition %d: %w", partition, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("read live flows of partition %d: %w", partition, err)
	}
	return out, nil
}

// projectFlowsSQL builds the projection of a batch of flows for filter f:
// $1 partition, $2 flow ids, $3 now (ms), then the filter's values.
//
// FlowFabric's project_flow_summary_impl for many flows at once: the same
// eleven counts and total (sampled = total: every member is counted), the
// same state rule (every member terminal: failed when any failed, was
// cancelled or expired, else completed; otherwise running when any is
// active, blocked when any is suspended, delayed, rate limited or waiting
// for children, else open), the same upsert overwriting every column. Two
// departures, both what FlowFabric's own readers mean: its claims write
// `running`, counted here as active (FlowFabric counts it nowhere, so a
// flow with running members read `open`), and a signal's `resumable` as
// waiting (counted nowhere there). Counts beyond an int column are capped.
//
// A flow missing from ff_flow_core, outside f, or without members gets no
// row, as FlowFabric's returns false for none. Rows are written in flow id
// order, so two passes over overlapping flows cannot deadlock.
//
// Index: ff_flow_core's primary key, then ff_exec_core_flow_idx
// (partition_key, flow_id) per flow: O(members of the batch's flows).
func projectFlowsSQL(f Filter) (string, []any) {
	p := params{nil, nil, nil}
	tenant := f.flowTenantSQL(&p, "fc")
	return `
WITH fl AS (
    SELECT fc.flow_id FROM ff_flow_core fc
     WHERE fc.partition_key = $1 AND fc.flow_id = ANY($2::uuid[])` + tenant + `
), agg AS (
    SELECT e.flow_id,
           count(*) FILTER (WHERE e.public_state = 'completed') AS completed,
           count(*) FILTER (WHERE e.public_state = 'failed') AS failed,
           count(*) FILTER (WHERE e.public_state = 'cancelled') AS cancelled,
           count(*) FILTER (WHERE e.public_state = 'expired') AS expired,
           count(*) FILTER (WHERE e.public_state = 'skipped') AS skipped,
           count(*) FILTER (WHERE e.public_state IN ('active', 'running')) AS active,
           count(*) FILTER (WHERE e.public_state = 'suspended') AS suspended,
           count(*) FILTER (WHERE e.public_state IN ('waiting', 'resumable')) AS waiting,
           count(*) FILTER (WHERE e.public_state = 'delayed') AS delayed,
           count(*) FILTER (WHERE e.public_state = 'rate_limited') AS rate_limited,
           count(*) FILTER (WHERE e.public_state = 'waiting_children') AS waiting_children,
           count(*) AS total
      FROM ff_exec_core e JOIN fl ON fl.flow_id = e.flow_id
     WHERE e.partition_key = $1 AND e.flow_id = ANY($2::uuid[])
     GROUP BY e.flow_id
), up AS (
    INSERT INTO ff_flow_summary AS s (partition_key, flow_id, total_members, sampled_members,
           members_completed, members_failed, members_cancelled, members_expired, members_skipped, members_active,
           members_suspended, members_waiting, members_delayed, members_rate_limited, members_waiting_children,
           public_flow_state, last_summary_update_at)
    SELECT $1, flow_id, total, LEAST(total, 2147483647),
           LEAST(completed, 2147483647), LEAST(failed, 2147483647), LEAST(cancelled, 2147483647),
           LEAST(expired, 2147483647), LEAST(skipped, 2147483647), LEAST(active, 2147483647),
           LEAST(suspended, 2147483647), LEAST(waiting, 2147483647), LEAST(delayed, 2147483647),
           LEAST(rate_limited, 2147483647), LEAST(waiting_children, 2147483647),
           CASE WHEN completed + failed + cancelled + expired + skipped = total
                     THEN CASE WHEN failed > 0 OR cancelled > 0 OR expired > 0 THEN 'failed' ELSE 'completed' END
                WHEN active > 0 THEN 'running'
                WHEN suspended > 0 OR delayed > 0 OR rate_limited > 0 OR waiting_children > 0 THEN 'blocked'
                ELSE 'open' END,
           $3
      FROM agg
     ORDER BY flow_id
    ON CONFLICT (partition_key, flow_id) DO UPDATE SET
           total_members = EXCLUDED.total_members,
           sampled_members = EXCLUDED.sampled_members,
           members_completed = EXCLUDED.members_completed,
           members_failed = EXCLUDED.members_failed,
           members_cancelled = EXCLUDED.members_cancelled,
           members_expired = EXCLUDED.members_expired,
           members_skipped = EXCLUDED.members_skipped,
           members_active = EXCLUDED.members_active,
           members_suspended = EXCLUDED.members_suspended,
           members_waiting = EXCLUDED.members_waiting,
           members_delayed = EXCLUDED.members_delayed,
           members_rate_limited = EXCLUDED.members_rate_limited,
           members_waiting_children = EXCLUDED.members_waiting_children,
           public_flow_state = EXCLUDED.public_flow_state,
           last_summary_update_at = EXCLUDED.last_summary_update_at
    RETURNING s.flow_id
)
SELECT count(*) FROM up`, p[3:]
}

// ProjectFlows writes the summary of each of flowIDs (of partition) that
// exists in ff_flow_core, passes f and has members, at nowMs, and returns
// how many it wrote. A second call writes the same counts again (with its
// own time).
func ProjectFlows(ctx context.Context, db DB, partition int16, flowIDs []string, nowMs int64, f Filter) (int, error) {
	if len(flowIDs) == 0 {
		return 0, nil
	}
	sql, filterArgs := projectFlowsSQL(f)
	var n int
	if err := db.QueryRow(ctx, sql, append([]any{partition, flowIDs, nowMs}, filterArgs...)...).Scan(&n); err != nil {
		return 0, fmt.Errorf("project %d flows of partition %d: %w", len(flowIDs), partition, err)
	}
	return n, nil
}
