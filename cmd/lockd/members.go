package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/lockd-dev/lockd"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

const membersUsage = "lockd members [--json] | lockd members remove ID"

// MembersCommand is `lockd members [--json]` (the cluster's members as the
// answering node sees them) and `lockd members remove ID`.
type MembersCommand struct {
	env commandEnv
}

// membersFlags is a parsed `lockd members` command line.
type membersFlags struct {
	client clientFlags
	json   bool
	remove string // the node to remove; "" lists the members
}

func (c *MembersCommand) parse(args []string) (*membersFlags, error) {
	f := &membersFlags{}
	fs := newFlagSet("members", c.env.stderr)
	f.client.register(fs, c.env.getenv)
	f.client.registerTimeout(fs)
	fs.BoolVar(&f.json, "json", false, "print JSON: leader, clusterId and members (id, api, raft, role, voter) in the API's mapping")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return nil, err
	}
	switch {
	case len(pos) == 0:
		return f, nil
	case pos[0] == "remove":
		if err := wantArgs(pos, 2, 2, "lockd members remove ID"); err != nil {
			return nil, err
		}
		if f.remove = strings.TrimSpace(pos[1]); f.remove == "" {
			return nil, usageError{errors.New("usage: lockd members remove ID: the node id must not be empty")}
		}
		if f.json {
			return nil, usageError{errors.New("--json applies to listing the members, not to remove")}
		}
		return f, nil
	}
	return nil, usageError{fmt.Errorf("unknown argument %q; usage: %s", pos[0], membersUsage)}
}

// Run lists the members, or removes one.
func (c *MembersCommand) Run(ctx context.Context, args []string) error {
	f, err := c.parse(args)
	if err != nil {
		return err
	}
	ctx, cancel := f.client.withTimeout(ctx)
	defer cancel()
	cl, err := f.client.client()
	if err != nil {
		return err
	}
	defer cl.Close()
	st, err := cl.Service().Status(ctx, connect.NewRequest(&lockdv1.StatusRequest{}))
	if err != nil {
		return callError("status", err)
	}
	s := st.Msg
	if f.remove == "" {
		if f.json {
			return printMembersJSON(c.env, s)
		}
		return printMembers(c.env, s)
	}

	// Removing a node that is not a member would succeed silently (Raft
	// ignores it): say so instead, as a typo is the likely cause.
	if !isMember(s, f.remove) {
		return exitWith(exitUsage, fmt.Errorf("remove member %q: not a member of cluster %s (members: %s)", f.remove, s.GetClusterId(), memberIDs(s)))
	}
	if f.remove == s.GetLeader() {
		return exitWith(exitUsage, fmt.Errorf("remove member %q: it is the leader; move leadership first (lockd leader transfer), then remove it", f.remove))
	}
	// RemoveMember is idempotent, so an unknown outcome may be retried.
	_, err = clusterCall(ctx, &f.client, cl.ClusterID(), true,
		func(ctx context.Context, cc lockdv1connect.ClusterServiceClient) (*connect.Response[lockdv1.RemoveMemberResponse], error) {
			return cc.RemoveMember(ctx, connect.NewRequest(&lockdv1.RemoveMemberRequest{NodeId: f.remove}))
		})
	if err != nil {
		return clusterError(fmt.Sprintf("remove member %q", f.remove), err)
	}
	fmt.Fprintf(c.env.stdout, "removed member %s\n", f.remove)
	return nil
}

func isMember(s *lockdv1.StatusResponse, id string) bool {
	for _, m := range s.GetMembers() {
		if m.GetId() == id {
			return true
		}
	}
	return false
}

func memberIDs(s *lockdv1.StatusResponse) string {
	var ids []string
	for _, m := range s.GetMembers() {
		ids = append(ids, m.GetId())
	}
	if len(ids) == 0 {
		return "none known"
	}
	return strings.Join(ids, ", ")
}

func printMembers(env commandEnv, s *lockdv1.StatusResponse) error {
	tw := tabwriter.NewWriter(env.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tROLE\tVOTER\tAPI\tRAFT")
	for _, m := range s.GetMembers() {
		voter := "no"
		if m.GetVoter() {
			voter = "yes"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", m.GetId(), m.GetRole(), voter, m.GetApi(), m.GetRaft())
	}
	return tw.Flush()
}

// printMembersJSON prints {"clusterId", "leader", "members"} with every
// field present ("leader": "" when there is none, "voter": false), members
// in the API's JSON mapping.
func printMembersJSON(env commandEnv, s *lockdv1.StatusResponse) error {
	mo := protojson.MarshalOptions{EmitUnpopulated: true}
	members := make([]json.RawMessage, 0, len(s.GetMembers()))
	for _, m := range s.GetMembers() {
		b, err := mo.Marshal(m)
		if err != nil {
			return err
		}
		members = append(members, b)
	}
	b, err := json.Marshal(struct {
		ClusterID string            `json:"clusterId"`
		Leader    string            `json:"leader"`
		Members   []json.RawMessage `json:"members"`
	}{s.GetClusterId(), s.GetLeader(), members})
	if err != nil {
		return err
	}
	var out bytes.Buffer
	if err := json.Indent(&out, b, "", "  "); err != nil {
		return err
	}
	out.WriteByte('\n')
	_, err = out.WriteTo(env.stdout)
	return err
}

// endpointURLs returns the --endpoints as URLs, in order ("host:port" and
// "host" become http:// URLs, port 7070 by default, as in the Go client).
func endpointURLs(endpoints string) []string {
	var out []string
	for _, e := range strings.Split(endpoints, ",") {
		if e = strings.TrimSpace(e); e == "" {
			continue
		}
		if !strings.Contains(e, "://") {
			host, rest := e, ""
			if i := strings.IndexByte(e, '/'); i >= 0 {
				host, rest = e[:i], e[i:]
			}
			if _, _, err := net.SplitHostPort(host); err != nil {
				host = net.JoinHostPort(strings.Trim(host, "[]"), "7070")
			}
			e = "http://" + host + rest
		}
		out = append(out, strings.TrimRight(e, "/"))
	}
	return out
}

// clusterAttemptTimeout bounds one ClusterService attempt, so one hung
// endpoint does not use up the whole --timeout.
const clusterAttemptTimeout = 5 * time.Second

// clusterCall makes one ClusterService call through the first endpoint that
// answers: any member does, as followers forward to the leader. It moves to
// the next endpoint when one is unreachable, answers for another cluster
// than clusterID (when known), has no leader, or is not the leader and cannot
// forward; it goes round the endpoints with backoff and full jitter until
// ctx ends. An unknown outcome (the leader failed mid-call) is retried only
// when idempotent.
func clusterCall[Res any](ctx context.Context, cf *clientFlags, clusterID string, idempotent bool,
	call func(context.Context, lockdv1connect.ClusterServiceClient) (*connect.Response[Res], error),
) (*connect.Response[Res], error) {
	urls := endpointURLs(cf.endpoints)
	if len(urls) == 0 {
		return nil, usageError{errors.New("--endpoints: no endpoint given")}
	}
	hc := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	defer hc.CloseIdleConnections()
	var last error
	for attempt := 0; ; attempt++ {
		for _, u := range urls {
			actx, cancel := context.WithTimeout(ctx, clusterAttemptTimeout)
			resp, err := call(actx, lockdv1connect.NewClusterServiceClient(hc, u))
			cancel()
			if err == nil {
				if id := resp.Header().Get(clusterIDHeader); clusterID != "" && id != "" && id != clusterID {
					// Too late to undo, but say it: the user named an endpoint
					// of another cluster.
					return nil, fmt.Errorf("%s answered for cluster %s, not %s (the one the other endpoints belong to)", u, id, clusterID)
				}
				return resp, nil
			}
			if ctx.Err() != nil {
				return nil, errors.Join(ctx.Err(), last, err)
			}
			var ce *connect.Error
			if errors.As(err, &ce) {
				if id := ce.Meta().Get(clusterIDHeader); clusterID != "" && id != "" && id != clusterID {
					last = fmt.Errorf("%s: answered for cluster %s, not %s", u, id, clusterID)
					continue
				}
			}
			if !retryCluster(err, idempotent) {
				return nil, err
			}
			last = fmt.Errorf("%s: %w", u, err)
		}
		d := min(50*time.Millisecond<<min(attempt, 6), 2*time.Second)
		select {
		case <-ctx.Done():
			return nil, errors.Join(ctx.Err(), last)
		case <-time.After(rand.N(d + 1)):
		}
	}
}

// clusterIDHeader is the response header with the cluster's id (the
// server's ClusterIDHeader).
const clusterIDHeader = "Lockd-Cluster-Id"

// retryCluster reports whether a failed ClusterService attempt may go to
// another endpoint.
func retryCluster(err error, idempotent bool) bool {
	if errors.Is(err, context.Canceled) {
		return false
	}
	if d := clusterErrorDetail(err); d != nil {
		switch d.GetReason() {
		case lockdv1.ErrorReason_ERROR_REASON_NOT_LEADER, lockdv1.ErrorReason_ERROR_REASON_NO_LEADER:
			return true // not taken
		case lockdv1.ErrorReason_ERROR_REASON_OUTCOME_UNKNOWN:
			return idempotent
		}
		return false
	}
	switch connect.CodeOf(err) {
	case connect.CodeUnavailable, connect.CodeUnknown, connect.CodeDeadlineExceeded:
		return idempotent || errors.Is(err, syscall.ECONNREFUSED) || isDialError(err)
	}
	return false
}

func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

func clusterErrorDetail(err error) *lockdv1.ErrorDetail {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return nil
	}
	for _, d := range ce.Details() {
		if v, err := d.Value(); err == nil {
			if ed, ok := v.(*lockdv1.ErrorDetail); ok {
				return ed
			}
		}
	}
	return nil
}

// clusterError maps the error of a ClusterService call to the documented
// exit statuses.
func clusterError(what string, err error) error {
	var ue usageError
	if errors.As(err, &ue) {
		return err
	}
	werr := fmt.Errorf("%s: %w", what, err)
	switch {
	case errors.Is(err, context.Canceled):
		return exitWith(exitFailure, fmt.Errorf("%s: interrupted", what))
	case errors.Is(err, context.DeadlineExceeded):
		return exitWith(exitUnavailable, werr)
	}
	if d := clusterErrorDetail(err); d != nil && d.GetReason() == lockdv1.ErrorReason_ERROR_REASON_OUTCOME_UNKNOWN {
		return exitWith(exitUnavailable, fmt.Errorf("%w (outcome unknown: check lockd members)", werr))
	}
	switch connect.CodeOf(err) {
	case connect.CodeInvalidArgument:
		return exitWith(exitUsage, werr)
	case connect.CodeUnavailable, connect.CodeDeadlineExceeded:
		return exitWith(exitUnavailable, werr)
	}
	return exitWith(exitFailure, werr)
}

// leaderOf polls Status through cl until it names a leader other than not
// (any leader when not is ""), or ctx ends; it returns "" then.
func leaderOf(ctx context.Context, cl *lockd.Client, not string) string {
	for attempt := 0; ; attempt++ {
		st, err := cl.Service().Status(ctx, connect.NewRequest(&lockdv1.StatusRequest{}))
		if err == nil && st.Msg.GetLeader() != "" && st.Msg.GetLeader() != not {
			return st.Msg.GetLeader()
		}
		select {
		case <-ctx.Done():
			return ""
		case <-time.After(min(20*time.Millisecond<<min(attempt, 4), 250*time.Millisecond)):
		}
	}
}
