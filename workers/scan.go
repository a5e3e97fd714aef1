package workers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
)

// scanWorker is every reconciler's partition scan: it enqueues one row job
// per due row of a partition (see runScan).
type scanWorker[S scanArgs] struct {
	river.WorkerDefaults[S]
	r *Reconciler
	d *deps
}

// Timeout implements river.Worker.
func (w *scanWorker[S]) Timeout(*river.Job[S]) time.Duration { return ScanTimeout }

// Work implements river.Worker.
func (w *scanWorker[S]) Work(ctx context.Context, job *river.Job[S]) error {
	return runScan(ctx, w.d, w.r, job, struct{ jobs.ScanArgs }(job.Args).ScanArgs)
}

func toDueRow(c *jobs.ScanCursor) *store.DueRow {
	if c == nil {
		return nil
	}
	return &store.DueRow{AtMs: c.AtMs, ID: c.ID, ID2: c.ID2, N: c.N}
}

// runScan enqueues one row job per due row of a partition (and, for a
// reconciler with a lookahead, per row falling due within it, scheduled for
// its deadline), in one transaction with, when the batch came back full, the
// scan's own completion and its continuation (after the batch's last row).
// Completing the running scan first frees its unique slot, so the
// continuation is not skipped as a duplicate of itself.
//
// A continuation is only enqueued when the batch inserted at least one new
// row job: a full batch of rows whose jobs are all still queued means an
// earlier scan already walked this stretch, and walking on would re-offer the
// whole backlog every tick. Rows beyond are reached by a later tick once the
// queued ones are done.
func runScan[S river.JobArgs](ctx context.Context, d *deps, r *Reconciler, job *river.Job[S], args jobs.ScanArgs) error {
	c := d.stats(r)
	partition := args.Partition
	limit := d.cfg.BatchSize
	if r.ScanLimit > 0 {
		limit = min(limit, r.ScanLimit)
	}
	nowMs := d.now().UnixMilli()
	boundMs := r.DueAt(nowMs, d.cfg.Settings) + d.lookahead(r).Milliseconds()
	rows, err := d.due(r).Scan(ctx, d.cfg.Pool, partition, boundMs, toDueRow(args.After), limit, d.cfg.Filter)
	if err != nil {
		c.Errors.Add(1)
		return err
	}
	c.Scans.Add(1)
	c.Examined.Add(int64(len(rows)))
	if len(rows) == 0 {
		return nil
	}

	// Rows whose jobs this process saw queued for a future start are not
	// offered again (see queuedAhead).
	var queued map[string]struct{}
	if !r.Due.Always {
		queued = d.ahead.pending(r.Name, partition, nowMs)
	}
	knownQueued := 0
	// River fails a whole batch when two of its jobs share a unique key,
	// so duplicates (impossible under the tables' primary keys, but cheap to
	// rule out) are dropped here first.
	seen := make(map[string]struct{}, len(rows))
	params := make([]river.InsertManyParams, 0, len(rows))
	keys := make([]string, 0, len(rows))
	// startAt[i] is when params[i] starts, for a row not yet due (else zero).
	startAt := make([]time.Time, 0, len(rows))
	for _, row := range rows {
		k := rowKey(row)
		if _, dup := seen[k]; dup {
			continue
		}
		seen[k] = struct{}{}
		if _, ok := queued[k]; ok {
			knownQueued++
			continue
		}
		// A row not yet due is scheduled one millisecond after its
		// deadline, the first instant every action's re-check (deadline <
		// now, or <= for promotions) holds; availableAhead inserts it
		// available. Its schedule then carries the deadline to its job
		// (jobDeadlineMs, for the wait of one started early). A row already
		// due keeps River's default schedule, now: River fetches by
		// scheduled_at, then id, so the jobs of one scan stay together and
		// share statements (scheduled at their deadlines, a backlog's jobs
		// would interleave across partitions). Neither carries its deadline
		// in its args: a value no other job has is an entry of its own in
		// river_job's GIN index over args, written again by River's fetch
		// and completion (docs/performance.md); the lateness metric takes
		// the deadline the action finds under its lock instead.
		var at time.Time
		if !r.Due.Always {
			if startMs := row.AtMs + 1; startMs > nowMs {
				at = time.UnixMilli(startMs)
			}
		}
		p := river.InsertManyParams{Args: r.rowJob(partition, row)}
		if !at.IsZero() {
			p.InsertOpts = &river.InsertOpts{ScheduledAt: at}
		}
		startAt = append(startAt, at)
		params = append(params, p)
		keys = append(keys, k)
	}
	if len(params) == 0 {
		c.AlreadyQueued.Add(int64(knownQueued))
		return nil
	}

	var (
		res       []*rivertype.JobInsertResult
		continued bool
	)
	// The insert takes River's unique locks on row jobs that may be
	// running, so it can deadlock with River's completer finishing one of
	// them (seen once in a 30-minute soak). Postgres rolls back only this
	// transaction; it is run again here at once, rather than failing the
	// scan to River's retry seconds later, since its rows stay due.
	for try := 1; ; try++ {
		res, continued, err = enqueueRows(ctx, d, r, job, args, rows, params)
		if err == nil || !isDeadlock(err) || try == scanTries || ctx.Err() != nil {
			break
		}
		c.DeadlockRetries.Add(1)
		d.log().Info("scan's insert deadlocked; running it again", "reconciler", r.Name, "partition", partition, "try", try)
	}
	if err != nil {
		c.Errors.Add(1)
		return fmt.Errorf("%s scan of partition %d: %w", r.Name, partition, err)
	}
	inserted, ahead := 0, 0
	for i, x := range res {
		if !x.UniqueSkippedAsDuplicate {
			inserted++
			if !startAt[i].IsZero() {
				ahead++
			}
		}
	}

	// Only now can a fetch see the jobs enqueued ahead. A wake-up is asked
	// for duplicates too: their job, maybe enqueued by another process, is
	// due at the same time, and wake-ups of one granule are sent once.
	for _, at := range startAt {
		if !at.IsZero() {
			d.wake(at)
		}
	}
	// Jobs due now are announced too: River notifies an insert at most
	// once per queue per fetch cooldown, so of two scans committing within
	// one the second's jobs could wait for the next fetch, up to the 1 s
	// poll. Wake-ups of one granule are sent once, so a burst of scans
	// costs a notification per granule.
	if inserted > ahead {
		d.wake(time.Now())
	}
	now := d.now()
	for i, x := range res {
		if x.Job != nil && x.Job.ScheduledAt.After(now) {
			d.ahead.add(r.Name, partition, keys[i], x.Job.ScheduledAt.UnixMilli())
		}
	}
	c.Enqueued.Add(int64(inserted))
	c.EnqueuedAhead.Add(int64(ahead))
	c.AlreadyQueued.Add(int64(len(params) - inserted + knownQueued))
	if continued {
		c.Continuations.Add(1)
	}
	d.log().Debug("partition scanned", "reconciler", r.Name, "partition", partition,
		"rows", len(rows), "enqueued", inserted, "enqueued_ahead", ahead, "already_queued", len(params)-inserted+knownQueued, "continued", continued)
	return nil
}

// scanTries is how many times a scan runs its insert transaction when it
// deadlocks.
const scanTries = 3

// isDeadlock reports whether err is Postgres's deadlock_detected.
func isDeadlock(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "40P01"
}

// enqueueRows inserts a scan's row jobs (params, for rows) in one
// transaction with, when the batch came back full and inserted a new job,
// the scan's own completion and its continuation (never for a reconciler
// with a ScanLimit); it reports whether it continued.
func enqueueRows[S river.JobArgs](ctx context.Context, d *deps, r *Reconciler, job *river.Job[S], args jobs.ScanArgs, rows []store.DueRow, params []river.InsertManyParams) ([]*rivertype.JobInsertResult, bool, error) {
	client := river.ClientFromContext[pgx.Tx](ctx)
	tx, err := d.cfg.Pool.Begin(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit

	// The transaction only inserts River jobs (and River's insert NOTIFY,
	// which serialises every notifying commit in the database through its
	// WAL flush). If a crash loses it, the rows are still due and a later
	// tick scans them again, so it need not wait for the flush.
	if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit TO off`); err != nil {
		return nil, false, err
	}
	res, err := client.InsertManyTx(ctx, tx, params)
	if err != nil {
		return nil, false, fmt.Errorf("enqueue %d row jobs: %w", len(params), err)
	}
	continued := false
	if r.ScanLimit == 0 && len(rows) >= d.cfg.BatchSize && slices.ContainsFunc(res, func(x *rivertype.JobInsertResult) bool { return !x.UniqueSkippedAsDuplicate }) {
		last := rows[len(rows)-1]
		next := jobs.ScanArgs{Partition: args.Partition, Follows: args.Follows,
			After: &jobs.ScanCursor{AtMs: last.AtMs, ID: last.ID, ID2: last.ID2, N: last.N}}
		if err := continueInTx(ctx, tx, client, job, r.newScan(next)); err != nil {
			return nil, false, err
		}
		continued = true
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, false, fmt.Errorf("commit: %w", err)
	}
	if continued {
		d.wakeScans(r)
	}
	return res, continued, nil
}

// continueInTx completes job and enqueues next, its continuation, in tx:
// completing first frees the unique key the continuation takes, and one
// transaction means a crash loses both or neither.
func continueInTx[T river.JobArgs](ctx context.Context, tx pgx.Tx, client *river.Client[pgx.Tx], job *river.Job[T], next river.JobArgs) error {
	if _, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job); err != nil {
		return fmt.Errorf("complete before continuing: %w", err)
	}
	if _, err := client.InsertTx(ctx, tx, next, nil); err != nil {
		return fmt.Errorf("enqueue continuation: %w", err)
	}
	return nil
}
