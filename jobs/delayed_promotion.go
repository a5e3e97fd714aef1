package jobs

import (
	"encoding/json"
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

// PromoteAtMin and PromoteAtMax (exclusive) bound PromoteArgs.At: years
// 0001 through 9999, in UTC. Go's JSON encoding of a time covers no more
// (a later year fails to encode, so no Go client could insert it) and the
// worker's decoder reads four-digit years only; the SQL function
// ffreconcile_promote refuses the same range. The usual way out of it is a
// unit mistake, epoch milliseconds taken for seconds (a year near 58,000).
var (
	PromoteAtMin = time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)
	PromoteAtMax = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
)

// MarshalJSON encodes the args in one canonical form, so that the same
// promotion has the same River unique key (a hash of these bytes) whoever
// builds it: "at" in UTC (a time.Time keeps its location, and a delay-until
// read with time.UnixMilli is in the process's local zone), the UUID in lower
// case and Execution as ParseExecutionID prints it. The SQL function
// ffreconcile_promote writes the same bytes. Args that do not parse are
// encoded as they are, for the insert hook to refuse with the reason.
func (a PromoteArgs) MarshalJSON() ([]byte, error) {
	type plain PromoteArgs // the same fields and tags, without this method
	p := plain(a)
	if a.At != nil {
		if err := validateAt(*a.At); err != nil {
			return nil, err
		}
		at := a.At.UTC()
		p.At = &at
	}
	if id, err := ParseExecutionID(a.Execution); err == nil {
		p.Execution = id.String()
	}
	if u, err := ParseUUID(a.ExecutionID); err == nil {
		p.ExecutionID = u
	}
	return json.Marshal(p)
}

func validateAt(at time.Time) error {
	if at.Before(PromoteAtMin) || !at.Before(PromoteAtMax) {
		return fmt.Errorf("promote args: at %s is outside years 0001..9999 (UTC)", at.UTC().Format(time.RFC3339Nano))
	}
	return nil
}

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
	if _, err := a.Target(); err != nil {
		return err
	}
	if a.At != nil {
		return validateAt(*a.At)
	}
	return nil
}
