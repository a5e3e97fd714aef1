package leasehistory

// OnHoldListed returns o with fn called each time the subscription, stopped
// at a missing event id, has listed the running transactions it waits for
// (virtual transaction ids, as pg_locks shows them), after the read that
// found the missing id. Tests wait for it to know the subscriber is holding
// at a hole, instead of sleeping. fn runs on the subscription's goroutine:
// it must not block.
func OnHoldListed(o Options, fn func(vxids []string)) Options {
	o.signals = &testSignals{holdListed: fn}
	return o
}
