// Package store holds every SQL statement the reconcilers run against the
// FlowFabric ff_* tables. It knows nothing of River: workers call it with a
// pool or a transaction.
//
// Each scan states the index it relies on. The lease, suspension and
// promotion actions are one statement each, whose data-modifying CTEs
// re-check the row's condition under its row lock: under READ COMMITTED an
// UPDATE (or SELECT … FOR UPDATE) locks the row and re-evaluates its WHERE
// clause against the newest committed version, which is the seeds' SELECT …
// FOR UPDATE then check, in one round trip. The two sibling-cancel actions
// branch on what they find (SKIP LOCKED, then a probe), so they are short
// transactions that lock first and decide after. Either way a second run of
// the same action finds the condition false and changes nothing.
package store

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is what store functions need: *pgxpool.Pool, *pgx.Conn and pgx.Tx all
// satisfy it.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// NowMs is the current time in epoch milliseconds, FlowFabric's time unit.
func NowMs() int64 { return time.Now().UnixMilli() }

// Filter is FlowFabric's ScannerFilter: it limits a fleet to one tenant. A
// row passes when its execution's raw_fields namespace equals Namespace (if
// set) and raw_fields tags[TagKey] equals TagValue (if TagKey is set). A
// missing execution row never passes a non-empty filter.
type Filter struct {
	Namespace string
	TagKey    string
	TagValue  string
}

// Empty reports whether the filter lets every row through.
func (f Filter) Empty() bool { return f.Namespace == "" && f.TagKey == "" }

// ParseInstanceTag parses KEY=VALUE into a filter's tag half.
func ParseInstanceTag(s string) (key, value string, err error) {
	key, value, ok := strings.Cut(s, "=")
	if !ok || key == "" {
		return "", "", fmt.Errorf("instance tag %q: want KEY=VALUE, e.g. cairn.instance_id=worker-7", s)
	}
	return key, value, nil
}

// sql appends the filter's conditions on the execution row aliased e,
// numbering its parameters after those already in args, and returns the
// extended args. The values are always bound, never interpolated.
func (f Filter) sql(args []any) (string, []any) {
	var b strings.Builder
	if f.Namespace != "" {
		args = append(args, f.Namespace)
		fmt.Fprintf(&b, " AND e.raw_fields->>'namespace' = $%d", len(args))
	}
	if f.TagKey != "" {
		args = append(args, f.TagKey, f.TagValue)
		fmt.Fprintf(&b, " AND e.raw_fields->'tags'->>$%d = $%d", len(args)-1, len(args))
	}
	return b.String(), args
}

// After is a keyset position in a scan's order: rows strictly after it are
// returned. Its fields mean what the scan's order says.
type After struct {
	AtMs int64
	ID   string
	ID2  string
	N    int32
}

// NoLowerBound is the fromMs of a due-partition query that takes every row
// due by its horizon, however old.
const NoLowerBound int64 = math.MinInt64

// partitionsSQL turns a per-partition probe (which refers to the partition
// as s.p) into the single query a tick runs. LATERAL … LIMIT 1 makes the plan
// a nested loop: for each partition the probe runs with its key bound, prunes
// at run time to one hash child and reads the first entry of a partial index.
// The cost is 256 index probes whatever the number of not-due rows, and a
// partition with a backlog costs one row, not its backlog.
func partitionsSQL(probe string) string {
	return `SELECT s.p FROM (SELECT g::smallint AS p FROM generate_series(0, $1::int - 1) AS g) AS s
	 CROSS JOIN LATERAL (` + probe + ` LIMIT 1) AS due`
}

// countsSQL turns the same probe into a count of its rows for each partition
// in $1 (a smallint[]): O(rows the probes match), one index range each.
func countsSQL(probe string) string {
	return `SELECT s.p, (SELECT count(*) FROM (` + probe + `) AS due) FROM unnest($1::smallint[]) AS s(p)`
}

// DueCountsQuery is a CountDue* function: for each of parts, how many of its
// rows are due at nowMs and pass f.
type DueCountsQuery func(ctx context.Context, db DB, nowMs int64, parts []int16, f Filter) (map[int16]int, error)

// probeFunc builds a reconciler's partition probe of s.p for rows due by $2
// (with the reconciler's own comparison) and not before $3, appending f's
// conditions to args.
type probeFunc func(args []any, f Filter) (string, []any)

// countDue runs countsSQL over parts with the probe of rows due at nowMs;
// what names the rows in the error.
func countDue(ctx context.Context, db DB, probe probeFunc, parts []int16, nowMs int64, f Filter, what string) (map[int16]int, error) {
	q, args := probe([]any{parts, nowMs, NoLowerBound}, f)
	rows, err := db.Query(ctx, countsSQL(q), args...)
	if err != nil {
		return nil, fmt.Errorf("count %s: %w", what, err)
	}
	out := map[int16]int{}
	var (
		p int16
		n int64
	)
	if _, err := pgx.ForEachRow(rows, []any{&p, &n}, func() error {
		out[p] = int(n)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("count %s: %w", what, err)
	}
	return out, nil
}

func collectPartitions(rows pgx.Rows, err error) ([]int16, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int16])
}

// distinctRounds splits the indexes of keys into rounds in which no key
// repeats, each in input order: the first occurrence of every key in the
// first round, the second in the next, and so on. Batched statements use it
// where two items of one key in one statement would see each other's rows
// as they were before either changed them.
func distinctRounds(keys []string) [][]int {
	var rounds [][]int
	seen := map[string]int{} // key → rounds it already appears in
	for i, k := range keys {
		r := seen[k]
		seen[k] = r + 1
		if r == len(rounds) {
			rounds = append(rounds, nil)
		}
		rounds[r] = append(rounds[r], i)
	}
	return rounds
}

// batch is one batched row-action statement: items keyed by execution id,
// one result row per item of a round, in the round's order.
type batch[R any] struct {
	sql string
	// args are the statement's parameters for the items of one round.
	args func(round []int) []any
	// dest receives one result row; read turns it into the item's result.
	dest []any
	read func() R
	// what names the work of one round for errors: the row itself when the
	// round has one item.
	what func(round []int) string
}

// run executes b for keys in distinct-key rounds (see distinctRounds) and
// returns one result per key, in order.
func (b batch[R]) run(ctx context.Context, db DB, keys []string) ([]R, error) {
	out := make([]R, len(keys))
	for _, round := range distinctRounds(keys) {
		rows, err := db.Query(ctx, b.sql, b.args(round)...)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", b.what(round), err)
		}
		i := 0
		_, err = pgx.ForEachRow(rows, b.dest, func() error {
			if i >= len(round) {
				return fmt.Errorf("more result rows than the %d asked for", len(round))
			}
			out[round[i]] = b.read()
			i++
			return nil
		})
		if err == nil && i != len(round) {
			err = fmt.Errorf("%d result rows for %d asked for", i, len(round))
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", b.what(round), err)
		}
	}
	return out, nil
}

// pick returns the elements of all at the indexes of round.
func pick[T any](all []T, round []int) []T {
	out := make([]T, len(round))
	for i, k := range round {
		out[i] = all[k]
	}
	return out
}
