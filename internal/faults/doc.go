//go:build faults

// Package faults is the fault suite: it proves that no wake-up is lost
// and none acts twice when processes die, Temporal goes away or Postgres
// restarts, by causing those faults to real processes.
//
// Run it with
//
//	go test -tags=faults -timeout 15m ./internal/faults/...
//
// (`.ci/run` does, after the main tests). Every file carries the `faults`
// build tag, so `go test ./...` skips it. TestMain builds cmd/engine once,
// with `-tags faults` (which compiles in the crash point
// REVEILLE_FAULT_CRASH_AT, absent from every other build) and without
// -race, into a temporary directory; starts `engine devstack --only
// postgres` and `engine devstack --only temporal` as separate processes,
// each on a fixed port it can be restarted on; and each test starts two
// `engine serve` replicas on a fresh database with short heartbeat,
// recovery and grace settings, drives them over REST with the client
// package, and runs its own Temporal worker whose workflows park on the
// wake and approval signals (workflows.AwaitWake, AwaitApproval). The test
// reads Postgres directly to check what the API does not show: the pool
// limit, the ledger, the outbox.
//
// Tests run one at a time: they stop and start the shared Postgres and
// Temporal. The whole suite takes about five minutes on two cores.
package faults
