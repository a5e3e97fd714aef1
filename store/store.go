// Package store holds every SQL statement of the reconciler fleet. Workers
// call it with a pool or a transaction; it knows no River client or worker.
//
// Most of it reads and writes FlowFabric's ff_* tables: each reconciler's
// file declares its Due (what makes its rows due, and the index every query
// of them reads; see due.go) and its row statement, batched over rows of
// one partition (batch). Most actions (lease, suspension, promotion,
// attempt timeout, registry sweep) are one statement each, whose
// data-modifying CTEs re-check the row's condition under its row lock: under
// READ COMMITTED an UPDATE (or SELECT … FOR UPDATE) locks the row and
// re-evaluates its WHERE clause against the newest committed version, which
// is the seeds' SELECT … FOR UPDATE then check, in one round trip. That
// re-read covers the locked row only; where the action also depends on rows
// a concurrent transaction may have inserted (execution deadline: the
// current attempt; waitpoint expiry: the suspension), a lock statement runs
// first in the same round trip and transaction, so the action's snapshot
// follows the locks (batch.lock, lockFirst). Budget reset runs SERIALIZABLE,
// as FlowFabric does. The two sibling-cancel actions branch on what they
// find (SKIP LOCKED, then a probe), so they are short transactions that
// lock first and decide after. Either way a second run of the same action
// finds the condition false and changes nothing.
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
// set) and raw_fields tags[TagKey] is the JSON string TagValue (if TagKey is
// set): a tag stored as a number or boolean never matches, as in
// FlowFabric's scanners, which compare a tag only when it is a string
// (as_str()). Retention's Due (TagText) is the exception. A missing
// execution row never passes a non-empty filter.
type Filter struct {
	Namespace string
	TagKey    string
	TagValue  string
}

// Empty reports whether the filter lets every row through.
func (f Filter) Empty() bool { return f.Namespace == "" && f.TagKey == "" }

// String describes the filter as its flags set it, e.g.
// "namespace acme, tag cairn.instance_id=i-1"; "none" when empty.
func (f Filter) String() string {
	var parts []string
	if f.Namespace != "" {
		parts = append(parts, "namespace "+f.Namespace)
	}
	if f.TagKey != "" {
		parts = append(parts, "tag "+f.TagKey+"="+f.TagValue)
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// InstanceTagKey is the tag FlowFabric copies into its outboxes' instance_tag
// column (lease and completion events).
const InstanceTagKey = "cairn.instance_id"

// ParseInstanceTag parses KEY=VALUE into a filter's tag half.
func ParseInstanceTag(s string) (key, value string, err error) {
	key, value, ok := strings.Cut(s, "=")
	if !ok || key == "" {
		return "", "", fmt.Errorf("instance tag %q: want KEY=VALUE, e.g. cairn.instance_id=worker-7", s)
	}
	return key, value, nil
}

// args are the filter's values for a row statement's tenantSQL: namespace,
// tag key and tag value, NULL where unset.
func (f Filter) args() []any {
	var ns, key, value *string
	if f.Namespace != "" {
		ns = &f.Namespace
	}
	if f.TagKey != "" {
		key, value = &f.TagKey, &f.TagValue
	}
	return []any{ns, key, value}
}

// tenantSQL is the tenant filter as a row statement's condition on the
// execution aliased alias, its values (Filter.args) in parameters $n to
// $n+2; unset halves (NULL) are no condition. Row statements re-check it
// where they re-check the row's deadline, so a fleet filtered to one tenant
// changes no row of another, whoever enqueued the job. A tenant is set when
// an execution is created and never changes, so the condition holds under
// any lock on the row. The tag is compared as JSON (see Filter): only a
// string tag matches, as in the scans.
func tenantSQL(alias string, n int) string {
	return fmt.Sprintf(`($%[2]d::text IS NULL OR %[1]s.raw_fields->>'namespace' = $%[2]d::text)
       AND ($%[3]d::text IS NULL OR %[1]s.raw_fields->'tags'->$%[3]d::text = to_jsonb($%[4]d::text))`, alias, n, n+1, n+2)
}

// tenantExecSQL is tenantSQL for a row that is not the execution itself:
// its execution (of partition $1, id idExpr) exists and passes. Without a
// filter the row passes whether or not its execution exists; with one, a
// missing execution never passes.
func tenantExecSQL(idExpr string, n int) string {
	return fmt.Sprintf(`(($%[2]d::text IS NULL AND $%[3]d::text IS NULL)
            OR EXISTS (SELECT 1 FROM ff_exec_core fe WHERE fe.partition_key = $1 AND fe.execution_id = %[1]s
                          AND %[4]s))`, idExpr, n, n+1, tenantSQL("fe", n))
}

// execInTenant reports whether execution id of partition exists and passes
// f; true when f is empty. Index: ff_exec_core's primary key.
func execInTenant(ctx context.Context, db DB, partition int16, id string, f Filter) (bool, error) {
	if f.Empty() {
		return true, nil
	}
	var in bool
	if err := db.QueryRow(ctx, `SELECT `+tenantExecSQL("$2::uuid", 3), append([]any{partition, id}, f.args()...)...).Scan(&in); err != nil {
		return false, fmt.Errorf("check tenant of execution %d/%s: %w", partition, id, err)
	}
	return in, nil
}

// sql returns the filter's conditions on the execution row aliased alias,
// each starting with " AND ", adding their values to p: always bound, never
// interpolated. The tag is compared as JSON, so only the string TagValue
// matches (FlowFabric's scanners); with tagText, as text (->>), so the
// number 7 matches "7" too (FlowFabric's retention trim). Neither form is
// indexed: the condition filters the rows the reconciler's index found.
func (f Filter) sql(p *params, alias string, tagText bool) string {
	var b strings.Builder
	if f.Namespace != "" {
		fmt.Fprintf(&b, " AND %s.raw_fields->>'namespace' = %s::text", alias, p.add(f.Namespace))
	}
	if f.TagKey != "" {
		k, v := p.add(f.TagKey), p.add(f.TagValue)
		if tagText {
			fmt.Fprintf(&b, " AND %s.raw_fields->'tags'->>%s::text = %s::text", alias, k, v)
		} else {
			fmt.Fprintf(&b, " AND %s.raw_fields->'tags'->%s::text = to_jsonb(%s::text)", alias, k, v)
		}
	}
	return b.String()
}

// columnsSQL is the filter over a row that carries its tenant in columns of
// its own, namespace and instance_tag, the tag by value (the key is not
// stored): FlowFabric's completion events, filtered so by its dependency
// reconciler. A NULL column never matches a set filter.
func (f Filter) columnsSQL(p *params, alias string) string {
	var b strings.Builder
	if f.Namespace != "" {
		fmt.Fprintf(&b, " AND %s.namespace = %s", alias, p.add(f.Namespace))
	}
	if f.TagKey != "" {
		fmt.Fprintf(&b, " AND %s.instance_tag = %s", alias, p.add(f.TagValue))
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
	// tx, when set, runs each round in a transaction of these options
	// (db must then be a TxBeginner); else each round is its own implicit
	// transaction.
	tx *pgx.TxOptions
	// lock, when set, runs before sql in the same round trip and
	// transaction, with the first lockArgs of sql's arguments (db must then
	// be able to send a pgx batch): see lockFirst.
	lock     string
	lockArgs int
}

// TxBeginner starts a transaction with options: *pgxpool.Pool and *pgx.Conn
// satisfy it.
type TxBeginner interface {
	DB
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
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
	query := func(q DB, round []int) error {
		if b.lock != "" {
			q = lockFirst{DB: q, lock: b.lock, nargs: b.lockArgs}
		}
		rows, err := q.Query(ctx, b.sql, b.args(round)...)
		if err != nil {
			return err
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
		return err
	}
	for _, round := range distinctRounds(keys) {
		var err error
		if b.tx == nil {
			err = query(db, round)
		} else {
			txb, ok := db.(TxBeginner)
			if !ok {
				return nil, fmt.Errorf("%s: %T cannot begin a transaction with options", b.what, db)
			}
			err = retrySerialization(ctx, func() error {
				return pgx.BeginTxFunc(ctx, txb, *b.tx, func(tx pgx.Tx) error { return query(tx, round) })
			})
		}
		if err != nil {
			return nil, fail(round, err)
		}
	}
	return out, nil
}

// serializationRetries is how often a SERIALIZABLE transaction that failed
// to serialize is tried again before its error is returned: the failure
// means it had no effect, and running it again is what Postgres advises.
const serializationRetries = 3

// retrySerialization runs fn, again after a short, growing pause while it
// fails with a serialization failure (SQLSTATE 40001).
func retrySerialization(ctx context.Context, fn func() error) error {
	var err error
	for attempt := range serializationRetries + 1 {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return err
			case <-time.After(time.Duration(attempt*attempt) * 5 * time.Millisecond):
			}
		}
		var pgErr *pgconn.PgError
		if err = fn(); err == nil || !errors.As(err, &pgErr) || pgErr.Code != "40001" {
			return err
		}
	}
	return err
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

// lockFirst is a DB whose Query first runs lock, with the first nargs of
// the query's arguments, then the query, as one pgx batch: one round trip,
// one transaction (the batch's implicit one, or the caller's), and a
// snapshot for the query taken after lock got its row locks. That is
// FlowFabric's order (SELECT … FOR UPDATE, then the writes, each a
// statement of its own): a statement that itself waits on a row lock
// re-reads that row once it gets it (EvalPlanQual), but every other row as
// of its start, so the rows the transaction it waited on inserted stay
// invisible to it. Exec and QueryRow are db's own.
type lockFirst struct {
	DB
	lock  string
	nargs int
}

// batchSender sends a pgx batch: *pgxpool.Pool, *pgx.Conn and pgx.Tx
// satisfy it.
type batchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Query runs l.lock then sql; the rows are sql's.
func (l lockFirst) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	bs, ok := l.DB.(batchSender)
	if !ok {
		return nil, fmt.Errorf("%T cannot send a batch", l.DB)
	}
	b := &pgx.Batch{}
	b.Queue(l.lock, args[:l.nargs]...)
	b.Queue(sql, args...)
	br := bs.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return nil, fmt.Errorf("lock: %w", err)
	}
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return nil, err
	}
	return &batchRows{Rows: rows, br: br}, nil
}

// batchRows are the rows of the last query of a batch. Once they are read
// (or closed) they close the batch, which ends its implicit transaction;
// that error, if any, is then theirs.
type batchRows struct {
	pgx.Rows
	br  pgx.BatchResults
	err error
}

func (r *batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

func (r *batchRows) Close() {
	r.Rows.Close()
	if r.br != nil {
		r.err = r.br.Close()
		r.br = nil
	}
}

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}

// outcomeName names o, one of the iota + 1 constants whose names are given
// in order.
func outcomeName[O ~int](o O, typ string, names ...string) string {
	if o >= 1 && int(o) <= len(names) {
		return names[o-1]
	}
	return fmt.Sprintf("%s(%d)", typ, int(o))
}
