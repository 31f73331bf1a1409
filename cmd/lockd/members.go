package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/internal/endpoint"
	"github.com/lockd-dev/lockd/internal/retry"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

const membersUsage = "lockd members [--json] | lockd members remove ID"

// MembersCommand is `lockd members [--json]` (the cluster's members as the
// answering node sees them, a member that does not answer its probe shown
// as unreachable) and `lockd members remove ID`.
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
	fs.BoolVar(&f.json, "json", false, "print JSON: leader, clusterId and members (id, api, raft, role, voter) in the API's mapping; role is \"unreachable\" for a member that does not answer")
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
	ctx, cl, done, err := f.client.connect(ctx)
	if err != nil {
		return err
	}
	defer done()
	st, err := cl.Service().Status(ctx, connect.NewRequest(&lockdv1.StatusRequest{}))
	if err != nil {
		return callError("status", err)
	}
	s := st.Msg
	if f.remove == "" {
		// A member that does not answer shows as unreachable, whatever
		// role the Raft configuration last gave it.
		down, err := f.client.unreachableMembers(ctx)
		if err != nil {
			fmt.Fprintf(c.env.stderr, "lockd: warning: members' health unknown: %s\n", oneLine(err))
		}
		for _, m := range s.GetMembers() {
			if down[m.GetId()] {
				m.Role = "unreachable"
			}
		}
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
	_, err = cl.ClusterService().RemoveMember(ctx, connect.NewRequest(&lockdv1.RemoveMemberRequest{NodeId: f.remove}))
	if err != nil {
		return callError(fmt.Sprintf("remove member %q", f.remove), err)
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", printable(m.GetId()), printable(m.GetRole()), voter, printable(m.GetApi()), printable(m.GetRaft()))
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
	return writeIndented(env.stdout, b)
}

// leaderOf polls Status through cl until it names a leader other than not
// (any leader when not is ""), or ctx ends; it returns "" then.
func leaderOf(ctx context.Context, cl *lockd.Client, not string) string {
	r := retry.New(ctx, retry.Backoff{Base: 20 * time.Millisecond, Cap: 250 * time.Millisecond})
	for r.Next() {
		st, err := cl.Service().Status(ctx, connect.NewRequest(&lockdv1.StatusRequest{}))
		if err == nil && st.Msg.GetLeader() != "" && st.Msg.GetLeader() != not {
			return st.Msg.GetLeader()
		}
	}
	return ""
}

// healthTimeout bounds one request for the members' health: the node
// probes each member within a second.
const healthTimeout = 3 * time.Second

// unreachableMembers asks the first endpoint that answers for its members'
// health (GET /ui/api/health: the node probes every member's /readyz, the
// dashboard's probe) and returns the ids of the members that did not
// answer at all.
func (f *clientFlags) unreachableMembers(ctx context.Context) (map[string]bool, error) {
	hc := &http.Client{Timeout: healthTimeout}
	scheme := "http"
	if f.tlsOn() {
		tc, err := f.tlsConfig()
		if err != nil {
			return nil, err
		}
		hc.Transport = &http.Transport{TLSClientConfig: tc}
		scheme = "https"
	}
	token := ""
	if f.tokenFile != "" {
		b, err := os.ReadFile(f.tokenFile)
		if err != nil {
			return nil, err
		}
		line, _, _ := strings.Cut(string(b), "\n")
		token = strings.TrimSpace(line)
	}
	var errs []error
	for _, raw := range strings.Split(f.endpoints, ",") {
		if raw = strings.TrimSpace(raw); raw == "" {
			continue
		}
		u, err := endpoint.NormalizeScheme(raw, scheme)
		if err != nil {
			return nil, err
		}
		down, err := memberHealth(ctx, hc, u, token)
		if err == nil {
			return down, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

// memberHealth reads one node's /ui/api/health.
func memberHealth(ctx context.Context, hc *http.Client, url, token string) (map[string]bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/ui/api/health", nil)
	if err != nil {
		return nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s/ui/api/health: %s", url, resp.Status)
	}
	var health []struct {
		ID        string `json:"id"`
		Reachable *bool  `json:"reachable"` // absent from older servers: unknown
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&health); err != nil {
		return nil, fmt.Errorf("%s/ui/api/health: %w", url, err)
	}
	down := map[string]bool{}
	for _, h := range health {
		if h.Reachable != nil && !*h.Reachable {
			down[h.ID] = true
		}
	}
	return down, nil
}
