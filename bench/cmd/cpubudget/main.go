// Command cpubudget splits CPU profiles of lockd into the components of a
// CPU budget per operation and prints them as a Markdown table; see
// bench/cpubudget.sh, which takes the profiles, and bench/README.md.
//
//	cpubudget --server-us 160 --client-us 95 server1.prof,server2.prof client1.prof,client2.prof
//
// Each argument is a comma-separated list of profiles of one side (merged
// before they are split); --server-us and --client-us are that side's
// measured CPU per operation (from getrusage or /proc, not from the
// profile), which the shares of the components divide. A sample belongs to
// the first component in the order of the table one of whose patterns
// matches a function anywhere on its stack: so a wake-up inside a channel
// send under the HTTP/2 server counts as a hand-off, not as transport, and
// an allocation inside the decoder as allocation, not decoding.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"

	"github.com/google/pprof/profile"
)

// component is one row of the budget: the functions whose samples it
// takes.
type component struct {
	name     string
	patterns *regexp.Regexp
}

// components are the rows, first match wins.
var components = []component{
	{"GC (background marking, assists, sweeping)", regexp.MustCompile(
		`^runtime\.(gcBgMarkWorker|gcAssistAlloc|gcDrain|bgsweep|bgscavenge|sweepone|gcStart|gcMarkDone|gcMarkTermination|markroot|scanobject|wbBufFlush|forEachP)`)},
	{"scheduler and hand-offs (wake-ups, channels, select, parking, goroutine starts, stack growth)", regexp.MustCompile(
		`^runtime\.(schedule|findRunnable|park_m|goready|ready|wakep|startm|stopm|notewakeup|notesleep|futexwakeup|futexsleep|mcall|gopark|goexit0|newproc|newproc1|morestack|newstack|copystack|netpoll|selectgo|chansend|chanrecv|closechan|semacquire1|semrelease1|runqsteal|sysmon|usleep|resetspinning|execute|goschedImpl|handoffp|entersyscallblock|exitsyscall)$|^sync\.\(\*(Mutex|RWMutex)\)\.(lockSlow|unlockSlow|rUnlockSlow)|^sync\.\(\*Cond\)\.(Wait|Signal|Broadcast)$|^sync\.runtime_`)},
	{"allocation (mallocgc, outside GC)", regexp.MustCompile(`^runtime\.(mallocgc|newobject|makeslice|growslice|makemap|rawstring|rawbyteslice|rawstringtmp)`)},
	{"Raft log write and fsync", regexp.MustCompile(`^github\.com/hashicorp/raft-wal|^github\.com/hashicorp/raft-boltdb|^go\.etcd\.io/bbolt|StoreLogs?$`)},
	{"FSM apply", regexp.MustCompile(`^github\.com/hashicorp/raft\.\(\*Raft\)\.runFSM|^github\.com/lockd-dev/lockd/internal/fsm\.`)},
	{"Raft (leader loop, propose, futures)", regexp.MustCompile(`^github\.com/hashicorp/raft\.`)},
	{"decode/encode (protobuf, Connect envelopes)", regexp.MustCompile(`^google\.golang\.org/protobuf/|^connectrpc\.com/connect\.\(\*(protoBinaryCodec|envelopeWriter|envelopeReader)\)|^github\.com/lockd-dev/lockd/proto/`)},
	{"transport write (HTTP/2 framing, write syscalls)", regexp.MustCompile(
		`^net/http\.\(\*http2(serverConn|ClientConn|clientStream)\)\.(writeFrame|writeFrameAsync|writeDataFromHandler|writeHeaders|writeRequest|writeRequestBody|flushWrite|startFrameWrite|wroteFrame|scheduleFrameWrite)|^net/http\.\(\*http2(bufferedWriter|Framer|chunkWriter|responseWriter)\)\.(Write|Flush|WriteData|WriteHeaders|writeChunk|startWrite|endWrite|WriteDataPadded)|^net/http\.http2write|^net/http\.\(\*http2(writeData|writeResHeaders|flushFrameWriter|writeWindowUpdate|writeSettings|writePingAck)\)|^net\.\(\*conn\)\.Write|^internal/poll\.\(\*FD\)\.Write|^net/http\.\(\*http2responseWriter\)|^net/http\.\(\*http2clientStream\)\.write`)},
	{"transport read (HTTP/2 framing, read syscalls)", regexp.MustCompile(
		`^net/http\.\(\*http2(serverConn|clientConnReadLoop)\)\.(readFrames|readPreface|processData|processFrame|processFrameFromReader|processHeaders|run|handleResponse|processWindowUpdate|processSettings|processPing)|^net/http\.\(\*http2Framer\)\.ReadFrame|^net/http\.\(\*http2pipe\)|^net/http\.\(\*http2requestBody\)|^net/http\.\(\*http2transportResponseBody\)|^net\.\(\*conn\)\.Read|^internal/poll\.\(\*FD\)\.Read|^net/http\.http2readFrameHeader|^bufio\.\(\*Reader\)`)},
	{"transport other (HTTP/2 serve loop, Connect stream plumbing)", regexp.MustCompile(`^net/http\.|^connectrpc\.com/|^golang\.org/x/net/`)},
	{"lockd handler and client code", regexp.MustCompile(`^github\.com/lockd-dev/lockd/`)},
}

// other takes the samples no component matched.
const other = "other (runtime, syscalls outside the above)"

func main() {
	serverUS := flag.Float64("server-us", 0, "the server's measured CPU per operation, µs")
	clientUS := flag.Float64("client-us", 0, "the client's measured CPU per operation, µs")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: cpubudget --server-us N --client-us N SERVER.prof[,..] CLIENT.prof[,..]")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 2 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(os.Stdout, flag.Arg(0), flag.Arg(1), *serverUS, *clientUS); err != nil {
		fmt.Fprintln(os.Stderr, "cpubudget:", err)
		os.Exit(1)
	}
}

// run prints the table of both sides.
func run(w io.Writer, serverFiles, clientFiles string, serverUS, clientUS float64) error {
	srv, err := shares(serverFiles)
	if err != nil {
		return fmt.Errorf("server: %w", err)
	}
	cli, err := shares(clientFiles)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	fmt.Fprintln(w, "| component | server µs/op | server % | client µs/op | client % |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|")
	names := make([]string, 0, len(components)+1)
	for _, c := range components {
		names = append(names, c.name)
	}
	names = append(names, other)
	for _, n := range names {
		fmt.Fprintf(w, "| %s | %.1f | %.1f | %.1f | %.1f |\n", n, srv[n]*serverUS, 100*srv[n], cli[n]*clientUS, 100*cli[n])
	}
	fmt.Fprintf(w, "| **total** | **%.1f** | 100 | **%.1f** | 100 |\n", serverUS, clientUS)
	return nil
}

// shares merges the comma-separated profiles and returns each component's
// share of their CPU time.
func shares(files string) (map[string]float64, error) {
	var ps []*profile.Profile
	for f := range strings.SplitSeq(files, ",") {
		fh, err := os.Open(f)
		if err != nil {
			return nil, err
		}
		p, err := profile.Parse(fh)
		fh.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		ps = append(ps, p)
	}
	p, err := profile.Merge(ps)
	if err != nil {
		return nil, fmt.Errorf("merge: %w", err)
	}
	vi := -1
	for i, st := range p.SampleType {
		if st.Type == "cpu" {
			vi = i
		}
	}
	if vi < 0 {
		return nil, errors.New("not a CPU profile")
	}
	byName := map[string]float64{}
	var total float64
	for _, s := range p.Sample {
		v := float64(s.Value[vi])
		total += v
		byName[classify(s)] += v
	}
	if total == 0 {
		return nil, errors.New("no samples")
	}
	for k := range byName {
		byName[k] /= total
	}
	return byName, nil
}

// classify returns the component of a sample.
func classify(s *profile.Sample) string {
	var funcs []string
	for _, loc := range s.Location {
		for _, l := range loc.Line {
			if l.Function != nil {
				funcs = append(funcs, l.Function.Name)
			}
		}
	}
	for _, c := range components {
		for _, f := range funcs {
			if c.patterns.MatchString(f) {
				return c.name
			}
		}
	}
	return other
}
