// Package leasing is leasehold's lease service at work: the Store that
// acquires, renews and releases leases on PostgreSQL (sharing commits
// between concurrent callers), the Go client of the REST API with
// auto-renew, and the Elector that runs a function only while it holds a
// lease. Package lease holds the types and draws the states.
//
// Every change is recorded in lease_events and NOTIFYed on the
// leasehold_lease channel by a trigger, in the same transaction. Store works
// on the database directly and is what the server, the reaper and the
// other in-process users call.
package leasing
