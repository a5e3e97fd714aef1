package workers

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
)

// tickWorker is every reconciler's periodic tick: it finds the partitions
// holding due rows and enqueues one scan for each (see tick).
type tickWorker[T river.JobArgs] struct {
	river.WorkerDefaults[T]
	r *Reconciler
	d *deps
}

// Timeout implements river.Worker.
func (w *tickWorker[T]) Timeout(*river.Job[T]) time.Duration { return TickTimeout }

// Work implements river.Worker.
func (w *tickWorker[T]) Work(ctx context.Context, _ *river.Job[T]) error {
	return w.d.tick(ctx, river.ClientFromContext[pgx.Tx](ctx), w.r)
}

// tickWindow is what a tick found: the partitions to scan, and for the
// reconcilers whose rows fall due at a time a way to tell which hold rows
// not yet due.
type tickWindow struct {
	parts []int16 // partitions holding rows due by the horizon, those already due first
	nowMs int64   // the time rows' deadlines are compared with (Reconciler.DueAt of the tick's now)
	// at is the tick's now, which the queue's jobs are compared with: for
	// a reconciler whose rows are due some time after their deadline
	// (dependency, retention) it is later than nowMs.
	at time.Time
	// notYetDue returns the partitions holding rows due at or after nowMs
	// and by the horizon; nil without a lookahead.
	notYetDue func(ctx context.Context) (map[int16]bool, error)
	// dueCounts returns, for each of parts, its rows due at nowMs; nil for
	// rows due as soon as they exist (pending cancel groups), whose busy
	// partitions are always skipped.
	dueCounts func(ctx context.Context, parts []int16) (map[int16]int, error)
}

// tick is one tick of r: find its due partitions, then enqueue their scans
// through client (see fanOut).
func (d *deps) tick(ctx context.Context, client *river.Client[pgx.Tx], r *Reconciler) error {
	win, err := d.window(ctx, r)
	if err != nil {
		d.stats(r).Errors.Add(1)
		return err
	}
	return d.fanOut(ctx, client, r, win)
}

// window returns the partitions of r holding rows due by its horizon (now
// plus its lookahead), those with rows already due first. A tick's scans
// start in the order it inserts them, over the burst that follows it; rows
// already due are late, while rows falling due later in the window mostly
// still start on time from a scan late in the burst. The second query (a
// cached generic plan) runs only when the window holds anything, so an idle
// fleet pays nothing for it; a third, for the partitions holding rows not
// yet due (notYetDue), and a fourth, counting the busy partitions' due rows
// (dueCounts), only when fanOut finds a due partition busy.
func (d *deps) window(ctx context.Context, r *Reconciler) (tickWindow, error) {
	db, f, n, due := d.cfg.TickPool, d.cfg.Filter, r.Partitions(d.cfg), d.due(r)
	at := d.now()
	w := tickWindow{nowMs: r.DueAt(at.UnixMilli(), d.cfg.Settings), at: at}
	if r.Probe != nil {
		parts, err := r.Probe(ctx, db, w.nowMs, n, f)
		w.parts = parts
		return w, err
	}
	if !due.Always {
		w.dueCounts = func(ctx context.Context, parts []int16) (map[int16]int, error) {
			return due.Counts(ctx, db, w.nowMs, parts, f)
		}
	}
	ahead := d.lookahead(r).Milliseconds()
	parts, err := due.Partitions(ctx, db, store.NoLowerBound, w.nowMs+ahead, n, f)
	if err != nil || ahead == 0 || len(parts) == 0 {
		w.parts = parts
		return w, err
	}
	already, err := due.Partitions(ctx, db, store.NoLowerBound, w.nowMs, n, f)
	if err != nil {
		return w, err
	}
	isDue := make(map[int16]bool, len(already))
	for _, p := range already {
		isDue[p] = true
	}
	w.parts = append(make([]int16, 0, len(parts)), already...)
	for _, p := range parts {
		if !isDue[p] {
			w.parts = append(w.parts, p)
		}
	}
	w.notYetDue = func(ctx context.Context) (map[int16]bool, error) {
		ps, err := due.Partitions(ctx, db, w.nowMs, w.nowMs+ahead, n, f)
		if err != nil {
			return nil, err
		}
		out := make(map[int16]bool, len(ps))
		for _, p := range ps {
			out[p] = true
		}
		return out, nil
	}
	return w, nil
}

// fanOut inserts one scan job per due partition, except partitions whose row
// jobs are still waiting in the queue (busy, see store.QueuedRowJobs): those
// are skipped, or, when they hold rows not yet due within the reconciler's
// lookahead, scanned from the tick's now on (aheadCursor), so those rows are
// still enqueued ahead. A busy partition holding more due rows than
// unfinished row jobs has rows no scan enqueued (inserted after the tick
// that would have found them, or left out of every window by late ticks); it
// is scanned in full, or under a queue that stays behind those rows would
// wait until it drained (docs/design.md).
//
// A partition whose scan still waits in the queue needs no other; one whose
// scan has started gets a follow-up with a unique key of its own (see the
// jobs package's "Follow-up scans"), so the tick's insert never offers the
// key of a started scan, whose row River's completer may be locking.
func (d *deps) fanOut(ctx context.Context, client *river.Client[pgx.Tx], r *Reconciler, w tickWindow) error {
	c := d.stats(r)
	c.Ticks.Add(1)
	c.PartitionsDue.Add(int64(len(w.parts)))
	if len(w.parts) == 0 {
		return nil
	}
	fail := func(err error) error {
		c.Errors.Add(1)
		return fmt.Errorf("%s: %w", r.Name, err)
	}
	// On the work pool (custom plans): the best index for these queries
	// depends on how many jobs of each state and kind the queue holds, which
	// a cached generic plan cannot see.
	var (
		queued map[int16]store.QueuedRows
		err    error
	)
	if r.HasRowJobs() {
		if queued, err = store.QueuedRowJobs(ctx, d.cfg.Pool, d.cfg.RiverSchema, jobs.QueueRows, r.rowKind, w.at); err != nil {
			return fail(err)
		}
	}
	scans, err := store.UnfinishedScans(ctx, d.cfg.Pool, d.cfg.RiverSchema, r.scanQueue, r.scanKind)
	if err != nil {
		return fail(err)
	}
	busy := func(p int16) bool { return queued[p].Available > 0 }
	var busyParts []int16
	for _, p := range w.parts {
		if busy(p) {
			busyParts = append(busyParts, p)
		}
	}
	var (
		notYetDue map[int16]bool
		dueCount  map[int16]int
	)
	if len(busyParts) > 0 {
		if w.dueCounts != nil {
			if dueCount, err = w.dueCounts(ctx, busyParts); err != nil {
				return fail(err)
			}
		}
		if w.notYetDue != nil {
			if notYetDue, err = w.notYetDue(ctx); err != nil {
				return fail(err)
			}
		}
	}
	params := make([]river.InsertManyParams, 0, len(w.parts))
	aheadOnly, rescans, skippedBusy, waiting, followUps := 0, 0, 0, 0, 0
	for _, p := range w.parts {
		rescan := busy(p) && dueCount[p] > queued[p].Available+queued[p].Running
		var after *jobs.ScanCursor
		switch {
		case busy(p) && !rescan && !notYetDue[p]: // its due rows' jobs wait in the queue
			skippedBusy++
			continue
		case scans[p].Waiting: // its scan has read nothing yet
			waiting++
			continue
		case busy(p) && !rescan: // only its rows not yet due
			after = aheadCursor(w.nowMs)
			aheadOnly++
		case rescan:
			rescans++
		}
		if scans[p].Started != 0 {
			followUps++
		}
		params = append(params, river.InsertManyParams{Args: r.newScan(jobs.ScanArgs{Partition: p, After: after, Follows: scans[p].Started})})
	}
	c.PartitionsBusy.Add(int64(skippedBusy))
	c.BusyRescans.Add(int64(rescans))
	c.FollowUpScans.Add(int64(followUps))
	if len(params) == 0 {
		return nil
	}
	res, err := client.InsertMany(ctx, params)
	if err != nil {
		return fail(fmt.Errorf("enqueue %d partition scans: %w", len(params), err))
	}
	skipped := 0
	for _, x := range res {
		if x.UniqueSkippedAsDuplicate {
			skipped++
		}
	}
	if skipped < len(res) {
		d.wakeScans(r)
	}
	d.log().Debug("tick fanned out", "reconciler", r.Name, "partitions_due", len(w.parts),
		"partitions_busy", skippedBusy, "busy_scanned_ahead_only", aheadOnly, "busy_rescanned", rescans,
		"scans_enqueued", len(params)-skipped, "follow_up_scans", followUps, "scans_already_queued", waiting+skipped)
	return nil
}

// aheadCursor starts a scan after every row due at nowMs: at nowMs − 1 with
// the largest ids, it takes rows whose deadline is nowMs or later. (Text
// keys, budget ids and worker instances, have no largest value: rows due at
// exactly nowMs − 1 whose key sorts after this one are offered again, and
// River's uniqueness skips their queued jobs.)
func aheadCursor(nowMs int64) *jobs.ScanCursor {
	const maxUUID = "ffffffff-ffff-ffff-ffff-ffffffffffff"
	return &jobs.ScanCursor{AtMs: nowMs - 1, ID: maxUUID, ID2: maxUUID, N: math.MaxInt32}
}
