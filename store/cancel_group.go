package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// Sibling-cancel dispatch and its reconciler both walk ff_pending_cancel_groups.
//
// Tenant filter. FlowFabric's dispatcher accepts a ScannerFilter and ignores
// it. Here it is applied: a pending group belongs to the tenant of its
// downstream execution, ff_exec_core (partition_key, downstream_eid), the
// execution whose edge group it is, and passes when that execution passes the
// filter. A group whose downstream execution row is missing never passes a
// non-empty filter, like every other row. The siblings a dispatch cancels are
// not checked one by one: they belong to the same flow, hence the same
// tenant.
//
// Transactions. Unlike the other row actions, the two group actions are
// short transactions rather than one statement: the dispatcher must tell a
// group locked by someone else (SKIP LOCKED returns nothing) from a missing
// one with a second, non-locking probe, exactly as the seed does, and both
// branch on the group's members.

// PendingCancelGroups are ff_pending_cancel_groups rows, due as soon as they
// exist and taken oldest enqueued first. A group belongs to the tenant of its
// downstream execution. Index: ff_pending_cancel_groups_enqueued_idx
// (partition_key, enqueued_at_ms).
var PendingCancelGroups = &Due{
	What:   "pending cancel groups",
	From:   "ff_pending_cancel_groups r",
	Exec:   "ff_exec_core e ON e.partition_key = r.partition_key AND e.execution_id = r.downstream_eid",
	Tenant: true,
	At:     "r.enqueued_at_ms",
	Always: true,
	ID:     Key{"r.flow_id", "uuid"},
	ID2:    Key{"r.downstream_eid", "uuid"},
	Index:  "ff_pending_cancel_groups_enqueued_idx",
}

// lockEdgeGroup locks an edge group and reads its flag and members. With
// skipLocked, a group another transaction holds reads as not found.
//
// FlowFabric never writes NULL elements into the members array, but the
// column type allows them: they are read as NullMember, which is not a UUID,
// so they are skipped with a warning like any other malformed member instead
// of failing the whole group on every retry.
func lockEdgeGroup(ctx context.Context, tx pgx.Tx, partition int16, flowID, downstreamEID string, skipLocked bool) (flag bool, members []string, found bool, err error) {
	lock := `FOR UPDATE`
	if skipLocked {
		lock = `FOR UPDATE SKIP LOCKED`
	}
	var raw []pgtype.Text
	err = tx.QueryRow(ctx, `
		SELECT cancel_siblings_pending_flag, cancel_siblings_pending_members
		  FROM ff_edge_group
		 WHERE partition_key = $1 AND flow_id = $2::uuid AND downstream_eid = $3::uuid
		 `+lock, partition, flowID, downstreamEID).Scan(&flag, &raw)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil, false, nil
	}
	if err != nil {
		return false, nil, false, fmt.Errorf("lock edge group: %w", err)
	}
	members = make([]string, len(raw))
	for i, m := range raw {
		members[i] = NullMember
		if m.Valid {
			members[i] = m.String
		}
	}
	return flag, members, true, nil
}

// NullMember stands for a NULL element of cancel_siblings_pending_members in
// results and warnings.
const NullMember = "NULL"

func clearGroup(ctx context.Context, tx pgx.Tx, partition int16, flowID, downstreamEID string) error {
	_, err := tx.Exec(ctx, `
		UPDATE ff_edge_group
		   SET cancel_siblings_pending_flag = false,
		       cancel_siblings_pending_members = '{}'::text[]
		 WHERE partition_key = $1 AND flow_id = $2::uuid AND downstream_eid = $3::uuid`,
		partition, flowID, downstreamEID)
	if err != nil {
		return fmt.Errorf("clear edge group: %w", err)
	}
	return nil
}

func deletePending(ctx context.Context, tx pgx.Tx, partition int16, flowID, downstreamEID string) (bool, error) {
	tag, err := tx.Exec(ctx, `
		DELETE FROM ff_pending_cancel_groups
		 WHERE partition_key = $1 AND flow_id = $2::uuid AND downstream_eid = $3::uuid`,
		partition, flowID, downstreamEID)
	if err != nil {
		return false, fmt.Errorf("delete pending row: %w", err)
	}
	return tag.RowsAffected() > 0, nil
}

// ParseMembers splits an edge group's member strings into UUIDs, in
// canonical lower-case hyphenated form, and strings that are not UUIDs. It
// accepts the forms the seed's Uuid::parse_str does: hyphenated, 32 hex
// digits, braced and urn:uuid:. Duplicates are kept; the UPDATE matches each
// execution once.
func ParseMembers(members []string) (ids, bad []string) {
	for _, m := range members {
		if id, err := uuid.Parse(m); err == nil {
			ids = append(ids, id.String())
		} else {
			bad = append(bad, m)
		}
	}
	return ids, bad
}
