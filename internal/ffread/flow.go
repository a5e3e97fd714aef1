package ffread

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// ProjectFlowSummary is project_flow_summary_impl (flow.rs:966-1091): it
// counts the flow's members (ff_exec_core rows of partition with this
// flow_id) by raw public_state and upserts the ff_flow_summary row. It
// returns false, writing nothing, when the flow has no members.
//
// The buckets are the raw literals completed, failed, cancelled, expired,
// skipped, active, suspended, waiting, delayed, rate_limited and
// waiting_children, with no normalisation: a member whose public_state is
// 'running' (what most claim paths write) or 'resumable' is in the total
// but in no bucket. The flow state is then:
//   - every member in a terminal bucket: 'failed' when any is failed,
//     cancelled or expired, else 'completed'. A member terminal by
//     lifecycle whose public_state a reconciler left stale is not counted
//     terminal, so such a flow never completes;
//   - else 'running' when the active bucket is non-empty (so a flow whose
//     members are all 'running' is not running);
//   - else 'blocked' when suspended, delayed, rate_limited or
//     waiting_children is non-empty;
//   - else 'open'.
//
// sampled_members is the total; counts above int32 are stored as
// math.MaxInt32, as FlowFabric's i32::try_from(..).unwrap_or(i32::MAX).
func ProjectFlowSummary(ctx context.Context, db DB, partition int16, flowID string, nowMs int64) (bool, error) {
	u, err := uuid.Parse(flowID)
	if err != nil {
		return false, invalidInput("project_flow_summary: flow_id is not a UUID: %s", flowID)
	}
	flow := u.String()
	var c [12]int64
	err = db.QueryRow(ctx, `
        SELECT
            COUNT(*) FILTER (WHERE public_state = 'completed'),
            COUNT(*) FILTER (WHERE public_state = 'failed'),
            COUNT(*) FILTER (WHERE public_state = 'cancelled'),
            COUNT(*) FILTER (WHERE public_state = 'expired'),
            COUNT(*) FILTER (WHERE public_state = 'skipped'),
            COUNT(*) FILTER (WHERE public_state = 'active'),
            COUNT(*) FILTER (WHERE public_state = 'suspended'),
            COUNT(*) FILTER (WHERE public_state = 'waiting'),
            COUNT(*) FILTER (WHERE public_state = 'delayed'),
            COUNT(*) FILTER (WHERE public_state = 'rate_limited'),
            COUNT(*) FILTER (WHERE public_state = 'waiting_children'),
            COUNT(*)
        FROM ff_exec_core
        WHERE partition_key = $1 AND flow_id = $2
        `, partition, flow).Scan(&c[0], &c[1], &c[2], &c[3], &c[4], &c[5], &c[6], &c[7], &c[8], &c[9], &c[10], &c[11])
	if err != nil {
		return false, fmt.Errorf("ffread: project_flow_summary %d/%s: count members: %w", partition, flow, err)
	}
	completed, failed, cancelled, expired, skipped, active, suspended := c[0], c[1], c[2], c[3], c[4], c[5], c[6]
	waiting, delayed, rateLimited, waitingChildren, total := c[7], c[8], c[9], c[10], c[11]
	if total == 0 {
		return false, nil
	}

	terminal := completed + failed + cancelled + expired + skipped
	var state string
	switch {
	case terminal == total:
		if failed > 0 || cancelled > 0 || expired > 0 {
			state = "failed"
		} else {
			state = "completed"
		}
	case active > 0:
		state = "running"
	case suspended > 0 || delayed > 0 || rateLimited > 0 || waitingChildren > 0:
		state = "blocked"
	default:
		state = "open"
	}

	_, err = db.Exec(ctx, `
        INSERT INTO ff_flow_summary (
            partition_key, flow_id,
            total_members, sampled_members,
            members_completed, members_failed, members_cancelled,
            members_expired, members_skipped, members_active,
            members_suspended, members_waiting, members_delayed,
            members_rate_limited, members_waiting_children,
            public_flow_state, last_summary_update_at
        ) VALUES (
            $1, $2, $3, $4, $5, $6, $7, $8, $9, $10,
            $11, $12, $13, $14, $15, $16, $17
        )
        ON CONFLICT (partition_key, flow_id) DO UPDATE SET
            total_members = EXCLUDED.total_members,
            sampled_members = EXCLUDED.sampled_members,
            members_completed = EXCLUDED.members_completed,
            members_failed = EXCLUDED.members_failed,
            members_cancelled = EXCLUDED.members_cancelled,
            members_expired = EXCLUDED.members_expired,
            members_skipped = EXCLUDED.members_skipped,
            members_active = EXCLUDED.members_active,
            members_suspended = EXCLUDED.members_suspended,
            members_waiting = EXCLUDED.members_waiting,
            members_delayed = EXCLUDED.members_delayed,
            members_rate_limited = EXCLUDED.members_rate_limited,
            members_waiting_children = EXCLUDED.members_waiting_children,
            public_flow_state = EXCLUDED.public_flow_state,
            last_summary_update_at = EXCLUDED.last_summary_update_at
        `, partition, flow, total, clampI32(total),
		clampI32(completed), clampI32(failed), clampI32(cancelled),
		clampI32(expired), clampI32(skipped), clampI32(active),
		clampI32(suspended), clampI32(waiting), clampI32(delayed),
		clampI32(rateLimited), clampI32(waitingChildren),
		state, nowMs)
	if err != nil {
		return false, fmt.Errorf("ffread: project_flow_summary %d/%s: upsert ff_flow_summary: %w", partition, flow, err)
	}
	return true, nil
}

func clampI32(v int64) int32 {
	if v > math.MaxInt32 {
		return math.MaxInt32
	}
	return int32(v)
}

// FlowSummary is an ff_flow_summary row (migration 0019), all 17 columns.
type FlowSummary struct {
	Partition              int16
	FlowID                 string
	TotalMembers           int64
	SampledMembers         int32
	MembersCompleted       int32
	MembersFailed          int32
	MembersCancelled       int32
	MembersExpired         int32
	MembersSkipped         int32
	MembersActive          int32
	MembersSuspended       int32
	MembersWaiting         int32
	MembersDelayed         int32
	MembersRateLimited     int32
	MembersWaitingChildren int32
	PublicFlowState        string
	LastSummaryUpdateAt    int64
}

// ReadFlowSummary reads the flow's ff_flow_summary row; ok is false when
// there is none. FlowFabric's Postgres backend has no reader of this table
// (it is dashboard-facing), so this is ours: a plain SELECT of every
// column.
func ReadFlowSummary(ctx context.Context, db DB, partition int16, flowID string) (FlowSummary, bool, error) {
	u, err := uuid.Parse(flowID)
	if err != nil {
		return FlowSummary{}, false, invalidInput("read_flow_summary: flow_id is not a UUID: %s", flowID)
	}
	var s FlowSummary
	err = db.QueryRow(ctx, `
        SELECT partition_key, flow_id::text, total_members, sampled_members,
               members_completed, members_failed, members_cancelled,
               members_expired, members_skipped, members_active,
               members_suspended, members_waiting, members_delayed,
               members_rate_limited, members_waiting_children,
               public_flow_state, last_summary_update_at
          FROM ff_flow_summary
         WHERE partition_key = $1 AND flow_id = $2`, partition, u.String()).Scan(
		&s.Partition, &s.FlowID, &s.TotalMembers, &s.SampledMembers,
		&s.MembersCompleted, &s.MembersFailed, &s.MembersCancelled,
		&s.MembersExpired, &s.MembersSkipped, &s.MembersActive,
		&s.MembersSuspended, &s.MembersWaiting, &s.MembersDelayed,
		&s.MembersRateLimited, &s.MembersWaitingChildren,
		&s.PublicFlowState, &s.LastSummaryUpdateAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return FlowSummary{}, false, nil
	}
	if err != nil {
		return FlowSummary{}, false, fmt.Errorf("ffread: read_flow_summary %d/%s: %w", partition, u.String(), err)
	}
	return s, true, nil
}
