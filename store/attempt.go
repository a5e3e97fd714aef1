package store

// Lease expiry and attempt timeout both act on attempts whose lease lapsed,
// and split those of an active execution by its retry policy
// (docs/design.md, "Attempt timeout and lease expiry"): what both read is
// here.

// LeaseRef names one attempt of a partition.
type LeaseRef struct {
	ExecutionID  string
	AttemptIndex int32
}

// maxRetriesNumberSQL reads the jsonb value mr (an execution's
// policy->'retry_policy'->'max_retries') as FlowFabric's
// extract_max_retries parses it: a bigint when mr is a JSON number printed
// as 1 to 10 digits, else NULL (absent, negative, fractional, a string).
// Postgres prints a jsonb number in its canonical form, which is what
// FlowFabric parses, so a whole number prints as digits only. The cast
// sits in a CASE branch, which alone fixes the order of evaluation, so a
// value that is not digits is never cast.
func maxRetriesNumberSQL(mr string) string {
	return `CASE WHEN jsonb_typeof(` + mr + `) = 'number' AND (` + mr + ` #>> '{}') ~ '^[0-9]{1,10}$'
	             THEN (` + mr + ` #>> '{}')::bigint END`
}

// retriesSQL is the retries FlowFabric grants for n, a maxRetriesNumberSQL
// value: n when it fits 32 bits (FlowFabric's u32), else 0.
func retriesSQL(n string) string {
	return `CASE WHEN ` + n + ` <= 4294967295 THEN ` + n + ` ELSE 0 END`
}

// declaresRetriesSQL is the condition "the execution aliased e declares
// retries": the retries ExpireAttempts reads from its policy are at least
// one. The same expressions, so the scan that leaves an attempt to attempt
// timeout and the action that retries it read a policy alike.
func declaresRetriesSQL(e string) string {
	return retriesSQL(`(`+maxRetriesNumberSQL(e+`.policy->'retry_policy'->'max_retries'`)+`)`) + ` >= 1`
}
