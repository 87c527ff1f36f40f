package leasestore

// Queued is how many operations wait for a group, for tests that must know
// a group has formed before they let it go.
func (s *Store) Queued() int {
	s.group.mu.Lock()
	defer s.group.mu.Unlock()
	return len(s.group.queue)
}
