//go:build lockdfault

package wallclock

import "os"

// offsetPath is the offset file named by EnvOffsetFile: this build has the
// test hook (tag lockdfault).
func offsetPath() string { return os.Getenv(EnvOffsetFile) }
