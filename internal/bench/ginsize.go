package bench

import (
	"context"
	"fmt"
)

// ginSize is the size of river_job's two GIN indexes, over args and over
// metadata. River indexes every key and scalar of both: a value many jobs
// share (a partition number, a log line without ids) costs each job a few
// bytes in one posting list, a value of its own (an execution id, a
// deadline, a log line naming them; one longer than 125 bytes is indexed by
// its hash) a whole index entry. They grow until River's reindexer rebuilds
// them (daily by default).
type ginSize struct {
	Args, Metadata int64 // bytes
}

// riverJobGIN returns the size of river_job's GIN indexes, their pending
// lists merged first (gin_clean_pending_list): entries waiting in a pending
// list are stored uncompressed until the next vacuum or overflow, and
// measuring them there would depend on when that happened to come.
func (e *env) riverJobGIN(ctx context.Context) (ginSize, error) {
	var s ginSize
	if _, err := e.pool.Exec(ctx, `SELECT gin_clean_pending_list('river.river_job_args_index'::regclass),
		gin_clean_pending_list('river.river_job_metadata_index'::regclass)`); err != nil {
		return s, fmt.Errorf("merge river_job's GIN pending lists: %w", err)
	}
	err := e.pool.QueryRow(ctx, `SELECT pg_relation_size('river.river_job_args_index'::regclass),
		pg_relation_size('river.river_job_metadata_index'::regclass)`).Scan(&s.Args, &s.Metadata)
	if err != nil {
		return s, fmt.Errorf("size of river_job's GIN indexes: %w", err)
	}
	return s, nil
}

// less returns s grown since base.
func (s ginSize) less(base ginSize) ginSize {
	return ginSize{Args: s.Args - base.Args, Metadata: s.Metadata - base.Metadata}
}

// perMillion formats growth over jobs row jobs as MB per million of them.
func (s ginSize) perMillion(jobs int) string {
	if jobs <= 0 {
		return "-"
	}
	mb := func(b int64) float64 { return float64(b) / float64(jobs) * 1e6 / (1 << 20) }
	return fmt.Sprintf("%.0f MB (args %.0f, metadata %.0f)", mb(s.Args+s.Metadata), mb(s.Args), mb(s.Metadata))
}
