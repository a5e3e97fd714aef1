package store

import (
	"context"
	"fmt"
	"math"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Due describes what makes one reconciler's rows due, and every query that
// finds them is built from it: the tick's probe for partitions holding due
// rows (Partitions), its count of a busy partition's due rows (Counts), the
// partition scan (Scan), the due-rows gauge of /metrics and `worker status`
// (Count, Top), and the age of the oldest due row (Oldest). Each
// reconciler's store file declares its Due next to its row statement,
// naming the index its queries read.
//
// Every query reads a row's partition through the reconciler's partial
// index on (partition_key, deadline): a probe reads one index entry per
// partition and a scan O(due rows of the partition), whatever the number of
// rows not yet due. Rows are totally ordered by (deadline, key), so a scan
// continues after any row (see DueRow).
type Due struct {
	// What names the rows in errors, e.g. "expired leases".
	What string
	// From is the table, aliased r.
	From string
	// Exec joins the row's execution as e (on partition_key and the row's
	// execution id). Empty when the table is ff_exec_core itself (then the
	// tenant filter applies to r) or when the rows belong to no tenant.
	Exec string
	// Tenant: the tenant filter applies to these rows. A row whose
	// execution is missing never passes a set filter.
	Tenant bool
	// TenantColumns: the filter reads the row's own namespace and
	// instance_tag columns (the tag by value), not an execution's
	// raw_fields: completion events, as FlowFabric filters them.
	TenantColumns bool
	// TenantVia, with Tenant and no Exec: the row belongs to the tenants
	// of several executions, and passes the filter when one of them does.
	// It is the body of a subquery correlated with r, "<FROM … JOIN
	// ff_exec_core e …> WHERE <correlation>", each of whose results is
	// an execution aliased e: a cancel backlog header passes when one of
	// its members' executions does (FlowFabric's cancel_reconciler filters
	// per member). A row with no such execution passes no filter.
	TenantVia string
	// TagText: the filter's tag is compared as text (->>), so a tag stored
	// as the number 7 matches the value "7": what FlowFabric's retention
	// trim does. Otherwise only a JSON string tag matches, as in
	// FlowFabric's scanners (see Filter).
	TagText bool
	// ExecInWhere: Where reads the execution (e), so the join is part of
	// what makes a row due, not only of the tenant filter.
	ExecInWhere bool
	// At is the row's deadline, a bigint expression; rows are due when it
	// is before now (at or before, with Inclusive) and ordered by it.
	At string
	// Inclusive: due when At <= now, the seeds' comparison for delayed
	// promotions and budget resets (At < now otherwise).
	Inclusive bool
	// Always: due as soon as the row exists (pending cancel groups); At
	// only orders the rows.
	Always bool
	// Where is any further condition a due row meets ("" for none).
	Where string
	// Join is a further join that Where reads ("" for none), in every
	// query of these rows: a LEFT JOIN by the joined table's primary key,
	// so a row without a match is still read. A join, not a subquery in
	// Where, so that the planner carries the partition key across it (a
	// scan reads one child of the joined table, not 256) and reads it by
	// key (Postgres plans NOT EXISTS as an anti-join, which it chose to
	// plan as a hash of every row of the table, built at each probe).
	Join string
	// ID is the row's key within its partition; ID2 and N complete it when
	// it has more columns (ID2 another id, N an integer).
	ID, ID2 Key
	N       string
	// Index is the index the probe and the scan read, for documentation and
	// the plan tests.
	Index string
}

// Key is one key column of a Due row and its SQL type (uuid or text).
type Key struct {
	Col  string
	Type string
}

// DueRow is one due row as a scan returns it: its deadline and key, which
// is also the position a scan continues after.
type DueRow struct {
	AtMs int64
	ID   string
	ID2  string
	N    int32
}

// NoLowerBound is the fromMs of a Partitions query that takes every row due
// by its horizon, however old.
const NoLowerBound int64 = math.MinInt64

// params numbers a query's parameters as they are added.
type params []any

// add appends v and returns its placeholder.
func (p *params) add(v any) string {
	*p = append(*p, v)
	return fmt.Sprintf("$%d", len(*p))
}

// filterAlias is the alias the tenant filter's conditions read.
func (d *Due) filterAlias() string {
	if d.Exec != "" {
		return "e"
	}
	return "r"
}

// filterSQL is f's conditions on alias, its tag compared as these rows'
// reconciler compares it (TagText).
func (d *Due) filterSQL(p *params, f Filter, alias string) string {
	if d.TenantColumns {
		return f.columnsSQL(p, "r")
	}
	return f.sql(p, alias, d.TagText)
}

// from returns the FROM clause; join says the tenant filter is set.
func (d *Due) from(join bool) string {
	from := d.table()
	if d.Exec != "" && (join || d.ExecInWhere) {
		return from + " JOIN " + d.Exec
	}
	return from
}

// table is From with Join.
func (d *Due) table() string {
	if d.Join != "" {
		return d.From + " " + d.Join
	}
	return d.From
}

// dueBefore is the condition "due at t" (t a placeholder).
func (d *Due) dueBefore(t string) string {
	op := " < "
	if d.Inclusive {
		op = " <= "
	}
	return d.At + " IS NOT NULL AND " + d.At + op + t
}

// where returns the conditions shared by every query of due rows: Where and
// the tenant filter. Each starts with " AND ".
func (d *Due) where(p *params, f Filter) string {
	var b strings.Builder
	if d.Where != "" {
		b.WriteString(" AND " + d.Where)
	}
	if d.Tenant {
		b.WriteString(d.tenantCond(p, f))
	}
	return b.String()
}

// tenantCond is the tenant filter f on a due row, starting with " AND "
// ("" when f is empty): on its execution, or through TenantVia on any of
// its executions.
func (d *Due) tenantCond(p *params, f Filter) string {
	if d.TenantVia == "" {
		return d.filterSQL(p, f, d.filterAlias())
	}
	if f.Empty() {
		return ""
	}
	return " AND EXISTS (SELECT 1 FROM " + d.TenantVia + d.filterSQL(p, f, "e") + ")"
}

// probe is the per-partition probe of partition s.p for rows due by horizon
// (inclusively or not, as the rows are due) and not before from: a tick
// passes now plus its lookahead, and NoLowerBound.
func (d *Due) probe(p *params, horizonMs, fromMs int64, f Filter) string {
	cond := ""
	if !d.Always {
		cond = " AND " + d.dueBefore(p.add(horizonMs)) + " AND " + d.At + " >= " + p.add(fromMs)
	}
	return `SELECT 1 FROM ` + d.from(!f.Empty()) + ` WHERE r.partition_key = s.p` + cond + d.where(p, f)
}

// Partitions returns, in order, the partitions 0..partitionCount-1 holding at
// least one row due at or after fromMs (NoLowerBound: any) and by horizonMs,
// that passes f; a tick passes now plus its lookahead. For rows due as soon
// as they exist the window is ignored.
//
// One query, not one per partition: LATERAL … LIMIT 1 makes the plan a
// nested loop in which each partition's probe prunes at run time to one
// hash child and reads the first entry of the reconciler's partial index.
// The cost is one index probe per partition whatever the number of rows not
// yet due, and a partition with a backlog costs one row, not its backlog.
func (d *Due) Partitions(ctx context.Context, db DB, fromMs, horizonMs int64, partitionCount int, f Filter) ([]int16, error) {
	p := params{partitionCount}
	probe := d.probe(&p, horizonMs, fromMs, f)
	rows, err := db.Query(ctx, `SELECT s.p FROM (SELECT g::smallint AS p FROM generate_series(0, $1::int - 1) AS g) AS s
	 CROSS JOIN LATERAL (`+probe+` LIMIT 1) AS due`, p...)
	if err != nil {
		return nil, fmt.Errorf("find partitions with %s: %w", d.What, err)
	}
	parts, err := pgx.CollectRows(rows, pgx.RowTo[int16])
	if err != nil {
		return nil, fmt.Errorf("find partitions with %s: %w", d.What, err)
	}
	return parts, nil
}

// Counts returns, for each of parts, the number of its rows due at nowMs
// that pass f: O(due rows of parts), one index range each. A tick counts
// the due rows of the partitions it finds busy.
func (d *Due) Counts(ctx context.Context, db DB, nowMs int64, parts []int16, f Filter) (map[int16]int, error) {
	p := params{parts}
	probe := d.probe(&p, nowMs, NoLowerBound, f)
	rows, err := db.Query(ctx, `SELECT s.p, (SELECT count(*) FROM (`+probe+`) AS due) FROM unnest($1::smallint[]) AS s(p)`, p...)
	if err != nil {
		return nil, fmt.Errorf("count %s: %w", d.What, err)
	}
	out := map[int16]int{}
	var (
		part int16
		n    int64
	)
	if _, err := pgx.ForEachRow(rows, []any{&part, &n}, func() error {
		out[part] = int(n)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("count %s: %w", d.What, err)
	}
	return out, nil
}

// keys returns the key columns in order, and the cursor's matching
// placeholders (nil p: no cursor).
func (d *Due) keys(p *params, after *DueRow) (cols, vals []string) {
	add := func(col, val string) {
		cols = append(cols, col)
		vals = append(vals, val)
	}
	ph := func(v any, typ string) string {
		if p == nil {
			return ""
		}
		s := p.add(v)
		if typ != "" && typ != "text" {
			s += "::" + typ
		}
		return s
	}
	var a DueRow
	if after != nil {
		a = *after
	}
	add(d.ID.Col, ph(a.ID, d.ID.Type))
	if d.ID2.Col != "" {
		add(d.ID2.Col, ph(a.ID2, d.ID2.Type))
	}
	if d.N != "" {
		add(d.N, ph(a.N, ""))
	}
	return cols, vals
}

// Scan returns up to limit rows of one partition due by boundMs that pass f,
// in the order (deadline, key), after the row after when it is set. A tick's
// scan passes now plus the reconciler's lookahead.
//
// The cursor is a keyset position: the redundant bound At >= after.AtMs lets
// the index range start at the cursor instead of filtering from the
// partition's oldest row, and the key breaks ties among equal deadlines
// (an incremental sort of those rows).
func (d *Due) Scan(ctx context.Context, db DB, partition int16, boundMs int64, after *DueRow, limit int, f Filter) ([]DueRow, error) {
	p := params{partition, limit}
	cond := ""
	if !d.Always {
		cond = " AND " + d.dueBefore(p.add(boundMs))
	}
	if after != nil {
		at := p.add(after.AtMs)
		cols, vals := d.keys(&p, after)
		cond += " AND " + d.At + " >= " + at + " AND (" + d.At + ", " + strings.Join(cols, ", ") + ") > (" + at + ", " + strings.Join(vals, ", ") + ")"
	}
	cond += d.where(&p, f)
	cols, _ := d.keys(nil, nil)
	sel := []string{d.At, text(d.ID)}
	if d.ID2.Col != "" {
		sel = append(sel, text(d.ID2))
	} else {
		sel = append(sel, "''")
	}
	if d.N != "" {
		sel = append(sel, d.N)
	} else {
		sel = append(sel, "0")
	}
	rows, err := db.Query(ctx, `
		SELECT `+strings.Join(sel, ", ")+`
		  FROM `+d.from(!f.Empty())+`
		 WHERE r.partition_key = $1`+cond+`
		 ORDER BY `+d.At+`, `+strings.Join(cols, ", ")+`
		 LIMIT $2`, p...)
	if err != nil {
		return nil, fmt.Errorf("scan %s in partition %d: %w", d.What, partition, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DueRow, error) {
		var x DueRow
		err := r.Scan(&x.AtMs, &x.ID, &x.ID2, &x.N)
		return x, err
	})
	if err != nil {
		return nil, fmt.Errorf("scan %s in partition %d: %w", d.What, partition, err)
	}
	return out, nil
}

func text(k Key) string {
	if k.Type == "text" {
		return k.Col
	}
	return k.Col + "::text"
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

// Count counts the rows due at nowMs, up to capRows of them so that a huge
// backlog costs a bounded read (a gauge needs no more precision), through
// the same index as the scans. With a filter it also counts the due rows
// the filter leaves to other fleets.
func (d *Due) Count(ctx context.Context, db DB, nowMs int64, f Filter, capRows int) (DueCount, error) {
	p := params{}
	due := "true"
	if !d.Always {
		due = d.dueBefore(p.add(nowMs))
	}
	limit := p.add(capRows)
	var sql string
	if f.Empty() || !d.Tenant {
		sql = `SELECT count(*), 0 FROM (SELECT 1 FROM ` + d.from(false) + ` WHERE ` + due + d.where(&p, Filter{}) + ` LIMIT ` + limit + `) x`
	} else {
		// The filter as a column: rows outside it are counted too. Where
		// keeps its own (inner) meaning when it reads the execution.
		exists := "true"
		from := d.table()
		if d.Exec != "" {
			exists = "e.execution_id IS NOT NULL"
			from += " LEFT JOIN " + d.Exec
		}
		where := ""
		if d.Where != "" {
			where = " AND " + d.Where
		}
		pass := "COALESCE(" + exists + d.tenantCond(&p, f) + ", false)"
		sql = `SELECT count(*) FILTER (WHERE pass), count(*) FILTER (WHERE NOT pass) FROM (
		         SELECT ` + pass + ` AS pass FROM ` + from + ` WHERE ` + due + where + ` LIMIT ` + limit + `) x`
	}
	var c DueCount
	if err := db.QueryRow(ctx, sql, p...).Scan(&c.Due, &c.OutsideFilter); err != nil {
		return DueCount{}, fmt.Errorf("count %s: %w", d.What, err)
	}
	c.Capped = c.Due+c.OutsideFilter >= int64(capRows)
	return c, nil
}

// Oldest returns the deadline (Unix ms) of the oldest row due at nowMs
// that passes f in partitions 0..partitionCount-1, and false when none is:
// the age of a stall, which the due-rows count and the lateness of actions
// that did commit cannot show. For rows due as soon as they exist it is the
// oldest row's At.
//
// Cost: like Partitions, one probe per partition of the reconciler's
// partial index on (partition_key, At), which LATERAL … ORDER BY At LIMIT 1
// reads from its first entry; min over the partitions' first rows. A
// backlog costs one row per partition, not its size (a row the filter or
// Where rejects is stepped over, as a scan would).
func (d *Due) Oldest(ctx context.Context, db DB, nowMs int64, partitionCount int, f Filter) (int64, bool, error) {
	p := params{partitionCount}
	cond := ""
	if !d.Always {
		cond = " AND " + d.dueBefore(p.add(nowMs))
	}
	cond += d.where(&p, f)
	var oldest *int64
	err := db.QueryRow(ctx, `SELECT min(due.at) FROM (SELECT g::smallint AS p FROM generate_series(0, $1::int - 1) AS g) AS s
	 CROSS JOIN LATERAL (SELECT `+d.At+` AS at FROM `+d.from(!f.Empty())+` WHERE r.partition_key = s.p`+cond+`
	                      ORDER BY `+d.At+` LIMIT 1) AS due`, p...).Scan(&oldest)
	if err != nil {
		return 0, false, fmt.Errorf("find the oldest of %s: %w", d.What, err)
	}
	if oldest == nil {
		return 0, false, nil
	}
	return *oldest, true, nil
}

// PartitionDue is the number of due rows in one partition.
type PartitionDue struct {
	Partition int16
	Due       int64
}

// Top returns the partitions holding the most rows due at nowMs that pass f,
// most first, counting at most capRows rows in all.
func (d *Due) Top(ctx context.Context, db DB, nowMs int64, f Filter, limit, capRows int) ([]PartitionDue, error) {
	p := params{}
	due := "true"
	if !d.Always {
		due = d.dueBefore(p.add(nowMs))
	}
	capPh, limitPh := p.add(capRows), p.add(limit)
	rows, err := db.Query(ctx, `
		SELECT partition_key, count(*) FROM (
		    SELECT r.partition_key FROM `+d.from(!f.Empty())+` WHERE `+due+d.where(&p, f)+` LIMIT `+capPh+`) x
		 GROUP BY partition_key ORDER BY count(*) DESC, partition_key LIMIT `+limitPh, p...)
	if err != nil {
		return nil, fmt.Errorf("top partitions with %s: %w", d.What, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (PartitionDue, error) {
		var x PartitionDue
		err := r.Scan(&x.Partition, &x.Due)
		return x, err
	})
	if err != nil {
		return nil, fmt.Errorf("top partitions with %s: %w", d.What, err)
	}
	return out, nil
}

// execJoin joins the execution of a row keyed by (partition_key,
// execution_id).
const execJoin = `ff_exec_core e ON e.partition_key = r.partition_key AND e.execution_id = r.execution_id`

// Outside reports whether the row key of partition (as a scan returns it;
// AtMs is ignored) exists but does not pass f: its execution is of another
// tenant, or missing. A fleet filtered to one tenant must not act on such a
// row, whoever enqueued its job. False when f is empty, when the rows belong
// to no tenant, or when the row is gone.
//
// Index: the table's primary key (the row's key), and ff_exec_core's.
func (d *Due) Outside(ctx context.Context, db DB, partition int16, key DueRow, f Filter) (bool, error) {
	if f.Empty() || !d.Tenant {
		return false, nil
	}
	p := params{partition}
	cols, vals := d.keys(&p, &key)
	var match strings.Builder
	for i := range cols {
		fmt.Fprintf(&match, " AND %s = %s", cols[i], vals[i])
	}
	filter := d.tenantCond(&p, f)
	var outside bool
	err := db.QueryRow(ctx, `
		SELECT EXISTS (SELECT 1 FROM `+d.From+` WHERE r.partition_key = $1`+match.String()+`)
		   AND NOT EXISTS (SELECT 1 FROM `+d.from(true)+` WHERE r.partition_key = $1`+match.String()+filter+`)`, p...).Scan(&outside)
	if err != nil {
		return false, fmt.Errorf("check tenant of %s row %d/%s: %w", d.What, partition, key.ID, err)
	}
	return outside, nil
}
