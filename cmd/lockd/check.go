package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strconv"

	"github.com/lockd-dev/lockd"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// exitCheckError is `lockd check`'s status for an error other than a bad
// argument or an unreachable cluster: not exitFailure, which there means
// "stale".
const exitCheckError = 70

// CheckCommand is `lockd check NAME TOKEN [--json]`: whether a fencing
// token is a current grant of a lock, for scripts that take a token
// ($LOCKD_TOKEN) and want the cluster's word before they act.
type CheckCommand struct {
	env commandEnv
}

// checkUsage is the synopsis; checkHelp adds the exit statuses, for -h.
const checkUsage = "lockd check NAME TOKEN [--json]"

const checkHelp = checkUsage + `

Exit status: 0 the token is a current grant of NAME; 1 it is not (stale,
released, expired or never granted); 64 bad arguments; 69 no leader
answered within --timeout; 70 any other error.`

// Run asks the cluster (a linearizable read on the leader) and exits 0
// when the token is current, 1 when it is stale.
func (c *CheckCommand) Run(ctx context.Context, args []string) error {
	var asJSON *bool
	pos, cf, err := c.env.parse("check", checkUsage, args, 2, 2, func(fs *flag.FlagSet) {
		asJSON = fs.Bool("json", false, "print the API's JSON (CheckTokenResponse)")
		fs.Usage = func() {
			fmt.Fprintf(fs.Output(), "Usage: %s\n\nFlags:\n", checkHelp)
			fs.PrintDefaults()
		}
	})
	if err != nil {
		return err
	}
	name := pos[0]
	token, err := strconv.ParseUint(pos[1], 10, 64)
	if err != nil || token == 0 {
		return usageError{fmt.Errorf("token %q: want a positive decimal integer (as in $LOCKD_TOKEN)", pos[1])}
	}
	ctx, cl, done, err := cf.connect(ctx)
	if err != nil {
		return err
	}
	defer done()
	st, err := cl.CheckToken(ctx, name, token)
	if err != nil {
		err = callError(fmt.Sprintf("check %q", name), err)
		var ee *exitError
		if errors.As(err, &ee) && ee.code == exitFailure {
			ee.code = exitCheckError
		}
		return err
	}
	if *asJSON {
		if err := printJSON(c.env.stdout, checkPB(st)); err != nil {
			return exitWith(exitCheckError, err)
		}
	} else if st.Current {
		fmt.Fprintf(c.env.stdout, "token %d of %q is current (session %s)\n", token, name, printable(st.SessionID))
	} else {
		fmt.Fprintf(c.env.stdout, "token %d of %q is stale\n", token, name)
	}
	if !st.Current {
		return exitWith(exitFailure, nil)
	}
	return nil
}

// checkPB is the answer in the API's form, for --json.
func checkPB(st lockd.TokenStatus) *lockdv1.CheckTokenResponse {
	m := &lockdv1.CheckTokenResponse{Valid: st.Current, SessionId: st.SessionID}
	if st.Current {
		m.Mode = lockdv1.Mode_MODE_EXCLUSIVE
		if st.Shared {
			m.Mode = lockdv1.Mode_MODE_SHARED
		}
	}
	return m
}
