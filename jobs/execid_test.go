package jobs_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/flowfabric/ffreconcile/jobs"
)

func TestParseExecutionID(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		in      string
		want    jobs.ExecutionID
		wantErr string
	}{
		{name: "Valid", in: "{fp:7}:" + testUUID, want: jobs.ExecutionID{Partition: 7, UUID: testUUID}},
		{name: "PartitionZero", in: "{fp:0}:" + testUUID, want: jobs.ExecutionID{Partition: 0, UUID: testUUID}},
		{name: "PartitionMax", in: "{fp:255}:" + testUUID, want: jobs.ExecutionID{Partition: 255, UUID: testUUID}},
		{name: "UpperCaseUUIDIsLowered", in: "{fp:12}:" + strings.ToUpper(testUUID), want: jobs.ExecutionID{Partition: 12, UUID: testUUID}},
		{name: "LeadingZeros", in: "{fp:007}:" + testUUID, want: jobs.ExecutionID{Partition: 7, UUID: testUUID}},

		{name: "Empty", in: "", wantErr: `execution id "": want the form {fp:N}:<uuid>`},
		{name: "BareUUID", in: testUUID, wantErr: `want the form {fp:N}:<uuid>`},
		{name: "NoClosingBrace", in: "{fp:7:" + testUUID, wantErr: `want the form {fp:N}:<uuid>`},
		{name: "OtherTag", in: "{p:7}:" + testUUID, wantErr: `want the form {fp:N}:<uuid>`},
		{name: "PartitionEmpty", in: "{fp:}:" + testUUID, wantErr: `partition "" is not a number`},
		{name: "PartitionNegative", in: "{fp:-1}:" + testUUID, wantErr: `partition "-1" is not a number`},
		{name: "PartitionPlus", in: "{fp:+1}:" + testUUID, wantErr: `partition "+1" is not a number`},
		{name: "PartitionTooLong", in: "{fp:0007}:" + testUUID, wantErr: `partition "0007" is not a number`},
		{name: "Partition256", in: "{fp:256}:" + testUUID, wantErr: "partition 256 is out of range 0..255"},
		{name: "Partition999", in: "{fp:999}:" + testUUID, wantErr: "partition 999 is out of range 0..255"},
		{name: "NotAUUID", in: "{fp:7}:not-a-uuid", wantErr: `"not-a-uuid" is not a UUID`},
		{name: "UUIDWithoutDashes", in: "{fp:7}:" + strings.ReplaceAll(testUUID, "-", ""), wantErr: "is not a UUID"},
		{name: "UUIDWithBraces", in: "{fp:7}:{" + testUUID + "}", wantErr: "is not a UUID"},
		{name: "TrailingSpace", in: "{fp:7}:" + testUUID + " ", wantErr: "is not a UUID"},
		{name: "NonHex", in: "{fp:7}:" + strings.Replace(testUUID, "6", "g", 1), wantErr: "is not a UUID"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := jobs.ParseExecutionID(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseExecutionID(%q) = %+v, %v; want error containing %q", tt.in, got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseExecutionID(%q) = %+v, %v; want %+v", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestExecutionIDString(t *testing.T) {
	t.Parallel()
	id := jobs.ExecutionID{Partition: 42, UUID: testUUID}
	if got, want := id.String(), "{fp:42}:"+testUUID; got != want {
		t.Fatalf("String() = %q; want %q", got, want)
	}
}

// FuzzParseExecutionID: parsing never panics; whatever parses names a valid
// partition and a canonical UUID, and round-trips through String(), which
// gives back the input up to case unless its partition had leading zeros.
// Seed corpus: testdata/fuzz/FuzzParseExecutionID.
func FuzzParseExecutionID(f *testing.F) {
	f.Fuzz(func(t *testing.T, s string) {
		id, err := jobs.ParseExecutionID(s)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "execution id ") {
				t.Fatalf("error %q does not name the execution id", err)
			}
			return
		}
		if id.Partition < 0 || id.Partition >= jobs.PartitionCount {
			t.Fatalf("ParseExecutionID(%q) partition %d out of range", s, id.Partition)
		}
		if u, err := jobs.ParseUUID(id.UUID); err != nil || u != id.UUID {
			t.Fatalf("ParseExecutionID(%q) UUID %q is not canonical", s, id.UUID)
		}
		again, err := jobs.ParseExecutionID(id.String())
		if err != nil || again != id {
			t.Fatalf("round trip of %q via %q = %+v, %v; want %+v", s, id.String(), again, err, id)
		}
		// Without leading zeros in the partition, String() is the input up
		// to the UUID's case.
		num := s[len("{fp:"):strings.Index(s, "}")]
		if num == strconv.Itoa(int(id.Partition)) && !strings.EqualFold(id.String(), s) {
			t.Fatalf("String() of %q = %q; want the input up to case", s, id.String())
		}
	})
}
