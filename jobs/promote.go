package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
)

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

// RiverSchedulerInterval is how often River's scheduler makes scheduled
// jobs available (River's fixed default; not configurable in v0.51). A job
// scheduled for a time therefore starts up to this much after it.
const RiverSchedulerInterval = 5 * time.Second

// InsertOpts implements river.JobArgsWithInsertOpts. A set At schedules the
// job RiverSchedulerInterval ahead of it, so River's scheduler has made it
// available by At; the worker then waits for At itself (a snooze that
// short stays available) and promotes within a fetch of At instead of up to
// 5 s after it. An At closer than that inserts the job available at once.
func (a PromoteArgs) InsertOpts() river.InsertOpts {
	opts := rowOpts()
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

// Validator is implemented by every args type of this package that carries
// user data worth checking.
type Validator interface {
	Validate() error
}

// Validate implementations of the row and scan args.

// validateScan checks a partition scan's args.
func validateScan(partition int16, follows int64) error {
	if err := ValidatePartition(int(partition)); err != nil {
		return err
	}
	if follows < 0 {
		return fmt.Errorf("follows %d is not a job id", follows)
	}
	return nil
}

// Validate implements Validator.
func (a LeaseExpiryScanArgs) Validate() error { return validateScan(a.Partition, a.Follows) }

// Validate implements Validator.
func (a SuspensionTimeoutScanArgs) Validate() error { return validateScan(a.Partition, a.Follows) }

// Validate implements Validator.
func (a DelayedPromotionScanArgs) Validate() error { return validateScan(a.Partition, a.Follows) }

// Validate implements Validator.
func (a CancelDispatchScanArgs) Validate() error { return validateScan(a.Partition, a.Follows) }

// Validate implements Validator.
func (a CancelReconcileScanArgs) Validate() error { return validateScan(a.Partition, a.Follows) }

// Validate implements Validator.
func (a LeaseReleaseArgs) Validate() error {
	return validateRow(a.Partition, "execution_id", a.ExecutionID)
}

// Validate implements Validator.
func (a SuspensionExpireArgs) Validate() error {
	return validateRow(a.Partition, "execution_id", a.ExecutionID)
}

// Validate implements Validator.
func (a CancelGroupArgs) Validate() error {
	if err := validateRow(a.Partition, "flow_id", a.FlowID); err != nil {
		return err
	}
	if _, err := ParseUUID(a.DownstreamEID); err != nil {
		return fmt.Errorf("downstream_eid: %w", err)
	}
	return nil
}

// Validate implements Validator.
func (a CancelDispatchArgs) Validate() error { return CancelGroupArgs(a).Validate() }

// Validate implements Validator.
func (a CancelReconcileArgs) Validate() error { return CancelGroupArgs(a).Validate() }

func validateRow(partition int16, field, id string) error {
	if err := ValidatePartition(int(partition)); err != nil {
		return err
	}
	if _, err := ParseUUID(id); err != nil {
		return fmt.Errorf("%s: %w", field, err)
	}
	return nil
}

// validators maps each kind with user-checkable args to its checks.
var validators = map[string]validator{
	KindPromote:               validatorFor[PromoteArgs](),
	KindLeaseRelease:          validatorFor[LeaseReleaseArgs](),
	KindSuspensionExpire:      validatorFor[SuspensionExpireArgs](),
	KindCancelDispatch:        validatorFor[CancelDispatchArgs](),
	KindCancelReconcile:       validatorFor[CancelReconcileArgs](),
	KindLeaseExpiryScan:       validatorFor[LeaseExpiryScanArgs](),
	KindSuspensionTimeoutScan: validatorFor[SuspensionTimeoutScanArgs](),
	KindDelayedPromotionScan:  validatorFor[DelayedPromotionScanArgs](),
	KindCancelDispatchScan:    validatorFor[CancelDispatchScanArgs](),
	KindCancelReconcileScan:   validatorFor[CancelReconcileScanArgs](),
}

// validator checks one kind's args, either as stored (JSON) or as the Go
// value a client encoded.
type validator struct {
	// encoded decodes and validates JSON args.
	encoded func([]byte) error
	// value validates args of this package's type for the kind; typed is
	// false for any other type (a client's own struct for the kind).
	value func(any) (typed bool, err error)
}

func validatorFor[T Validator]() validator {
	return validator{
		encoded: func(encoded []byte) error {
			var args T
			if err := json.Unmarshal(encoded, &args); err != nil {
				return fmt.Errorf("malformed JSON args: %w", err)
			}
			return args.Validate()
		},
		value: func(args any) (bool, error) {
			switch a := args.(type) {
			case T:
				return true, a.Validate()
			case *T:
				if a != nil {
					return true, (*a).Validate()
				}
			}
			return false, nil
		},
	}
}

// ValidateEncoded validates the JSON args of a job of the given kind as any
// River client would store them. Kinds this package does not define pass.
func ValidateEncoded(kind string, encoded []byte) error {
	v, ok := validators[kind]
	if !ok {
		return nil
	}
	if err := v.encoded(encoded); err != nil {
		return fmt.Errorf("invalid %s job: %w", kind, err)
	}
	return nil
}

// ValidateOnInsert is a River insert hook that refuses invalid args of this
// package's kinds; the insert (the whole batch) fails with the reason. Install
// it globally with river.Config{Hooks: []rivertype.Hook{jobs.ValidateOnInsert}};
// PromoteArgs carries it on its own.
//
// Args of this package's own type for their kind are validated as the value
// the client encoded, which its JSON decodes back to, without decoding that
// JSON again: the fleet's scans insert thousands of row jobs a second, and
// a decode costs about ten times the check and four times its allocations
// (BenchmarkValidateOnInsert). Any other type (a client's own struct with
// one of these kinds) is validated from its JSON.
var ValidateOnInsert rivertype.Hook = river.HookInsertBeginFunc(
	func(_ context.Context, params *rivertype.JobInsertParams) error {
		v, ok := validators[params.Kind]
		if !ok {
			return nil
		}
		if typed, err := v.value(params.Args); typed {
			if err != nil {
				return fmt.Errorf("invalid %s job: %w", params.Kind, err)
			}
			return nil
		}
		return ValidateEncoded(params.Kind, params.EncodedArgs)
	})
