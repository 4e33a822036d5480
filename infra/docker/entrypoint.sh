#!/bin/sh
# tock's container entrypoint: the first argument picks the process type. Each branch
# `exec`s, so Python replaces this shell as PID 1 and receives the runtime's SIGTERM
# directly (graceful shutdown: stop receiving, finish within the grace, release the rest).
set -eu

usage() {
    cat <<'USAGE'
usage: <image> PROCESS [ARGS...]

  timer                        python -m timer_service (run 2+ replicas, no leader)
  consumer --tasks MODULE ...  python -m consumer (MODULE holds your @task handlers)
  dashboard                    python -m dashboard (listens on TOCK_DASHBOARD_PORT, 8080)
  migrate                      tock migrate (apply database migrations, then exit)
  tock ARGS...                 any other `tock` command
  python ARGS...               a one-off Python command (e.g. python -m demo.producer)

Settings come from TOCK_* environment variables (see README, "Configuration").
USAGE
}

if [ "$#" -eq 0 ]; then
    usage
    exit 2
fi

process="$1"
shift
case "$process" in
    timer) exec python -m timer_service "$@" ;;
    consumer) exec python -m consumer "$@" ;;
    dashboard) exec python -m dashboard "$@" ;;
    migrate) exec tock migrate "$@" ;;
    tock) exec tock "$@" ;;
    python) exec python "$@" ;;
    help | -h | --help)
        usage
        exit 0
        ;;
    *)
        echo "tock-entrypoint: unknown process type '$process'" >&2
        usage >&2
        exit 2
        ;;
esac
