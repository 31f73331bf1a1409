#!/bin/sh
# start.sh: how a lockd pod of the StatefulSet starts (POSIX sh, runs under
# busybox sh or any /bin/sh). It decides between resuming, bootstrapping
# and joining, then execs `lockd serve`:
#
#  - data dir with state (a node-id file): resume; lockd ignores --join.
#  - empty data dir, ordinal > 0: join through every other member.
#  - empty data dir, ordinal 0: if any other member answers, a cluster
#    exists and this pod lost its disk: join it. Otherwise (first install)
#    bootstrap a new one-node cluster that the others join.
#
# Environment (set by the chart; the tests set the same names):
#   POD_NAME            this pod's name, <sts>-<ordinal> (downward API)
#   LOCKD_STS           the StatefulSet's name
#   LOCKD_REPLICAS      number of pods
#   LOCKD_DOMAIN        headless service domain: <svc>.<ns>.svc.<cluster-domain>
#   LOCKD_API_PORT, LOCKD_RAFT_PORT
#   LOCKD_SCHEME        http or https
#   LOCKD_DATA_DIR      the data dir (the PVC's mount)
#   LOCKD_BIN           the lockd binary (default: lockd on PATH)
#   LOCKD_LISTEN, LOCKD_RAFT_LISTEN  listen addresses (default 0.0.0.0:port)
#   LOCKD_PEERS         optional resolver: one "api-host:port,raft-host:port"
#                       per ordinal, space-separated, instead of the DNS
#                       names <sts>-<i>.<domain> (the tests map pods to
#                       127.0.0.1 ports this way)
#   LOCKD_PROBE_ARGS    extra flags for the `lockd members` probe (TLS, token)
# Arguments are passed on to `lockd serve` (TLS, auth, tuning flags).
set -eu

: "${POD_NAME:?POD_NAME must be set (downward API metadata.name)}"
: "${LOCKD_STS:?}" "${LOCKD_REPLICAS:?}" "${LOCKD_DATA_DIR:?}"
LOCKD_BIN="${LOCKD_BIN:-lockd}"
LOCKD_SCHEME="${LOCKD_SCHEME:-http}"
LOCKD_API_PORT="${LOCKD_API_PORT:-7070}"
LOCKD_RAFT_PORT="${LOCKD_RAFT_PORT:-7071}"

ordinal="${POD_NAME##*-}"
case "$ordinal" in
'' | *[!0-9]*)
	echo "start.sh: pod name $POD_NAME does not end in -<ordinal>" >&2
	exit 64
	;;
esac
if [ "${POD_NAME%-*}" != "$LOCKD_STS" ]; then
	echo "start.sh: pod name $POD_NAME is not $LOCKD_STS-<ordinal>" >&2
	exit 64
fi

# addr ORDINAL FIELD: FIELD 1 is the API host:port, 2 the Raft host:port.
addr() {
	if [ -n "${LOCKD_PEERS:-}" ]; then
		# shellcheck disable=SC2086 # split on spaces on purpose
		set -- "$1" "$2" $LOCKD_PEERS
		_n="$1" _f="$2"
		shift 2
		while [ "$_n" -gt 0 ] && [ "$#" -gt 0 ]; do
			shift
			_n=$((_n - 1))
		done
		[ "$#" -gt 0 ] && echo "$1" | cut -d, -f"$_f"
	elif [ "$2" = 1 ]; then
		echo "$LOCKD_STS-$1.${LOCKD_DOMAIN:?}:$LOCKD_API_PORT"
	else
		echo "$LOCKD_STS-$1.${LOCKD_DOMAIN:?}:$LOCKD_RAFT_PORT"
	fi
}

self_api="$(addr "$ordinal" 1)"
self_raft="$(addr "$ordinal" 2)"
if [ -z "$self_api" ] || [ -z "$self_raft" ]; then
	echo "start.sh: no address for ordinal $ordinal" >&2
	exit 64
fi
others=""
i=0
while [ "$i" -lt "$LOCKD_REPLICAS" ]; do
	if [ "$i" != "$ordinal" ]; then
		a="$(addr "$i" 1)"
		[ -n "$a" ] || {
			echo "start.sh: no address for ordinal $i" >&2
			exit 64
		}
		others="${others:+$others,}$LOCKD_SCHEME://$a"
	fi
	i=$((i + 1))
done

set -- serve \
	--node-id "$POD_NAME" \
	--data-dir "$LOCKD_DATA_DIR" \
	--listen "${LOCKD_LISTEN:-0.0.0.0:$LOCKD_API_PORT}" \
	--raft-listen "${LOCKD_RAFT_LISTEN:-0.0.0.0:$LOCKD_RAFT_PORT}" \
	--advertise "$LOCKD_SCHEME://$self_api" \
	--raft-advertise "$self_raft" \
	"$@"

if [ -s "$LOCKD_DATA_DIR/node-id" ]; then
	echo "start.sh: $POD_NAME resumes from $LOCKD_DATA_DIR" >&2
	exec "$LOCKD_BIN" "$@"
fi
if [ -z "$others" ]; then
	echo "start.sh: $POD_NAME bootstraps a one-node cluster" >&2
	exec "$LOCKD_BIN" "$@"
fi
if [ "$ordinal" = 0 ]; then
	# Exit 69: no member answered at all. Any other status (0, or an
	# answer refusing the probe) means a cluster is running.
	rc=0
	# shellcheck disable=SC2086 # LOCKD_PROBE_ARGS holds several flags
	"$LOCKD_BIN" members --endpoints "$others" --connect-timeout "${LOCKD_PROBE_TIMEOUT:-3s}" \
		${LOCKD_PROBE_ARGS:-} >/dev/null 2>&1 || rc=$?
	if [ "$rc" = 69 ]; then
		echo "start.sh: $POD_NAME bootstraps a new cluster (no other member answers)" >&2
		exec "$LOCKD_BIN" "$@"
	fi
	echo "start.sh: $POD_NAME has an empty data dir and a cluster answers: joining it" >&2
fi
echo "start.sh: $POD_NAME joins via $others" >&2
exec "$LOCKD_BIN" "$@" --join "$others"
