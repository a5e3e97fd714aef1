package migrations

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Flow summary's objects: two partial indexes on ff_exec_core, one of live
// flow members and one of ended flow members by end time, so that its
// passes read the flows that changed and never the flows that finished
// long ago (store/flow_summary.go), and its table of marks.
var (
	flowLiveIndex = partialIndex{
		name: "ffreconcile_exec_core_flow_live_idx", childSuffix: "_ffr_flow_live_idx",
		table: "ff_exec_core",
		cols:  `(partition_key, flow_id) WHERE flow_id IS NOT NULL AND lifecycle_phase NOT IN ('terminal', 'cancelled')`,
		what:  "flow summary's index of live flow members",
	}
	flowEndedIndex = partialIndex{
		name: "ffreconcile_exec_core_flow_ended_idx", childSuffix: "_ffr_flow_ended_idx",
		table: "ff_exec_core",
		cols:  `(partition_key, terminal_at_ms, execution_id) WHERE flow_id IS NOT NULL AND lifecycle_phase IN ('terminal', 'cancelled')`,
		what:  "flow summary's index of ended flow members",
	}
)

// flowSummaryMarkTable is ours, next to FlowFabric's tables: per partition
// and tenant filter, how far flow summary's passes have projected the flows
// of ended members. It holds at most a row per partition per filter.
const (
	flowSummaryMarkTable = "ffreconcile_flow_summary_mark"
	flowSummaryMarkDDL   = `CREATE TABLE IF NOT EXISTS ffreconcile_flow_summary_mark (
    partition_key     smallint NOT NULL,
    filter_key        text     NOT NULL,
    ended_through_ms  bigint   NOT NULL,
    ended_through_id  uuid     NOT NULL,
    PRIMARY KEY (partition_key, filter_key)
)`
)

func init() {
	register(flowLiveIndex.object())
	register(flowEndedIndex.object())
	register(Object{
		Name: flowSummaryMarkTable, DDL: flowSummaryMarkDDL,
		Apply: func(ctx context.Context, pool *pgxpool.Pool, _ string) (string, error) {
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				// See ApplyWorkerTable: CREATE … IF NOT EXISTS races itself.
				if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('ffreconcile.migrations.' || $1))`, flowSummaryMarkTable); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, flowSummaryMarkDDL)
				return err
			})
			if err != nil {
				return "", fmt.Errorf("table %s: %w", flowSummaryMarkTable, err)
			}
			return flowSummaryMarkTable + ": flow summary's marks are in place", nil
		},
		Check: func(ctx context.Context, pool *pgxpool.Pool, _ string) error {
			return checkColumns(ctx, pool, flowSummaryMarkTable,
				[]string{"partition_key", "filter_key", "ended_through_ms", "ended_through_id"}, "run `worker migrate`")
		},
	})
}
