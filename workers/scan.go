package workers

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
)

// scanSpec describes one reconciler's partition scan: how to read a batch of
// due rows and how to turn each into a row job.
type scanSpec[Row any] struct {
	name string
	// scan reads up to limit rows of a partition due by boundMs, in a total
	// order.
	scan func(ctx context.Context, db store.DB, partition int16, boundMs int64, after *store.After, limit int, f store.Filter) ([]Row, error)
	// deadlineMs is a row's deadline, for reconcilers whose rows fall due
	// at a time (nil for the cancel reconcilers): their scans look ahead
	// (Config.Lookahead) and schedule rows not yet due for their deadline.
	deadlineMs func(Row) int64
	// key is the row job's unique key within its kind.
	key func(Row) string
	// rowJob builds the row job's args.
	rowJob func(partition int16, r Row) river.JobArgs
	// cursor is the scan position of a row, to continue after it.
	cursor func(r Row) jobs.ScanCursor
	// next builds the args of a scan of partition: a tick's (after nil, or
	// from the tick's now on) or a continuation's. follows is a follow-up's
	// (see the jobs package's "Follow-up scans"), which its continuations
	// keep.
	next func(partition int16, after *jobs.ScanCursor, follows int64) river.JobArgs
}

func toStoreAfter(c *jobs.ScanCursor) *store.After {
	if c == nil {
		return nil
	}
	return &store.After{AtMs: c.AtMs, ID: c.ID, ID2: c.ID2, N: c.N}
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
func runScan[Row any, S river.JobArgs](ctx context.Context, d *deps, spec *scanSpec[Row], job *river.Job[S], partition int16, after *jobs.ScanCursor, follows int64) error {
	c := d.cfg.Stats.For(spec.name)
	limit := d.cfg.BatchSize
	nowMs := store.NowMs()
	boundMs := nowMs
	if spec.deadlineMs != nil {
		boundMs += d.lookahead(spec.name).Milliseconds()
	}
	rows, err := spec.scan(ctx, d.cfg.Pool, partition, boundMs, toStoreAfter(after), limit, d.cfg.Filter)
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
	if spec.deadlineMs != nil {
		queued = d.ahead.pending(spec.name, partition, nowMs)
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
	for _, r := range rows {
		k := spec.key(r)
		if _, dup := seen[k]; dup {
			continue
		}
		seen[k] = struct{}{}
		if _, ok := queued[k]; ok {
			knownQueued++
			continue
		}
		p := river.InsertManyParams{Args: spec.rowJob(partition, r)}
		var at time.Time
		// A row not yet due is scheduled one millisecond after its
		// deadline, the first instant every action's re-check (deadline <
		// now, or <= for promotions) holds; availableAhead inserts it
		// available. A row already due keeps River's default, now: River
		// fetches by scheduled_at, then id, so the jobs of one scan stay
		// together and share statements (scheduled at their deadlines, a
		// backlog's jobs would interleave across partitions).
		if spec.deadlineMs != nil {
			if startMs := spec.deadlineMs(r) + 1; startMs > nowMs {
				at = time.UnixMilli(startMs)
				p.InsertOpts = &river.InsertOpts{ScheduledAt: at}
			}
		}
		startAt = append(startAt, at)
		params = append(params, p)
		keys = append(keys, k)
	}
	if len(params) == 0 {
		c.AlreadyQueued.Add(int64(knownQueued))
		return nil
	}

	client := river.ClientFromContext[pgx.Tx](ctx)
	tx, err := d.cfg.Pool.Begin(ctx)
	if err != nil {
		c.Errors.Add(1)
		return fmt.Errorf("%s scan of partition %d: begin: %w", spec.name, partition, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit

	// The transaction only inserts River jobs (and River's insert NOTIFY,
	// which serialises every notifying commit in the database through its
	// WAL flush). If a crash loses it, the rows are still due and a later
	// tick scans them again, so it need not wait for the flush.
	if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit TO off`); err != nil {
		c.Errors.Add(1)
		return fmt.Errorf("%s scan of partition %d: %w", spec.name, partition, err)
	}

	res, err := client.InsertManyTx(ctx, tx, params)
	if err != nil {
		c.Errors.Add(1)
		return fmt.Errorf("%s scan of partition %d: enqueue %d row jobs: %w", spec.name, partition, len(params), err)
	}
	inserted, ahead := 0, 0
	for i, r := range res {
		if !r.UniqueSkippedAsDuplicate {
			inserted++
			if !startAt[i].IsZero() {
				ahead++
			}
		}
	}

	continued := false
	if len(rows) >= limit && inserted > 0 {
		if _, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job); err != nil {
			c.Errors.Add(1)
			return fmt.Errorf("%s scan of partition %d: complete before continuing: %w", spec.name, partition, err)
		}
		cur := spec.cursor(rows[len(rows)-1])
		if _, err := client.InsertTx(ctx, tx, spec.next(partition, &cur, follows), nil); err != nil {
			c.Errors.Add(1)
			return fmt.Errorf("%s scan of partition %d: enqueue continuation: %w", spec.name, partition, err)
		}
		continued = true
	}
	if err := tx.Commit(ctx); err != nil {
		c.Errors.Add(1)
		return fmt.Errorf("%s scan of partition %d: commit: %w", spec.name, partition, err)
	}
	// Only now can a fetch see the jobs enqueued ahead. A wake-up is asked
	// for duplicates too: their job, maybe enqueued by another process, is
	// due at the same time, and wake-ups of one granule are sent once.
	for _, at := range startAt {
		if !at.IsZero() {
			d.wake(at)
		}
	}
	now := time.Now()
	for i, r := range res {
		if r.Job != nil && r.Job.ScheduledAt.After(now) {
			d.ahead.add(spec.name, partition, keys[i], r.Job.ScheduledAt.UnixMilli())
		}
	}
	c.Enqueued.Add(int64(inserted))
	c.EnqueuedAhead.Add(int64(ahead))
	c.AlreadyQueued.Add(int64(len(params) - inserted + knownQueued))
	if continued {
		c.Continuations.Add(1)
	}
	d.log().Debug("partition scanned", "reconciler", spec.name, "partition", partition,
		"rows", len(rows), "enqueued", inserted, "enqueued_ahead", ahead, "already_queued", len(params)-inserted+knownQueued, "continued", continued)
	return nil
}
