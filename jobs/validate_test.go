package jobs_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/riverqueue/river/rivertype"

	"github.com/flowfabric/ffreconcile/jobs"
)

// foreignPromote is another service's own Go type for the promote kind.
type foreignPromote struct {
	Partition   int    `json:"partition"`
	ExecutionID string `json:"execution_id"`
}

func (foreignPromote) Kind() string { return jobs.KindPromote }

func marshal(t testing.TB, args any) []byte {
	t.Helper()
	b, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestValidateOnInsertValueAndJSONAgree: the insert hook validates args of
// this package's types as the value the client encoded (value or pointer),
// with the same verdict and message as validating the stored JSON
// (ValidateJSON, what the fleet does for jobs other clients inserted). Its
// JSON is not read again: a regression that decoded it would fail the
// "NotDecodedAgain" cases, whose JSON is missing. Args of other types pass:
// the fleet validates them by kind, at insert and when they run.
func TestValidateOnInsertValueAndJSONAgree(t *testing.T) {
	t.Parallel()
	hook := jobs.ValidateOnInsert.(rivertype.HookInsertBegin)
	insert := func(args rivertype.JobArgs, encoded []byte) error {
		return hook.InsertBegin(context.Background(), &rivertype.JobInsertParams{Kind: jobs.KindPromote, Args: args, EncodedArgs: encoded})
	}

	for _, tt := range badPromoteArgs {
		t.Run(tt.name, func(t *testing.T) {
			fromJSON := jobs.ValidateJSON[jobs.PromoteArgs](jobs.KindPromote, marshal(t, tt.args))
			if fromJSON == nil || fromJSON.Error() != tt.want {
				t.Fatalf("ValidateJSON = %v; want %q", fromJSON, tt.want)
			}
			for _, args := range []rivertype.JobArgs{tt.args, &tt.args} {
				if err := insert(args, marshal(t, args)); err == nil || err.Error() != tt.want {
					t.Errorf("hook(%T) = %v; want %q", args, err, tt.want)
				}
			}
		})
	}

	valid := jobs.PromoteArgs{Partition: partition(7), ExecutionID: testUUID}
	var nilArgs *jobs.PromoteArgs
	tests := []struct {
		name    string
		args    rivertype.JobArgs
		encoded []byte
		wantErr bool
	}{
		{"OwnValueNotDecodedAgain", valid, nil, false},
		{"OwnPointerNotDecodedAgain", &valid, nil, false},
		{"NilPointer", nilArgs, nil, false},
		{"ForeignTypePasses", foreignPromote{300, testUUID}, marshal(t, foreignPromote{300, testUUID}), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := insert(tt.args, tt.encoded); (err != nil) != tt.wantErr {
				t.Fatalf("hook = %v; want error %v", err, tt.wantErr)
			}
		})
	}
	t.Run("MalformedJSON", func(t *testing.T) {
		err := jobs.ValidateJSON[jobs.LeaseReleaseArgs](jobs.KindLeaseRelease, []byte(`{"partition": "7"}`))
		if err == nil || err.Error() != `invalid ff.lease_expiry.release job: malformed JSON args: json: cannot unmarshal string into Go struct field LeaseReleaseArgs.partition of type int16` {
			t.Fatalf("ValidateJSON = %v; want the decoder's reason", err)
		}
	})
}

// BenchmarkValidateOnInsert compares the insert hook on args of this
// package's own type (validated as a value) with validating the same args
// from their JSON.
func BenchmarkValidateOnInsert(b *testing.B) {
	args := jobs.PromoteArgs{Partition: partition(7), ExecutionID: testUUID}
	encoded := marshal(b, args)
	hook := jobs.ValidateOnInsert.(rivertype.HookInsertBegin)
	params := &rivertype.JobInsertParams{Kind: args.Kind(), Args: args, EncodedArgs: encoded}
	b.Run("Value", func(b *testing.B) {
		for b.Loop() {
			if err := hook.InsertBegin(context.Background(), params); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("JSON", func(b *testing.B) {
		for b.Loop() {
			if err := jobs.ValidateJSON[jobs.PromoteArgs](args.Kind(), encoded); err != nil {
				b.Fatal(err)
			}
		}
	})
}
