package jobs

import "github.com/riverqueue/river"

// Flow summary: FlowFabric's flow projector. Its tick fans out one job per
// partition holding flows to project, which projects them itself (there is
// no per-flow job). Kinds are stored in river_job.kind: never rename them.
const (
	KindFlowSummaryTick    = "ff.flow_summary.tick"
	KindFlowSummaryProject = "ff.flow_summary.project"
)

// FlowSummaryTickArgs is the periodic flow summary tick.
type FlowSummaryTickArgs struct{}

// Kind implements river.JobArgs.
func (FlowSummaryTickArgs) Kind() string { return KindFlowSummaryTick }

// FlowSummaryProjectArgs projects the flows of one partition that changed:
// those with live members, and those whose members ended since the last
// pass. After, on a continuation, is the last live flow projected (its ID).
type FlowSummaryProjectArgs struct{ ScanArgs }

// Kind implements river.JobArgs.
func (FlowSummaryProjectArgs) Kind() string { return KindFlowSummaryProject }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (FlowSummaryProjectArgs) InsertOpts() river.InsertOpts { return scanOpts() }
