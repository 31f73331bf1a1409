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

// ErrNotInstalled is Launch's error when no PostgreSQL server is installed.
var ErrNotInstalled = errors.New("no PostgreSQL server under /usr/lib/postgresql/*/bin")

// Start starts a PostgreSQL server and returns a connection string for its
// superuser "postgres" on database "postgres" (password-less, trust auth).
// The server stops at t's cleanup.
func Start(t testing.TB) string {
	t.Helper()
	pg, err := Launch()
	if errors.Is(err, ErrNotInstalled) {
		if os.Getenv("CI") == "true" {
			t.Fatalf("pgtest: %v (CI=true: .ci/run installs the Debian package postgresql)", err)
		}
		t.Skipf("pgtest: %v; install the Debian package postgresql to run this test", err)
	}
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() {
		if err := pg.Stop(); err != nil {
			t.Logf("pgtest: %v", err)
		}
	})
	return pg.DSN
}

// Postgres is a running server started by Launch.
type Postgres struct {
	// DSN is the connection string of the superuser "postgres" on the
	// database "postgres".
	DSN    string
	root   string
	srv    *exec.Cmd
	exited chan struct{} // closed when srv has exited
}

// Launch starts a PostgreSQL server without a test (a TestMain, a testable
// example); the caller stops it with Stop. ErrNotInstalled when there is
// none to start.
func Launch() (_ *Postgres, err error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	cred, uid, gid, err := credential()
	if err != nil {
		return nil, err
	}
	// Not t.TempDir: its parents are root's 0700 directories, which the
	// postgres user cannot enter.
	root, err := os.MkdirTemp("", "lockd-pgtest-")
	if err != nil {
		return nil, err
	}
	pg := &Postgres{root: root}
	defer func() {
		if err != nil {
			_ = pg.Stop()
		}
	}()
	if cred != nil {
		if err := os.Chown(root, uid, gid); err != nil {
			return nil, fmt.Errorf("chown data dir to the postgres user: %w", err)
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
		return nil, fmt.Errorf("initdb: %w\n%s", err, out)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	logFile, err := os.Create(filepath.Join(root, "postgres.log"))
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	srv := exec.Command(filepath.Join(bin, "postgres"), "-D", data, "-p", strconv.Itoa(port),
		"-h", "127.0.0.1", "-k", "", "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	srv.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true}
	srv.Env = env(root)
	srv.Stdout, srv.Stderr = logFile, logFile
	if err := srv.Start(); err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	pg.srv, pg.exited = srv, make(chan struct{})
	go func() {
		_ = srv.Wait()
		close(pg.exited)
	}()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	if err := waitReady(ctx, addr, pg.exited); err != nil {
		log, _ := os.ReadFile(logFile.Name())
		return nil, fmt.Errorf("postgres did not start: %w\n%s", err, log)
	}
	pg.DSN = fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", addr)
	return pg, nil
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
	return "", ErrNotInstalled
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
func waitReady(ctx context.Context, addr string, exited <-chan struct{}) error {
	for {
		if err := probe(ctx, addr); err == nil {
			return nil
		}
		select {
		case <-exited:
			return errors.New("postgres exited")
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

// Stop shuts the server down (SIGINT: fast shutdown), killing its process
// group if it does not exit in time, and removes its directory. It is safe
// to call more than once.
func (pg *Postgres) Stop() error {
	var err error
	if pg.srv != nil {
		_ = pg.srv.Process.Signal(syscall.SIGINT)
		select {
		case <-pg.exited:
		case <-time.After(20 * time.Second):
			err = errors.New("postgres did not stop on SIGINT; killed it")
			_ = syscall.Kill(-pg.srv.Process.Pid, syscall.SIGKILL)
			<-pg.exited
		}
		pg.srv = nil
	}
	return errors.Join(err, os.RemoveAll(pg.root))
}
