package jobs_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/jobs"
)

// TestPromoteArgsJSON pins the public contract: the JSON other services
// send, in both forms, with and without "at".
func TestPromoteArgsJSON(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 5, 1, 12, 30, 0, 0, time.UTC)
	tests := []struct {
		name string
		args jobs.PromoteArgs
		want string
	}{
		{"ExecutionForm", jobs.PromoteArgs{Execution: "{fp:7}:" + testUUID}, `{"execution":"{fp:7}:` + testUUID + `"}`},
		{"PartitionForm", jobs.PromoteArgs{Partition: partition(7), ExecutionID: testUUID}, `{"partition":7,"execution_id":"` + testUUID + `"}`},
		{"PartitionZeroIsKept", jobs.PromoteArgs{Partition: partition(0), ExecutionID: testUUID}, `{"partition":0,"execution_id":"` + testUUID + `"}`},
		{"At", jobs.PromoteArgs{Execution: "{fp:7}:" + testUUID, At: &at}, `{"execution":"{fp:7}:` + testUUID + `","at":"2026-05-01T12:30:00Z"}`},
		// One promotion, one encoding: River's unique key hashes these
		// bytes, so a caller's time zone or spelling must not show.
		{"AtInAnotherZoneIsWrittenInUTC", jobs.PromoteArgs{Partition: partition(7), ExecutionID: testUUID, At: ptr(at.In(time.FixedZone("", 2*3600)))},
			`{"partition":7,"execution_id":"` + testUUID + `","at":"2026-05-01T12:30:00Z"}`},
		{"AtFractionTrimmed", jobs.PromoteArgs{Partition: partition(7), ExecutionID: testUUID, At: ptr(at.Add(123400 * time.Microsecond))},
			`{"partition":7,"execution_id":"` + testUUID + `","at":"2026-05-01T12:30:00.1234Z"}`},
		{"UpperCaseUUIDIsLowered", jobs.PromoteArgs{Partition: partition(7), ExecutionID: strings.ToUpper(testUUID)},
			`{"partition":7,"execution_id":"` + testUUID + `"}`},
		{"ExecutionIsCanonical", jobs.PromoteArgs{Execution: "{fp:007}:" + strings.ToUpper(testUUID)}, `{"execution":"{fp:7}:` + testUUID + `"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := json.Marshal(tt.args)
			if err != nil || string(b) != tt.want {
				t.Fatalf("json = %s, %v; want %s", b, err, tt.want)
			}
			if err := jobs.ValidateJSON[jobs.PromoteArgs](jobs.KindPromote, b); err != nil {
				t.Fatalf("valid args refused: %v", err)
			}
		})
	}
}

func TestPromoteArgsInsertOpts(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		at   *time.Time
		// wantLead: scheduled RiverSchedulerInterval before at; else
		// available at once (zero ScheduledAt).
		wantLead bool
	}{
		{"no at", nil, false},
		{"at in a minute", ptr(time.Now().Add(time.Minute)), true},
		{"at within the scheduler interval", ptr(time.Now().Add(2 * time.Second)), false},
		{"at in the past", ptr(time.Now().Add(-time.Minute)), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := jobs.PromoteArgs{Execution: "{fp:7}:" + testUUID, At: tt.at}.InsertOpts()
			if opts.Queue != jobs.QueueRows || opts.MaxAttempts != jobs.RowMaxAttempts ||
				!opts.UniqueOpts.ByArgs || len(opts.UniqueOpts.ByState) != len(jobs.UnfinishedStates) {
				t.Fatalf("opts = %+v; want queue ff_rows, 5 attempts, unique by args among unfinished jobs", opts)
			}
			switch {
			case tt.wantLead && !opts.ScheduledAt.Equal(tt.at.Add(-jobs.RiverSchedulerInterval)):
				t.Fatalf("scheduled at %s; want %s, one scheduler interval before at", opts.ScheduledAt, tt.at.Add(-jobs.RiverSchedulerInterval))
			case !tt.wantLead && !opts.ScheduledAt.IsZero():
				t.Fatalf("scheduled at %s; want zero (available at once)", opts.ScheduledAt)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// badPromoteArgs are invalid promotions with the message the inserting
// service gets back.
var badPromoteArgs = []struct {
	name string
	args jobs.PromoteArgs
	want string
}{
	{"NotAUUID", jobs.PromoteArgs{Partition: partition(7), ExecutionID: "not-a-uuid"},
		`invalid ff.delayed_promotion.promote job: promote args: execution_id: "not-a-uuid" is not a UUID (want 8-4-4-4-12 hex digits)`},
	{"Partition256", jobs.PromoteArgs{Partition: partition(256), ExecutionID: testUUID},
		"invalid ff.delayed_promotion.promote job: promote args: partition 256 is out of range 0..255"},
	{"PartitionMinus1", jobs.PromoteArgs{Partition: partition(-1), ExecutionID: testUUID},
		"invalid ff.delayed_promotion.promote job: promote args: partition -1 is out of range 0..255"},
	{"BothForms", jobs.PromoteArgs{Execution: "{fp:7}:" + testUUID, Partition: partition(7), ExecutionID: testUUID},
		"invalid ff.delayed_promotion.promote job: promote args: give either execution or partition + execution_id, not both"},
	{"Neither", jobs.PromoteArgs{},
		"invalid ff.delayed_promotion.promote job: promote args: missing execution (or partition + execution_id)"},
	{"PartitionWithoutExecutionID", jobs.PromoteArgs{Partition: partition(7)},
		"invalid ff.delayed_promotion.promote job: promote args: missing execution_id"},
	{"ExecutionIDWithoutPartition", jobs.PromoteArgs{ExecutionID: testUUID},
		"invalid ff.delayed_promotion.promote job: promote args: missing partition"},
	{"MalformedExecution", jobs.PromoteArgs{Execution: "fp:7:" + testUUID},
		`invalid ff.delayed_promotion.promote job: promote args: execution id "fp:7:` + testUUID + `": want the form {fp:N}:<uuid>`},
	{"ExecutionPartition300", jobs.PromoteArgs{Execution: "{fp:300}:" + testUUID},
		`invalid ff.delayed_promotion.promote job: promote args: execution id "{fp:300}:` + testUUID + `": partition 300 is out of range 0..255`},
}

// TestBadPromoteArgsRefusedAtInsert: a Go service's insert-only client,
// configured with nothing but its schema, refuses invalid promotions before
// they reach the database, through PromoteArgs' own insert hook; a batch
// with one bad job inserts nothing.
func TestBadPromoteArgsRefusedAtInsert(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	client := insertOnlyClient(t, db.Pool)
	count := func() int {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM river.river_job`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, tt := range badPromoteArgs {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.args.Validate(); err == nil {
				t.Fatal("Validate accepted the args")
			}
			_, err := client.Insert(ctx, tt.args, nil)
			if err == nil || err.Error() != tt.want {
				t.Fatalf("Insert error = %v; want %q", err, tt.want)
			}
			tx, err := db.Pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx) //nolint:errcheck
			_, err = client.InsertManyTx(ctx, tx, []river.InsertManyParams{
				{Args: jobs.PromoteArgs{Execution: "{fp:1}:" + testUUID}},
				{Args: tt.args},
			})
			if err == nil || err.Error() != tt.want {
				t.Fatalf("InsertManyTx error = %v; want %q", err, tt.want)
			}
		})
	}
	if n := count(); n != 0 {
		t.Fatalf("%d jobs inserted; want none", n)
	}
	// A valid promotion goes through, scheduled when "at" is set.
	at := time.Now().Add(time.Hour)
	res, err := client.Insert(ctx, jobs.PromoteArgs{Execution: "{fp:7}:" + strings.ToUpper(testUUID), At: &at}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Job.State != rivertype.JobStateScheduled || res.Job.Queue != jobs.QueueRows || res.Job.MaxAttempts != jobs.RowMaxAttempts {
		t.Fatalf("job = %s in %s with %d attempts; want scheduled in ff_rows with 5", res.Job.State, res.Job.Queue, res.Job.MaxAttempts)
	}
	// The same promotion again is skipped while the first is unfinished.
	again, err := client.Insert(ctx, jobs.PromoteArgs{Execution: "{fp:7}:" + strings.ToUpper(testUUID), At: &at}, nil)
	if err != nil || !again.UniqueSkippedAsDuplicate || again.Job.ID != res.Job.ID {
		t.Fatalf("second insert = %+v, %v; want skipped as a duplicate of job %d", again, err, res.Job.ID)
	}
}

// TestPromoteArgsAtOutOfRange: an at outside years 0001..9999 (UTC), the
// range the SQL function ffreconcile_promote accepts too, is refused at
// insert naming "at" (a year Go cannot encode fails while encoding, before
// the hook) and in JSON from other clients. A regression lets a Go client
// insert year 0, which the function could never match.
func TestPromoteArgsAtOutOfRange(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	client := insertOnlyClient(t, db.Pool)
	for _, at := range []time.Time{
		time.Date(0, 6, 1, 0, 0, 0, 0, time.UTC),
		jobs.PromoteAtMin.Add(-time.Microsecond),
		jobs.PromoteAtMax,
		time.UnixMilli(1777000000000 * 1000), // milliseconds taken for seconds
	} {
		want := "promote args: at " + at.UTC().Format(time.RFC3339Nano) + " is outside years 0001..9999 (UTC)"
		_, err := client.Insert(ctx, jobs.PromoteArgs{Partition: partition(7), ExecutionID: testUUID, At: &at}, nil)
		if err == nil || !strings.HasSuffix(err.Error(), want) {
			t.Errorf("insert at %s: %v; want it to end %q", at, err, want)
		}
		if err := (jobs.PromoteArgs{Partition: partition(7), ExecutionID: testUUID, At: &at}).Validate(); err == nil || err.Error() != want {
			t.Errorf("Validate at %s: %v; want %q", at, err, want)
		}
	}
	if err := jobs.ValidateJSON[jobs.PromoteArgs](jobs.KindPromote, []byte(`{"partition":7,"execution_id":"`+testUUID+`","at":"0000-06-01T00:00:00Z"}`)); err == nil ||
		err.Error() != "invalid ff.delayed_promotion.promote job: promote args: at 0000-06-01T00:00:00Z is outside years 0001..9999 (UTC)" {
		t.Errorf("ValidateJSON of year 0: %v", err)
	}
	for _, at := range []time.Time{jobs.PromoteAtMin, jobs.PromoteAtMax.Add(-time.Microsecond)} {
		if _, err := client.Insert(ctx, jobs.PromoteArgs{Partition: partition(7), ExecutionID: testUUID, At: &at}, nil); err != nil {
			t.Errorf("insert at %s, the range's edge: %v", at, err)
		}
	}
}

// FuzzValidatePromoteArgs: validating any JSON a client could store never
// panics, and args it accepts resolve to a valid target.
func FuzzValidatePromoteArgs(f *testing.F) {
	for _, s := range []string{
		`{"execution":"{fp:7}:` + testUUID + `"}`,
		`{"partition":7,"execution_id":"` + testUUID + `"}`,
		`{"partition":0,"execution_id":"` + strings.ToUpper(testUUID) + `","at":"2026-05-01T12:30:00Z"}`,
		`{"partition":256,"execution_id":"` + testUUID + `"}`,
		`{"partition":-1,"execution_id":"` + testUUID + `"}`,
		`{"partition":70000,"execution_id":"x"}`,
		`{"partition":"7","execution_id":"` + testUUID + `"}`,
		`{"execution":"{fp:7}:` + testUUID + `","partition":7}`,
		`{"at":"yesterday"}`,
		`{}`, `null`, `[]`, `"x"`, ``, `{"execution":null}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := jobs.ValidateJSON[jobs.PromoteArgs](jobs.KindPromote, data); err != nil {
			return
		}
		var a jobs.PromoteArgs
		if err := json.Unmarshal(data, &a); err != nil {
			t.Fatalf("accepted %q but it does not decode: %v", data, err)
		}
		id, err := a.Target()
		if err != nil {
			t.Fatalf("accepted %q but Target fails: %v", data, err)
		}
		if id.Partition < 0 || id.Partition >= jobs.PartitionCount {
			t.Fatalf("accepted %q with partition %d", data, id.Partition)
		}
		if u, err := jobs.ParseUUID(id.UUID); err != nil || u != id.UUID {
			t.Fatalf("accepted %q with a non-canonical UUID %q", data, id.UUID)
		}
	})
}
