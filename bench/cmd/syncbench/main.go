// Command syncbench measures what one log append and sync costs on this
// machine's disk: the CPU the calling process is charged per append and
// sync (user + system, from getrusage; the small write is counted in), the
// syncs per second of one writer, and the latency of an append and its
// sync. It compares fsync with fdatasync, on
// a file preallocated with fallocate (as raft-wal's segment files are) and
// on one written with zeroes first, so that a sync has no extent to
// convert (where the filesystem cannot fallocate, the preallocated rows are
// left out). The file lives in --dir (default: the current directory, so
// run it where the data dir would be) and is removed afterwards, also on
// SIGINT or SIGTERM.
//
//	(cd bench && go run ./cmd/syncbench --dir /var/lib/lockd)
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lockd-dev/lockd/internal/loadgen"
)

func main() {
	dir := flag.String("dir", ".", "directory to write the test file in (the disk to measure)")
	syncs := flag.Int("syncs", 10000, "appends and syncs per run")
	record := flag.Int("record", 600, "bytes per append (a group-committed batch of a few log entries)")
	rounds := flag.Int("rounds", 2, "rounds; each runs every variant once")
	size := flag.Int64("size", 64<<20, "file size in bytes (raft-wal's segment size by default)")
	flag.Parse()
	if *syncs < 1 || *syncs > 1_000_000 || *record < 1 || *record > 1<<20 || *rounds < 1 || *rounds > 100 {
		fmt.Fprintln(os.Stderr, "syncbench: --syncs must be 1..1000000, --record 1..1048576, --rounds 1..100")
		os.Exit(2)
	}
	if int64(*syncs)*int64(*record) > *size {
		fmt.Fprintf(os.Stderr, "syncbench: %d appends of %d bytes do not fit in --size %d\n", *syncs, *record, *size)
		os.Exit(2)
	}
	// run removes the file whenever it returns; a signal removes it
	// while run is busy.
	path := filepath.Join(*dir, fmt.Sprintf("syncbench-%d.dat", os.Getpid()))
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		sig := <-sigs
		os.Remove(path)
		os.Exit(128 + int(sig.(syscall.Signal))) // as a shell reports it
	}()
	fmt.Printf("| file | sync | syncs/s | CPU µs per append+sync | p50 | p99 |\n|---|---|---:|---:|---:|---:|\n")
	for r := 0; r < *rounds; r++ {
		for _, zero := range []bool{false, true} {
			for _, data := range []bool{false, true} {
				res, err := run(path, *size, *syncs, *record, zero, data)
				if errors.Is(err, errNoFallocate) {
					if r == 0 && !data {
						fmt.Fprintln(os.Stderr, "syncbench: this filesystem cannot fallocate; the preallocated rows are left out")
					}
					continue
				}
				if err != nil {
					fmt.Fprintln(os.Stderr, "syncbench:", err)
					os.Exit(1)
				}
				file, call := "fallocate", "fsync"
				if zero {
					file = "zero-filled"
				}
				if data {
					call = "fdatasync"
				}
				fmt.Printf("| %s | %s | %.0f | %.1f | %d µs | %d µs |\n", file, call, res.rate, res.cpuPerSync, res.p50.Microseconds(), res.p99.Microseconds())
			}
		}
	}
}

type result struct {
	rate, cpuPerSync float64
	p50, p99         time.Duration
}

// errNoFallocate: the filesystem of --dir does not support fallocate.
var errNoFallocate = errors.New("fallocate not supported")

// cpu is the process's CPU time so far (loadgen.CPUTime), or an error
// where it cannot be read.
func cpu() (time.Duration, error) {
	if c := loadgen.CPUTime(); c >= 0 {
		return c, nil
	}
	return 0, errors.New("the process's CPU time cannot be read (getrusage)")
}

// run creates the file, prepares it (fallocate or zeroes, then a full
// sync), and times n appends each followed by one sync.
func run(path string, size int64, n, record int, zero, data bool) (result, error) {
	_ = os.Remove(path)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o644)
	if err != nil {
		return result{}, err
	}
	defer f.Close()
	defer os.Remove(path)
	fd := int(f.Fd())
	if zero {
		buf := make([]byte, 1<<20)
		for off := int64(0); off < size; off += int64(len(buf)) {
			if _, err := f.WriteAt(buf[:min(int64(len(buf)), size-off)], off); err != nil {
				return result{}, err
			}
		}
	} else if err := unix.Fallocate(fd, 0, 0, size); errors.Is(err, unix.EOPNOTSUPP) {
		return result{}, errNoFallocate
	} else if err != nil {
		return result{}, fmt.Errorf("fallocate: %w", err)
	}
	if err := unix.Fsync(fd); err != nil {
		return result{}, err
	}
	sync := unix.Fsync
	if data {
		sync = unix.Fdatasync
	}
	rec := make([]byte, record)
	lat := make([]time.Duration, n)
	c0, err := cpu()
	if err != nil {
		return result{}, err
	}
	t0 := time.Now()
	for i := range n {
		s := time.Now()
		if _, err := f.WriteAt(rec, int64(i)*int64(record)); err != nil {
			return result{}, err
		}
		if err := sync(fd); err != nil {
			return result{}, err
		}
		lat[i] = time.Since(s)
	}
	elapsed := time.Since(t0)
	c1, err := cpu()
	if err != nil {
		return result{}, err
	}
	used := c1 - c0
	slices.Sort(lat)
	return result{
		rate:       float64(n) / elapsed.Seconds(),
		cpuPerSync: float64(used.Microseconds()) / float64(n),
		p50:        lat[n/2],
		p99:        lat[n*99/100],
	}, nil
}
