// Package leasing holds leases over time: the Elector campaigns for a
// lease, runs a function only while it holds it, renews it through the
// keep-alive loop and gives it up at its local deadline. The leases
// themselves are the lease store's (package leasestore) or a service's
// over REST.
package leasing
