package main

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

// FuzzCLIArgs feeds arbitrary argument lists (NUL-separated) to the
// argument parsing of lockd run, lockd cron and the one-call client
// commands: never a panic; every failure is help or a usage error (exit
// 64), never another kind; and what run accepts is a runnable command
// with the documented bounds.
func FuzzCLIArgs(f *testing.F) {
	for _, seed := range []string{
		"x\x00--\x00true",
		"--ttl\x002s\x00--wait\x005s\x00job\x00--\x00sh\x00-c\x00echo hi",
		"--no-wait\x00--wait\x001s\x00x\x00--\x00true",
		"--limit\x003\x00--shared\x00x\x00true",
		"--once\x001h\x00--kill-grace\x0010s\x00x\x00--\x00true",
		"--lock-delay\x00-1s\x00x\x00--\x00true",
		"--conflict-exit-code\x00300\x00x\x00--\x00true",
		"--backend\x00redis://a:1,redis://b:2\x00x\x00--\x00true",
		"--backend\x00redis://a:1\x00--limit\x002\x00x\x00cmd\x00--flag",
		"--endpoints\x00,,,\x00--connect-timeout\x00-1s\x00x\x00--\x00true",
		"x\x00--ttl",
		"-h",
		"--\x00--",
		"*/5 * * * *\x00job\x00--\x00true",
		"--tz\x00Europe/Paris\x00--catch-up\x0030s\x000 9 * * 1-5\x00invoices\x00--\x00true",
		"@every 1m\x00job\x00--\x00true",
		"\x00\x00\x00",
	} {
		f.Add(uint8(0), []byte(seed))
		f.Add(uint8(1), []byte(seed))
		f.Add(uint8(2), []byte(seed))
	}
	getenv := func(k string) string {
		switch k {
		case endpointsEnv:
			return "a:1,b:2"
		}
		return ""
	}
	f.Fuzz(func(t *testing.T, which uint8, data []byte) {
		var args []string
		if len(data) > 0 {
			args = strings.Split(string(data), "\x00")
		}
		var err error
		switch which % 3 {
		case 0:
			var rf *runFlags
			rf, err = (&RunCommand{Stderr: io.Discard, Getenv: getenv}).parse(args)
			if err == nil {
				checkRunFlags(t, rf)
			}
		case 1:
			var cf *cronFlags
			cf, err = (&CronCommand{Stderr: io.Discard, Getenv: getenv}).parse(args)
			if err == nil {
				checkRunFlags(t, &cf.run)
				if cf.schedule == nil || cf.retryDelay <= 0 || cf.catchUp < 0 || strings.Contains(cf.run.name, "@") {
					t.Fatalf("cron accepted %q as %+v", args, cf)
				}
			}
		case 2:
			env := commandEnv{stdout: io.Discard, stderr: io.Discard, getenv: getenv}
			_, _, err = env.parse("describe", "lockd describe NAME", args, 1, 1, func(fs *flag.FlagSet) {
				fs.Bool("json", false, "")
			})
		}
		var ue usageError
		if err != nil && !errors.Is(err, flag.ErrHelp) && !errors.As(err, &ue) {
			t.Fatalf("%q: got %T %v, want a usage error", args, err, err)
		}
		var out bytes.Buffer
		m := &Main{Stdout: &out, Stderr: &out}
		if err != nil {
			if code := m.exitStatus(err); code != exitUsage && code != exitOK {
				t.Fatalf("%q: exit status %d for a parse error", args, code)
			}
		}
	})
}

// checkRunFlags checks what lockd run's parser accepted.
func checkRunFlags(t *testing.T, f *runFlags) {
	t.Helper()
	switch {
	case len(f.command) == 0:
		t.Fatalf("accepted with no command: %+v", f)
	case f.ttl <= 0 || f.maxHold < 0 || f.killGrace < 0 || f.killGrace > max(f.ttl/2, defaultKillGrace(f.ttl)):
		t.Fatalf("accepted durations out of bounds: %+v", f)
	case f.conflictExitCode < 0 || f.conflictExitCode > 255:
		t.Fatalf("accepted exit code %d", f.conflictExitCode)
	case f.once < 0 || f.once > 0 && f.once < time.Second:
		t.Fatalf("accepted --once %v", f.once)
	case f.shared && f.limitSet:
		t.Fatalf("accepted --shared with --limit")
	case len(f.redis) > 0 && (f.shared || f.once > 0 || f.lockDelay > 0):
		t.Fatalf("accepted a lockd-only flag with --backend: %+v", f)
	case len(f.redis) > 1 && len(f.redis)%2 == 0:
		t.Fatalf("accepted Redlock over %d nodes", len(f.redis))
	}
}
