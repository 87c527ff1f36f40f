// Package leasestore is the lease store: it acquires, renews and releases
// leases on PostgreSQL, sharing commits between concurrent callers (group
// commit), waits for a held resource by LISTEN, and reads leases and their
// history. Package lease holds the types and draws the states; package
// leasing holds leases over time (the Elector).
//
// Every change is recorded in lease_events and NOTIFYed on the
// leasehold_lease channel by a trigger, in the same transaction. The Store
// works on the database directly and is what the server, the reaper and
// the other in-process users call.
package leasestore
