package jobs

import (
	"errors"
	"fmt"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
)

// Delayed promotion: executions parked until a time (runnable +
// not_eligible_until_time) become eligible again, swept and on request from
// other services. Kinds are stored in river_job.kind: never rename them.
const (
	KindDelayedPromotionTick = "ff.delayed_promotion.tick"
	KindDelayedPromotionScan = "ff.delayed_promotion.scan"
	KindPromote              = "ff.delayed_promotion.promote"
)

// DelayedPromotionTickArgs is the periodic delayed-promotion sweep tick.
type DelayedPromotionTickArgs struct{}

// Kind implements river.JobArgs.
func (DelayedPromotionTickArgs) Kind() string { return KindDelayedPromotionTick }

// DelayedPromotionScanArgs scans one partition for delayed executions whose
// delay has elapsed.
type DelayedPromotionScanArgs struct{ ScanArgs }

// Kind implements river.JobArgs.
func (DelayedPromotionScanArgs) Kind() string { return KindDelayedPromotionScan }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (DelayedPromotionScanArgs) InsertOpts() river.InsertOpts { return scanOpts() }

// PromoteArgs promotes one delayed execution (runnable +
// not_eligible_until_time) to eligible_now once its delay-until has passed.
// It is the public contract for ad-hoc promotions from other services:
//
//	{"execution": "{fp:7}:6f1c0b1e-...."}
//	{"partition": 7, "execution_id": "6f1c0b1e-...."}
//
// with an optional "at" (RFC 3339 time, the execution's delay-until): the
// promotion then happens at that time without waiting for a sweep (see
// InsertOpts; a client that sets the job's scheduled_at itself should set it
// up to 5 s before "at", or leave it unset). Give either Execution or
// Partition + ExecutionID. The action re-checks the execution under lock, so
// a promotion that is not (yet) due, or for an execution in another state,
// changes nothing.
type PromoteArgs struct {
	// Execution is FlowFabric's execution id, `{fp:N}:<uuid>`.
	Execution string `json:"execution,omitempty" river:"unique"`
	// Partition and ExecutionID (a bare UUID) are the alternative form.
	Partition   *int16 `json:"partition,omitempty" river:"unique"`
	ExecutionID string `json:"execution_id,omitempty" river:"unique"`
	// At schedules the promotion; nil runs it now.
	At *time.Time `json:"at,omitempty" river:"unique"`
}

// Kind implements river.JobArgs.
func (PromoteArgs) Kind() string { return KindPromote }

// InsertOpts implements river.JobArgsWithInsertOpts. A set At schedules the
// job RiverSchedulerInterval ahead of it, so River's scheduler has made it
// available by At; the worker then waits for At itself (a snooze that
// short stays available) and promotes within a fetch of At instead of up to
// 5 s after it. An At closer than that inserts the job available at once.
// The job is tagged delayed_promotion.
func (a PromoteArgs) InsertOpts() river.InsertOpts {
	opts := rowOpts()
	// Tagged as the fleet tags its own jobs, so River UI's tag filter
	// finds promotions other services enqueued too.
	opts.Tags = []string{"delayed_promotion"}
	if a.At != nil {
		if early := a.At.Add(-RiverSchedulerInterval); early.After(time.Now()) {
			opts.ScheduledAt = early
		}
	}
	return opts
}

// Hooks implements river.JobArgsWithHooks: any Go client that inserts
// PromoteArgs refuses invalid args at insert time, before they reach the
// database.
func (PromoteArgs) Hooks() []rivertype.Hook {
	return []rivertype.Hook{ValidateOnInsert}
}

// Target resolves the execution to promote, validating the args.
func (a PromoteArgs) Target() (ExecutionID, error) {
	switch {
	case a.Execution != "" && (a.Partition != nil || a.ExecutionID != ""):
		return ExecutionID{}, errors.New("promote args: give either execution or partition + execution_id, not both")
	case a.Execution != "":
		id, err := ParseExecutionID(a.Execution)
		if err != nil {
			return ExecutionID{}, fmt.Errorf("promote args: %w", err)
		}
		return id, nil
	case a.Partition == nil && a.ExecutionID == "":
		return ExecutionID{}, errors.New("promote args: missing execution (or partition + execution_id)")
	case a.Partition == nil:
		return ExecutionID{}, errors.New("promote args: missing partition")
	case a.ExecutionID == "":
		return ExecutionID{}, errors.New("promote args: missing execution_id")
	}
	if err := ValidatePartition(int(*a.Partition)); err != nil {
		return ExecutionID{}, fmt.Errorf("promote args: %w", err)
	}
	u, err := ParseUUID(a.ExecutionID)
	if err != nil {
		return ExecutionID{}, fmt.Errorf("promote args: execution_id: %w", err)
	}
	return ExecutionID{Partition: *a.Partition, UUID: u}, nil
}

// Validate implements Validator.
func (a PromoteArgs) Validate() error {
	_, err := a.Target()
	return err
}
