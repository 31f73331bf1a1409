// Package pgtest starts a real PostgreSQL server for a test: its own data
// dir, a free 127.0.0.1 port, no Unix socket, stopped by t.Cleanup. It
// needs the Debian package postgresql (binaries under
// /usr/lib/postgresql/*/bin, which .ci/run installs). Without it the test
// is skipped with a message, except under CI=true, where it fails.
//
// initdb and postgres refuse to run as root: as root (CI runs as root)
// they run as the user "postgres" (which the package creates), in a
// directory owned by that user.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// startTimeout bounds initdb and the server's start.
const startTimeout = 60 * time.Second

// Start starts a PostgreSQL server and returns a connection string for its
// superuser "postgres" on database "postgres" (password-less, trust auth).
func Start(t testing.TB) string {
	t.Helper()
	bin, err := binDir()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("pgtest: %v (CI=true: .ci/run installs the Debian package postgresql)", err)
		}
		t.Skipf("pgtest: %v; install the Debian package postgresql to run this test", err)
	}
	cred, uid, gid, err := credential()
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	// Not t.TempDir: its parents are root's 0700 directories, which the
	// postgres user cannot enter.
	root, err := os.MkdirTemp("", "lockd-pgtest-")
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	if cred != nil {
		if err := os.Chown(root, uid, gid); err != nil {
			t.Fatalf("pgtest: chown data dir to the postgres user: %v", err)
		}
	}
	data := filepath.Join(root, "data")
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres",
		"--auth=trust", "--no-locale", "-E", "UTF8", "--no-sync")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	initdb.Env = env(root)
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("pgtest: initdb: %v\n%s", err, out)
	}
	port, err := freePort()
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	logFile, err := os.Create(filepath.Join(root, "postgres.log"))
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	defer logFile.Close()
	srv := exec.Command(filepath.Join(bin, "postgres"), "-D", data, "-p", strconv.Itoa(port),
		"-h", "127.0.0.1", "-k", "", "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	srv.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true}
	srv.Env = env(root)
	srv.Stdout, srv.Stderr = logFile, logFile
	if err := srv.Start(); err != nil {
		t.Fatalf("pgtest: start postgres: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- srv.Wait() }()
	t.Cleanup(func() { stop(t, srv, exited) })
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	if err := waitReady(ctx, addr, exited); err != nil {
		log, _ := os.ReadFile(logFile.Name())
		t.Fatalf("pgtest: postgres did not start: %v\n%s", err, log)
	}
	return fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", addr)
}

// binDir finds the newest installed PostgreSQL's bin directory.
func binDir() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int {
		va, _ := strconv.Atoi(filepath.Base(filepath.Dir(a)))
		vb, _ := strconv.Atoi(filepath.Base(filepath.Dir(b)))
		return va - vb
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "postgres")); err == nil {
			return dirs[i], nil
		}
	}
	return "", errors.New("no PostgreSQL server under /usr/lib/postgresql/*/bin")
}

// credential returns the credential to run PostgreSQL with: none when not
// root, else the postgres user's.
func credential() (*syscall.Credential, int, int, error) {
	if os.Geteuid() != 0 {
		return nil, 0, 0, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, 0, 0, fmt.Errorf("running as root, and no user postgres to run PostgreSQL as: %w", err)
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err := errors.Join(err1, err2); err != nil {
		return nil, 0, 0, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, uid, gid, nil
}

// env is a minimal environment: HOME where the server user can write.
func env(home string) []string {
	return []string{"HOME=" + home, "PATH=/usr/bin:/bin", "LC_ALL=C"}
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// waitReady polls (a real process: a deadline, no fixed sleep) until the
// server accepts TCP connections and answers the startup handshake.
func waitReady(ctx context.Context, addr string, exited <-chan error) error {
	for {
		if err := probe(ctx, addr); err == nil {
			return nil
		}
		select {
		case err := <-exited:
			return fmt.Errorf("postgres exited: %v", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// probe connects and runs a query: a server still starting accepts TCP
// connections but refuses sessions.
func probe(ctx context.Context, addr string) error {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c, err := pgx.Connect(cctx, "postgres://postgres@"+addr+"/postgres?sslmode=disable")
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	var one int
	return c.QueryRow(cctx, "SELECT 1").Scan(&one)
}

// stop shuts the server down (SIGINT: fast shutdown), killing its process
// group if it does not exit in time.
func stop(t testing.TB, srv *exec.Cmd, exited <-chan error) {
	_ = srv.Process.Signal(syscall.SIGINT)
	select {
	case <-exited:
		return
	case <-time.After(20 * time.Second):
	}
	t.Logf("pgtest: postgres did not stop on SIGINT; killing it")
	_ = syscall.Kill(-srv.Process.Pid, syscall.SIGKILL)
	<-exited
}
