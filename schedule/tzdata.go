package schedule

import (
	// The zones are compiled in, so that a schedule's zone means the same
	// on every replica and in every program that imports the library, also
	// in a container without /usr/share/zoneinfo (about 450 kB).
	_ "time/tzdata"
)
