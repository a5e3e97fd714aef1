package jobs_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/riverqueue/river/rivertype"

	"github.com/flowfabric/ffreconcile/jobs"
)

// foreignPromote is another service's own Go type for the promote kind: the
// insert hook cannot validate its value and must read its JSON.
type foreignPromote struct {
	Partition   int    `json:"partition"`
	ExecutionID string `json:"execution_id"`
}

func (foreignPromote) Kind() string { return jobs.KindPromote }

// TestValidateOnInsertValueAndJSONAgree: the insert hook validates args of
// this package's own type as the value the client encoded (value or
// pointer), and any other type from its JSON; both give the same verdict and
// message as validating the stored JSON.
func TestValidateOnInsertValueAndJSONAgree(t *testing.T) {
	t.Parallel()
	hook := jobs.ValidateOnInsert.(rivertype.HookInsertBegin)
	insert := func(args rivertype.JobArgs, encoded []byte) error {
		return hook.InsertBegin(context.Background(), &rivertype.JobInsertParams{Kind: args.Kind(), Args: args, EncodedArgs: encoded})
	}
	marshal := func(args any) []byte {
		b, err := json.Marshal(args)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}

	for _, tt := range badPromoteArgs {
		t.Run(tt.name, func(t *testing.T) {
			fromJSON := jobs.ValidateEncoded(jobs.KindPromote, marshal(tt.args))
			if fromJSON == nil || fromJSON.Error() != tt.want {
				t.Fatalf("ValidateEncoded = %v; want %q", fromJSON, tt.want)
			}
			for _, args := range []rivertype.JobArgs{tt.args, &tt.args} {
				if err := insert(args, marshal(args)); err == nil || err.Error() != tt.want {
					t.Errorf("hook(%T) = %v; want %q", args, err, tt.want)
				}
			}
		})
	}

	valid := jobs.PromoteArgs{Partition: partition(7), ExecutionID: testUUID}
	tests := []struct {
		name    string
		args    rivertype.JobArgs
		encoded []byte
		wantErr bool
	}{
		// The value is what the client encoded, so its JSON is not read
		// again: here it is missing, and the value alone decides.
		{"OwnValueNotDecodedAgain", valid, nil, false},
		{"OwnPointerNotDecodedAgain", &valid, nil, false},
		{"ForeignTypeValidFromJSON", foreignPromote{7, testUUID}, marshal(foreignPromote{7, testUUID}), false},
		{"ForeignTypeInvalidFromJSON", foreignPromote{300, testUUID}, marshal(foreignPromote{300, testUUID}), true},
		{"ForeignTypeMissingJSON", foreignPromote{7, testUUID}, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := insert(tt.args, tt.encoded); (err != nil) != tt.wantErr {
				t.Fatalf("hook = %v; want error %v", err, tt.wantErr)
			}
		})
	}
}

// BenchmarkValidateOnInsert compares the insert hook on args of this
// package's own type (validated as a value) with validating the same args
// from their JSON, as the hook did for every row job before.
func BenchmarkValidateOnInsert(b *testing.B) {
	args := jobs.PromoteArgs{Partition: partition(7), ExecutionID: testUUID}
	encoded, err := json.Marshal(args)
	if err != nil {
		b.Fatal(err)
	}
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
			if err := jobs.ValidateEncoded(args.Kind(), encoded); err != nil {
				b.Fatal(err)
			}
		}
	})
}
