package workers

import "sync"

// queuedAhead remembers, per reconciler and partition, the row jobs this
// process saw enqueued for a future time (its own inserts, and duplicates
// River reported with their existing job), until that time. A scan skips
// those rows instead of offering them to River's uniqueness check again,
// where a duplicate is an INSERT … ON CONFLICT DO UPDATE that rewrites the
// queued job's row. Consecutive ticks' windows overlap by the lookahead
// margin plus the ticks' jitter: without this, many of the rows found ahead
// were offered twice (docs/performance.md).
//
// A job scheduled in the future cannot have started, so it is still queued;
// only a job deleted or cancelled by hand meanwhile makes a skip wrong, and
// then its row is offered again once it is due. Other processes of the fleet
// keep their own memory, so a partition scanned by another process next
// falls back on River's check.
type queuedAhead struct {
	mu sync.Mutex
	m  map[string]map[int16]map[string]int64 // reconciler → partition → row key → start (Unix ms)
}

// pending returns the keys of partition p's rows whose jobs start after
// nowMs, forgetting those that started.
func (q *queuedAhead) pending(reconciler string, p int16, nowMs int64) map[string]struct{} {
	q.mu.Lock()
	defer q.mu.Unlock()
	keys := q.m[reconciler][p]
	out := make(map[string]struct{}, len(keys))
	for k, start := range keys {
		if start <= nowMs {
			delete(keys, k)
			continue
		}
		out[k] = struct{}{}
	}
	return out
}

// add records that the job of partition p's row key starts at startMs.
func (q *queuedAhead) add(reconciler string, p int16, key string, startMs int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.m == nil {
		q.m = map[string]map[int16]map[string]int64{}
	}
	byPart := q.m[reconciler]
	if byPart == nil {
		byPart = map[int16]map[string]int64{}
		q.m[reconciler] = byPart
	}
	keys := byPart[p]
	if keys == nil {
		keys = map[string]int64{}
		byPart[p] = keys
	}
	keys[key] = startMs
}
