package migrations

// CancelBacklogIndexName is our index on ff_cancel_backlog, the one the
// cancel backlog's ticks and scans read (store.CancelBacklogHeaders): its
// headers are due by requested_at_ms, which FlowFabric's migrations do
// not index (their ff_cancel_backlog_grace_idx holds only the headers with
// a grace_until_ms, which FlowFabric's header never sets). Headers are
// few and short-lived, so it indexes them all.
const CancelBacklogIndexName = "ffreconcile_cancel_backlog_requested_idx"

// cancelBacklogIndex is CancelBacklogIndexName, built online on a large
// table.
var cancelBacklogIndex = partialIndex{
	name: CancelBacklogIndexName, childSuffix: "_ffr_requested_idx",
	table: "ff_cancel_backlog", cols: `(partition_key, requested_at_ms)`,
	what: "the cancel backlog's index",
}

func init() { register(cancelBacklogIndex.object()) }
