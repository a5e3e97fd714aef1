package workers

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
)

// projectBudget is how long one flow summary job projects before it hands
// the rest of its partition to a continuation at the back of the scans'
// queue, so that a backfill (a first pass over flows that ended before the
// fleet started) never holds a worker the other reconcilers' scans need.
const projectBudget = 2 * time.Second

// FlowSummary keeps ff_flow_summary, FlowFabric's rollup of each flow's
// members by public_state: FlowFabric's flow projector, which it runs on
// Valkey every 15 s and never on Postgres (its project_flow_summary_impl
// has no caller there, and migration 0019's "the next scanner tick
// repopulates summaries" has no tick). Its tick finds the partitions
// holding flows that changed (Probe: store.FlowSummaryPartitions), and each
// partition's job projects them itself, a batch of flows per statement: a
// rollup overwritten at every pass needs no lock and no per-flow job
// (docs/design.md, "Flow summaries").
var FlowSummary = defineSteps[jobs.FlowSummaryTickArgs, jobs.FlowSummaryProjectArgs](Reconciler{
	Name:     "flow_summary",
	Interval: 15 * time.Second,
	Probe: func(ctx context.Context, db store.DB, _ int64, partitionCount int, f store.Filter) ([]int16, error) {
		return store.FlowSummaryPartitions(ctx, db, partitionCount, f)
	},
	Tables: []string{"ff_flow_core", "ff_flow_summary", "ff_exec_core",
		"ffreconcile_exec_core_flow_live_idx", "ffreconcile_exec_core_flow_ended_idx", "ffreconcile_flow_summary_mark"},
}, func(r *Reconciler, d *deps) river.Worker[jobs.FlowSummaryProjectArgs] {
	return &projectWorker{r: r, d: d}
})

// projectWorker projects one partition's flows: first those of members
// ended after the partition's mark (moving the mark on), then every flow
// with a live member, each flow once per job.
type projectWorker struct {
	river.WorkerDefaults[jobs.FlowSummaryProjectArgs]
	r *Reconciler
	d *deps
}

// Timeout implements river.Worker.
func (w *projectWorker) Timeout(*river.Job[jobs.FlowSummaryProjectArgs]) time.Duration {
	return ScanTimeout
}

// Work implements river.Worker.
func (w *projectWorker) Work(ctx context.Context, job *river.Job[jobs.FlowSummaryProjectArgs]) error {
	d, r, p := w.d, w.r, job.Args.Partition
	c := d.stats(r)
	c.Scans.Add(1)
	start, nowMs := time.Now(), d.now().UnixMilli()
	pool, f, batch := d.cfg.Pool, d.cfg.Filter, d.cfg.BatchSize
	fail := func(err error) error {
		c.Errors.Add(1)
		return fmt.Errorf("flow summary of partition %d: %w", p, err)
	}
	done := map[string]bool{}
	project := func(flows []string) error {
		var todo []string
		for _, id := range flows {
			if !done[id] {
				done[id] = true
				todo = append(todo, id)
			}
		}
		n, err := store.ProjectFlows(ctx, pool, p, todo, nowMs, f)
		c.Applied.Add(int64(n))
		return err
	}

	// Ended members after the mark, oldest first. The mark moves on to
	// what is done, but never past the settle point: a member that ended
	// later is read again by the next pass.
	mark, err := store.ReadFlowSummaryMark(ctx, pool, p, f)
	if err != nil {
		return fail(err)
	}
	settleAt := nowMs - store.FlowSummarySettle
	atMs, atID := mark.ThroughMs, mark.ThroughID
	for {
		members, err := store.EndedFlowMembers(ctx, pool, p, atMs, atID, batch)
		if err != nil {
			return fail(err)
		}
		c.Examined.Add(int64(len(members)))
		flows := make([]string, len(members))
		for i, m := range members {
			flows[i] = m.FlowID
		}
		if err := project(flows); err != nil {
			return fail(err)
		}
		full := len(members) == batch
		if len(members) > 0 {
			d.cfg.Observer.Lateness(r.Name, time.Duration(nowMs-members[0].TerminalAtMs)*time.Millisecond)
			last := members[len(members)-1]
			atMs, atID = last.TerminalAtMs, last.ExecutionID
		}
		if len(members) > 0 || !mark.Found {
			// All read up to the last member (a full batch) or up to
			// now (a short one): settled up to there.
			throughMs, throughID := settleAt, store.MaxExecutionID
			if full && atMs < settleAt {
				throughMs, throughID = atMs, atID
			}
			if err := store.AdvanceFlowSummaryMark(ctx, pool, p, f, throughMs, throughID); err != nil {
				return fail(err)
			}
			mark.Found = true
		}
		if !full {
			break
		}
		if time.Since(start) >= projectBudget {
			return w.continueLater(ctx, job, nil)
		}
	}

	// Flows with a live member, in flow id order from the continuation's
	// position.
	after := ""
	if a := job.Args.After; a != nil {
		after = a.ID
	}
	for {
		flows, err := store.LiveFlows(ctx, pool, p, after, batch)
		if err != nil {
			return fail(err)
		}
		c.Examined.Add(int64(len(flows)))
		if err := project(flows); err != nil {
			return fail(err)
		}
		if len(flows) < batch {
			break
		}
		after = flows[len(flows)-1]
		if time.Since(start) >= projectBudget {
			return w.continueLater(ctx, job, &jobs.ScanCursor{ID: after})
		}
	}
	if len(done) > 0 {
		d.log().Debug("projected flow summaries", "partition", p, "flows", len(done), "elapsed", time.Since(start).Round(time.Millisecond))
	}
	return nil
}

// continueLater completes job and enqueues the partition's next pass,
// starting its live flows after after (nil: from the first), in one
// transaction (continueInTx).
func (w *projectWorker) continueLater(ctx context.Context, job *river.Job[jobs.FlowSummaryProjectArgs], after *jobs.ScanCursor) error {
	p := job.Args.Partition
	c := w.d.stats(w.r)
	tx, err := w.d.cfg.Pool.Begin(ctx)
	if err != nil {
		c.Errors.Add(1)
		return fmt.Errorf("flow summary of partition %d: begin: %w", p, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	next := jobs.FlowSummaryProjectArgs{ScanArgs: jobs.ScanArgs{Partition: p, After: after, Follows: job.Args.Follows}}
	if err := continueInTx(ctx, tx, river.ClientFromContext[pgx.Tx](ctx), job, next); err != nil {
		c.Errors.Add(1)
		return fmt.Errorf("flow summary of partition %d: %w", p, err)
	}
	if err := tx.Commit(ctx); err != nil {
		c.Errors.Add(1)
		return fmt.Errorf("flow summary of partition %d: commit: %w", p, err)
	}
	c.Continuations.Add(1)
	w.d.wakeScans(w.r)
	return nil
}
