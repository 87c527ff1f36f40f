package worker

import "os"

// exit3 is the default simulated crash: the process exits at once.
func exit3() { os.Exit(3) }
