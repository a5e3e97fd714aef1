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

// ginDirect makes the (throwaway) database's river_job GIN indexes take
// each entry into their tree at once (fastupdate off), for a run that
// measures their growth: with River's default, entries first pile up in a
// pending list of up to 4 MB (gin_pending_list_limit), whose pages stay in
// the file once merged, and over 20,000 jobs that high-water mark alone
// read as ~200 bytes a job. In production the list is a constant 4 MB; what
// grows is the tree.
func (e *env) ginDirect(ctx context.Context) error {
	if _, err := e.pool.Exec(ctx, `ALTER INDEX river.river_job_args_index SET (fastupdate = off);
		ALTER INDEX river.river_job_metadata_index SET (fastupdate = off)`); err != nil {
		return fmt.Errorf("river_job's GIN indexes without pending lists: %w", err)
	}
	return nil
}

// ginGrowth runs run with river_job's GIN indexes taking entries directly
// (ginDirect) and returns what it grew them by, read once run has returned
// (its fleet stopped, its completions written).
func (e *env) ginGrowth(ctx context.Context, run func() error) (ginSize, error) {
	if err := e.ginDirect(ctx); err != nil {
		return ginSize{}, err
	}
	base, err := e.riverJobGIN(ctx)
	if err != nil {
		return ginSize{}, err
	}
	if err := run(); err != nil {
		return ginSize{}, err
	}
	after, err := e.riverJobGIN(ctx)
	return after.less(base), err
}

// riverJobGIN returns the size of river_job's GIN indexes.
func (e *env) riverJobGIN(ctx context.Context) (ginSize, error) {
	var s ginSize
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
