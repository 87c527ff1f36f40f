// Package lease is leasehold's lease service: time-bounded exclusive
// ownership of a named resource, stored in PostgreSQL.
//
// A lease on a resource moves through these states, every decision made by
// the database clock:
//
//	             Acquire (new fence)
//	  (free) ─────────────────────────▶ active ──Renew──┐
//	    ▲                                │  ▲ ◀─────────┘
//	    │                  Release       │  │
//	    ├──────────── released ◀─────────┤  │ (same holder: Acquire is an
//	    │                                │  │  idempotent no-op)
//	    │       expires_at passes        ▼  │
//	    └────────────────────────────  expired ──(reaper marks it:
//	                                              an "expired" event + NOTIFY)
//
// A released or expired lease is free: the next Acquire takes it over with a
// fence greater than every fence handed out before. Renew and Release are
// compare-and-set on (resource, holder, fence when given, still active), so a
// holder that lost its lease learns it as ErrNotHeld, never by overwriting
// the new holder. Every change is recorded in lease_events and NOTIFYed on
// the leasehold_lease channel by a trigger, in the same transaction.
//
// Store works on the database directly and is what the server, the reaper
// and the other in-process users call. Client is the Go client of the REST
// API, with auto-renew. Elector runs a function only while holding a lease.
package lease
