package store

import (
	"context"
	"fmt"
	"strings"
)

// EndedPhases is the condition on an execution aliased r that it ended:
// lifecycle_phase 'terminal', or 'cancelled', the literal FlowFabric's
// Postgres cancels write (operator.rs l.214, flow.rs l.674) and its own
// trim never deletes (it selects 'terminal' alone, exec_core.rs l.1273).
const EndedPhases = "r.lifecycle_phase IN ('terminal', 'cancelled')"

// TerminalExecutions are executions that ended, terminal or cancelled
// (EndedPhases): due for retention once their terminal_at_ms is older than
// the retention (the reconciler shifts "now" back by it), at or before the
// cutoff as in FlowFabric's trim. An execution whose terminal_at_ms is NULL
// is never due, as there.
//
// Index: ffreconcile_exec_core_ended_idx, ours (migrations.
// ApplyRetentionIndex), partial on both ended phases: a probe reads one
// entry per partition and a trim O(its batch), however many live or recent
// executions the partition holds. FlowFabric's own trim has no such index
// and reads a lane's executions whole.
//
// The tag filter compares the tag as text (TagText), as FlowFabric's trim
// does (raw_fields->'tags'->>$6 = $7): a terminal execution tagged with the
// number 7 is trimmed by a fleet filtered on the value "7", though that
// fleet's other reconcilers leave it alone.
var TerminalExecutions = &Due{
	What:      "terminal executions past retention",
	From:      "ff_exec_core r",
	Tenant:    true,
	TagText:   true,
	At:        "r.terminal_at_ms",
	Inclusive: true,
	Where:     EndedPhases,
	ID:        Key{"r.execution_id", "uuid"},
	Index:     "ffreconcile_exec_core_ended_idx",
}

// RetentionSiblingTables are the execution-scoped tables whose rows of a
// trimmed execution are deleted with it: FlowFabric's trim's two lists
// (RETENTION_SIBLING_TABLES_UUID and _TEXT in exec_core.rs), by the type of
// their execution_id column. A table added to FlowFabric with an
// execution_id must be added here, or its rows outlive their execution.
// The text tables' rows are matched under the bare uuid (what FlowFabric's
// trim binds) or the wire id "{fp:N}:<uuid>" (what ff_cancel_backlog_member
// and ff_quota_* store, which FlowFabric's trim therefore never deletes).
var RetentionSiblingTables = struct{ UUID, Text []string }{
	UUID: []string{"ff_attempt", "ff_claim_grant", "ff_completion_event", "ff_stream_frame",
		"ff_stream_meta", "ff_stream_summary", "ff_suspension_current", "ff_waitpoint_pending"},
	Text: []string{"ff_cancel_backlog_member", "ff_lease_event", "ff_operator_event",
		"ff_quota_admitted", "ff_quota_window", "ff_signal_event"},
}

// TrimResult says what one TrimExecutions call deleted.
type TrimResult struct {
	// Executions deleted from ff_exec_core.
	Executions int
	// SiblingRows deleted from the sibling tables, all together.
	SiblingRows int64
	// OldestTerminalMs is the smallest terminal_at_ms of the executions
	// deleted (0 when none): how late the trim came for the oldest of them
	// is now − retention − this.
	OldestTerminalMs int64
}

// trimSQL builds the trim statement for filter f: $1 partition, $2 cutoff,
// $3 batch size, then the filter's parameters.
//
// One statement, so one round trip and one snapshot: doomed locks a batch of
// due executions, oldest first (FOR UPDATE re-evaluates the conditions on a
// row's newest version, so an execution replayed out of its terminal phase
// or moved past the cutoff since the snapshot is left; SKIP LOCKED leaves
// rows another trim or a writer holds, so two trims of one partition split
// it instead of queueing), then every sibling table's rows of those
// executions are deleted and the executions last. Until commit the locks
// keep a replay from reviving an execution whose rows are being deleted.
//
// Indexes: the retention index for doomed; for the uuid siblings, each
// table's (partition_key, execution_id) index or primary key (probes per
// execution); for ff_cancel_backlog_member, ff_quota_* and the three event
// outboxes, whose indexes lead with partition_key only, the partition's
// rows of that table once per batch: FlowFabric indexes them no better,
// and outbox retention (TrimLeaseEvents) keeps ff_lease_event, the big one,
// bounded.
func trimSQL(f Filter) (string, []any) {
	p := params{nil, nil, nil}
	filter := TerminalExecutions.filterSQL(&p, f, "r")
	var b strings.Builder
	b.WriteString(`
WITH doomed AS (
    SELECT r.execution_id, r.execution_id::text AS id_text,
           '{fp:' || r.partition_key::text || '}:' || r.execution_id::text AS wire_text, r.terminal_at_ms
      FROM ff_exec_core r
     WHERE r.partition_key = $1 AND ` + EndedPhases + `
       AND r.terminal_at_ms IS NOT NULL AND r.terminal_at_ms <= $2` + filter + `
     ORDER BY r.terminal_at_ms, r.execution_id
     LIMIT $3
       FOR UPDATE SKIP LOCKED
)`)
	// ids: each doomed execution's two text forms.
	b.WriteString(`, ids AS (SELECT id_text AS k FROM doomed UNION ALL SELECT wire_text FROM doomed)`)
	var counts []string
	for i, t := range RetentionSiblingTables.UUID {
		fmt.Fprintf(&b, `, u%d AS (DELETE FROM %s t USING doomed d WHERE t.partition_key = $1 AND t.execution_id = d.execution_id RETURNING 1)`, i, t)
		counts = append(counts, fmt.Sprintf("(SELECT count(*) FROM u%d)", i))
	}
	for i, t := range RetentionSiblingTables.Text {
		fmt.Fprintf(&b, `, x%d AS (DELETE FROM %s t WHERE t.partition_key = $1 AND t.execution_id = ANY (SELECT k FROM ids) RETURNING 1)`, i, t)
		counts = append(counts, fmt.Sprintf("(SELECT count(*) FROM x%d)", i))
	}
	b.WriteString(`, core AS (DELETE FROM ff_exec_core t USING doomed d WHERE t.partition_key = $1 AND t.execution_id = d.execution_id RETURNING d.terminal_at_ms)
SELECT (SELECT count(*) FROM core), ` + strings.Join(counts, " + ") + `, COALESCE((SELECT min(terminal_at_ms) FROM core), 0)`)
	return b.String(), p
}

// TrimExecutions deletes up to limit executions of one partition that
// ended (terminal or cancelled) with terminal_at_ms at or before cutoffMs and
// pass f, with every row of theirs in the sibling tables, in one
// transaction: FlowFabric's trim_retention_impl, except that each execution
// is locked and re-checked first, the batch spans the partition's lanes,
// cancelled executions are trimmed too and the text tables' rows are
// matched under the wire id as well. A result with fewer than
// limit executions means the partition held no more (that this call could
// lock); a second call over the same rows deletes nothing.
func TrimExecutions(ctx context.Context, db DB, partition int16, cutoffMs int64, limit int, f Filter) (TrimResult, error) {
	sql, args := trimSQL(f)
	args[0], args[1], args[2] = partition, cutoffMs, limit
	var (
		r TrimResult
		n int64
	)
	if err := db.QueryRow(ctx, sql, args...).Scan(&n, &r.SiblingRows, &r.OldestTerminalMs); err != nil {
		return TrimResult{}, fmt.Errorf("trim terminal executions of partition %d: %w", partition, err)
	}
	r.Executions = int(n)
	return r, nil
}
