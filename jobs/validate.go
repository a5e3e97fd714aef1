package jobs

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
)

// Validator is implemented by every args type of this package that carries
// user data worth checking (row and scan args).
type Validator interface {
	Validate() error
}

// ValidateOnInsert is a River insert hook that refuses args of this
// package's types when they are invalid: the insert (the whole batch) fails
// with the reason, before anything reaches the database. PromoteArgs carries
// it on its own (JobArgsWithHooks), so a client inserting promotions needs
// no configuration. Args of other types pass; the fleet validates every job
// of its kinds again when it runs, whoever inserted it.
//
// It validates the value the client encoded, which its JSON decodes back to,
// without decoding that JSON again: the fleet's scans insert thousands of row
// jobs a second, and a decode costs several times the check.
var ValidateOnInsert rivertype.Hook = river.HookInsertBeginFunc(
	func(_ context.Context, params *rivertype.JobInsertParams) error {
		v, ok := params.Args.(Validator)
		if !ok {
			return nil
		}
		if rv := reflect.ValueOf(v); rv.Kind() == reflect.Pointer && rv.IsNil() {
			return nil // a nil pointer encodes to null, which River refuses itself
		}
		if err := v.Validate(); err != nil {
			return fmt.Errorf("invalid %s job: %w", params.Kind, err)
		}
		return nil
	})

// ValidateJSON decodes JSON args as T, as River would for T's worker, and
// validates them, with the error a job of kind is refused or cancelled with.
func ValidateJSON[T any](kind string, encoded []byte) error {
	var args T
	if err := json.Unmarshal(encoded, &args); err != nil {
		return fmt.Errorf("invalid %s job: malformed JSON args: %w", kind, err)
	}
	if v, ok := any(args).(Validator); ok {
		if err := v.Validate(); err != nil {
			return fmt.Errorf("invalid %s job: %w", kind, err)
		}
	}
	return nil
}

func validateRow(partition int16, field, id string) error {
	if err := ValidatePartition(int(partition)); err != nil {
		return err
	}
	if _, err := ParseUUID(id); err != nil {
		return fmt.Errorf("%s: %w", field, err)
	}
	return nil
}
