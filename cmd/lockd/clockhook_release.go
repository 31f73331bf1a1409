//go:build !lockdfault

package main

// clockOffsetEnv is empty: a build without the tag lockdfault has no cron
// clock hook and reads no environment variable for it.
const clockOffsetEnv = ""
