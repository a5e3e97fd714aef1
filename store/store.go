// Package store holds every SQL statement of the reconciler fleet. Workers
// call it with a pool or a transaction; it knows no River client or worker.
//
// Most of it reads and writes FlowFabric's ff_* tables: each reconciler's
// file declares its Due (what makes its rows due, and the index every query
// of them reads; see due.go) and its row statement. The lease, suspension,
// promotion and deadline actions are one statement each, whose
// data-modifying CTEs re-check the row's condition under its row lock: under
// READ COMMITTED an UPDATE (or SELECT … FOR UPDATE) locks the row and
// re-evaluates its WHERE clause against the newest committed version, which
// is the seeds' SELECT … FOR UPDATE then check, in one round trip. The two
// sibling-cancel actions branch on what they find (SKIP LOCKED, then a
// probe), so they are short transactions that lock first and decide after.
// Either way a second run of the same action finds the condition false and
// changes nothing.
//
// A few queries read River's own tables, by SQL, for what River's API does
// not offer: the unfinished jobs a tick skips (riverjobs.go), the queue
// depth and leader `worker status` shows (status.go), and the fleet's
// heartbeat table in River's schema (heartbeat.go).
package store

import (
	"context"
	"errors"
	"fmt"
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

// sql returns the filter's conditions on the execution row aliased alias,
// each starting with " AND ", adding their values to p: always bound, never
// interpolated.
func (f Filter) sql(p *params, alias string) string {
	var b strings.Builder
	if f.Namespace != "" {
		fmt.Fprintf(&b, " AND %s.raw_fields->>'namespace' = %s", alias, p.add(f.Namespace))
	}
	if f.TagKey != "" {
		k, v := p.add(f.TagKey), p.add(f.TagValue)
		fmt.Fprintf(&b, " AND %s.raw_fields->'tags'->>%s = %s", alias, k, v)
	}
	return b.String()
}

// Beginner starts a transaction: *pgxpool.Pool, *pgx.Conn and pgx.Tx (a
// savepoint) satisfy it.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// inTx runs fn in a transaction, committing when it returns true and rolling
// back otherwise (a pass that changed nothing releases its locks without a
// commit record).
func inTx(ctx context.Context, db Beginner, fn func(pgx.Tx) (commit bool, err error)) (err error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer func() {
		if rbErr := tx.Rollback(context.WithoutCancel(ctx)); rbErr != nil && !errors.Is(rbErr, pgx.ErrTxClosed) && err == nil {
			err = fmt.Errorf("rollback: %w", rbErr)
		}
	}()
	commit, err := fn(tx)
	if err != nil || !commit {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
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

// batch is one batched row-action statement over a partition's rows: items
// keyed by row, one result row per item of a round, in the round's order.
type batch[R any] struct {
	sql       string
	partition int16
	// args are the statement's parameters for the items of one round.
	args func(round []int) []any
	// dest receives one result row; read turns it into the item's result.
	dest []any
	read func() R
	// what names the action for errors ("release lease"); label names item
	// i in them (default: its key).
	what  string
	label func(i int) string
}

// run executes b for keys in distinct-key rounds (see distinctRounds) and
// returns one result per key, in order.
func (b batch[R]) run(ctx context.Context, db DB, keys []string) ([]R, error) {
	out := make([]R, len(keys))
	fail := func(round []int, err error) error {
		if len(round) == 1 {
			label := keys[round[0]]
			if b.label != nil {
				label = b.label(round[0])
			}
			return fmt.Errorf("%s %d/%s: %w", b.what, b.partition, label, err)
		}
		return fmt.Errorf("%s: %d rows of partition %d: %w", b.what, len(round), b.partition, err)
	}
	for _, round := range distinctRounds(keys) {
		rows, err := db.Query(ctx, b.sql, b.args(round)...)
		if err != nil {
			return nil, fail(round, err)
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
			return nil, fail(round, err)
		}
	}
	return out, nil
}

// one returns the only result of a batch of one.
func one[R any](res []R, err error) (R, error) {
	if err != nil {
		var zero R
		return zero, err
	}
	return res[0], nil
}

// pick returns the elements of all at the indexes of round.
func pick[T any](all []T, round []int) []T {
	out := make([]T, len(round))
	for i, k := range round {
		out[i] = all[k]
	}
	return out
}
