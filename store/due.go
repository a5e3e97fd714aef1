package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// dueSource is the set of due rows of one reconciler, for counting: its
// table (aliased r), the join to its execution (aliased e, for the tenant
// filter) and the due predicate ($1 is now in ms).
type dueSource struct {
	from    string
	joinE   string
	dueCond string
}

var dueSources = map[string]dueSource{
	"lease_expiry": {
		from:    `ff_attempt r`,
		joinE:   `ff_exec_core e ON e.partition_key = r.partition_key AND e.execution_id = r.execution_id`,
		dueCond: `r.lease_expires_at_ms IS NOT NULL AND r.lease_expires_at_ms < $1`,
	},
	"suspension_timeout": {
		from:    `ff_suspension_current r`,
		joinE:   `ff_exec_core e ON e.partition_key = r.partition_key AND e.execution_id = r.execution_id`,
		dueCond: `r.timeout_at_ms IS NOT NULL AND r.timeout_at_ms < $1`,
	},
	"delayed_promotion": {
		from:  `ff_exec_core r`,
		joinE: `ff_exec_core e ON e.partition_key = r.partition_key AND e.execution_id = r.execution_id`,
		dueCond: `r.deadline_at_ms IS NOT NULL AND r.deadline_at_ms <= $1
		          AND r.lifecycle_phase = 'runnable' AND r.eligibility_state = 'not_eligible_until_time'`,
	},
	// Pending cancel groups are due as soon as they exist, as the scans
	// treat them ($1 is unused); a group belongs to the tenant of its
	// downstream execution.
	"cancel_dispatch": {
		from:    `ff_pending_cancel_groups r`,
		joinE:   `ff_exec_core e ON e.partition_key = r.partition_key AND e.execution_id = r.downstream_eid`,
		dueCond: `$1::bigint IS NOT NULL`,
	},
	"cancel_reconcile": {
		from:    `ff_pending_cancel_groups r`,
		joinE:   `ff_exec_core e ON e.partition_key = r.partition_key AND e.execution_id = r.downstream_eid`,
		dueCond: `$1::bigint IS NOT NULL`,
	},
}

// DueCount is how many rows a reconciler has due.
type DueCount struct {
	// Due rows that pass the filter (all due rows without a filter).
	Due int64
	// OutsideFilter is the number of due rows the filter leaves to other
	// fleets (0 without a filter).
	OutsideFilter int64
	// Capped: the count stopped at the cap; there are at least this many.
	Capped bool
}

// CountDue counts a reconciler's due rows, up to capRows of them so a huge
// backlog costs a bounded read (a gauge needs no more precision). It walks
// the same partial indexes as the scans.
func CountDue(ctx context.Context, db DB, reconciler string, nowMs int64, f Filter, capRows int) (DueCount, error) {
	src, ok := dueSources[reconciler]
	if !ok {
		return DueCount{}, fmt.Errorf("count due rows: unknown reconciler %q", reconciler)
	}
	args := []any{nowMs, capRows}
	var sql string
	if f.Empty() {
		sql = `SELECT count(*), 0 FROM (SELECT 1 FROM ` + src.from + ` WHERE ` + src.dueCond + ` LIMIT $2) x`
	} else {
		var cond string
		cond, args = f.sql(args)
		// cond starts with " AND …"; as a boolean column it needs "true".
		sql = `SELECT count(*) FILTER (WHERE pass), count(*) FILTER (WHERE NOT pass) FROM (
		         SELECT COALESCE(e.execution_id IS NOT NULL` + cond + `, false) AS pass
		           FROM ` + src.from + ` LEFT JOIN ` + src.joinE + `
		          WHERE ` + src.dueCond + ` LIMIT $2) x`
	}
	var c DueCount
	if err := db.QueryRow(ctx, sql, args...).Scan(&c.Due, &c.OutsideFilter); err != nil {
		return DueCount{}, fmt.Errorf("count due rows of %s: %w", reconciler, err)
	}
	c.Capped = c.Due+c.OutsideFilter >= int64(capRows)
	return c, nil
}

// PartitionDue is the number of due rows in one partition.
type PartitionDue struct {
	Partition int16
	Due       int64
}

// TopDuePartitions returns the partitions holding the most due rows that
// pass f, most first, counting at most capRows rows in all.
func TopDuePartitions(ctx context.Context, db DB, reconciler string, nowMs int64, f Filter, limit, capRows int) ([]PartitionDue, error) {
	src, ok := dueSources[reconciler]
	if !ok {
		return nil, fmt.Errorf("top due partitions: unknown reconciler %q", reconciler)
	}
	args := []any{nowMs, capRows, limit}
	from, cond := src.from, ""
	if !f.Empty() {
		cond, args = f.sql(args)
		from += ` JOIN ` + src.joinE
	}
	rows, err := db.Query(ctx, `
		SELECT partition_key, count(*) FROM (
		    SELECT r.partition_key FROM `+from+` WHERE `+src.dueCond+cond+` LIMIT $2) x
		 GROUP BY partition_key ORDER BY count(*) DESC, partition_key LIMIT $3`, args...)
	if err != nil {
		return nil, fmt.Errorf("top due partitions of %s: %w", reconciler, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (PartitionDue, error) {
		var p PartitionDue
		err := r.Scan(&p.Partition, &p.Due)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("top due partitions of %s: %w", reconciler, err)
	}
	return out, nil
}
