//go:build !lockdfault

package wallclock

// offsetPath is empty: a build without the tag lockdfault has no test
// offset and reads no environment variable for it.
func offsetPath() string { return "" }
