package jobs

import (
	"encoding/hex"
	"errors"

	"github.com/riverqueue/river"
)

// Claim grant expiry: expired claim grants are deleted, and an execution
// one left in pending_claim with no live grant is made eligible again.
// Kinds are stored in river_job.kind: never rename them.
const (
	KindClaimGrantExpiryTick = "ff.claim_grant_expiry.tick"
	KindClaimGrantExpiryScan = "ff.claim_grant_expiry.scan"
	KindClaimGrantExpire     = "ff.claim_grant_expiry.expire"
)

// ClaimGrantExpiryTickArgs is the periodic claim-grant-expiry tick.
type ClaimGrantExpiryTickArgs struct{}

// Kind implements river.JobArgs.
func (ClaimGrantExpiryTickArgs) Kind() string { return KindClaimGrantExpiryTick }

// ClaimGrantExpiryScanArgs scans one partition for expired claim grants.
type ClaimGrantExpiryScanArgs struct{ ScanArgs }

// Kind implements river.JobArgs.
func (ClaimGrantExpiryScanArgs) Kind() string { return KindClaimGrantExpiryScan }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (ClaimGrantExpiryScanArgs) InsertOpts() river.InsertOpts { return scanOpts() }

// ClaimGrantExpireArgs expires one claim grant.
type ClaimGrantExpireArgs struct {
	Partition int16 `json:"partition" river:"unique"`
	// GrantID is the grant's grant_id (bytea) in lower-case hex.
	GrantID string `json:"grant_id" river:"unique"`
	// DeadlineMs is an optional deadline (Unix ms; 0: none), not part of
	// the unique key, which a job started before it waits for; the scans
	// leave it out: see AttemptExpireArgs.DeadlineMs.
	DeadlineMs int64 `json:"deadline_ms,omitempty"`
}

// Kind implements river.JobArgs.
func (ClaimGrantExpireArgs) Kind() string { return KindClaimGrantExpire }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (ClaimGrantExpireArgs) InsertOpts() river.InsertOpts { return rowOpts() }

// Validate implements Validator.
func (a ClaimGrantExpireArgs) Validate() error {
	if err := ValidatePartition(int(a.Partition)); err != nil {
		return err
	}
	if a.GrantID == "" {
		return errors.New("missing grant_id")
	}
	if _, err := hex.DecodeString(a.GrantID); err != nil {
		return errors.New("grant_id: not hex")
	}
	return nil
}
