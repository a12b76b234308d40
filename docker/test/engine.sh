#!/usr/bin/env bash
# A private Docker engine from Debian packages, for machines without Docker Hub (as root).
#
#   docker/test/engine.sh start   # install docker.io + compose v2, start dockerd; prints env
#   docker/test/engine.sh stop    # stop that dockerd, restore iptables and ip_forward
#   docker/test/engine.sh status  # exit 0 when that dockerd answers
#   eval "$(docker/test/engine.sh env)"   # DOCKER_HOST, DOCKER_CONFIG, DOCKER_BUILDKIT, PATH
#
# Everything lives under MGRPO_DEPLOY_CACHE (default /var/cache/mgrpo-deploy), outside any
# checkout, so images and the build cache survive between runs: the data root (data/), the
# compose plugin (config/cli-plugins/), the daemon's socket, pid and log (run/).
# docker compose v2 is not packaged for bookworm: trixie's docker-compose .deb (only needs
# libc6 >= 2.34) is fetched with apt through a private sources list; the system's apt sources
# and package state are not touched. The docker CLI is Debian's (/usr/bin/docker, 20.10),
# whose built-in BuildKit client needs no buildx plugin.
#
# What it does not do: configure a registry mirror, or run without root.
set -euo pipefail

CACHE=${MGRPO_DEPLOY_CACHE:-/var/cache/mgrpo-deploy}
RUN=$CACHE/run
SOCK=$RUN/docker.sock
PIDFILE=$RUN/dockerd.pid
DOCKER=/usr/bin/docker
MIRROR=${MGRPO_DEBIAN_MIRROR:-http://deb.debian.org/debian}
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg

log() { echo "engine: $*" >&2; }

print_env() {
  echo "export DOCKER_HOST=unix://$SOCK DOCKER_CONFIG=$CACHE/config DOCKER_BUILDKIT=1"
  echo "export PATH=/usr/bin:\$PATH"
}

install_packages() {
  if [ -x "$DOCKER" ] && command -v dockerd >/dev/null && command -v debootstrap >/dev/null; then
    return
  fi
  log "installing docker.io and debootstrap (Debian packages)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    docker.io debootstrap ca-certificates xz-utils iptables >/dev/null
}

install_compose() {
  local plugins=$CACHE/config/cli-plugins
  [ -x "$plugins/docker-compose" ] && return
  log "fetching docker compose v2 (Debian trixie's docker-compose .deb)"
  local apt_dir=$CACHE/apt-trixie
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$plugins"
  echo "deb [signed-by=$KEYRING] $MIRROR trixie main" > "$apt_dir/sources.list"
  local opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
              -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache"
              -o Dir::State::status=/dev/null)
  opts+=(-o APT::Sandbox::User=root)
  apt-get -qq "${opts[@]}" update
  (cd "$apt_dir" && apt-get -qq "${opts[@]}" download docker-compose)
  rm -rf "$apt_dir/x" && dpkg -x "$apt_dir"/docker-compose_*.deb "$apt_dir/x"
  cp "$apt_dir/x/usr/libexec/docker/cli-plugins/docker-compose" "$plugins/"
}

running() { [ -S "$SOCK" ] && DOCKER_HOST=unix://$SOCK "$DOCKER" info >/dev/null 2>&1; }

start() {
  install_packages
  install_compose
  mkdir -p "$RUN" "$CACHE/data"
  if running; then log "dockerd already running ($SOCK)"; print_env; return; fi
  # The host settings dockerd changes, restored by `stop`.
  iptables-save > "$RUN/iptables.before"
  sysctl -n net.ipv4.ip_forward > "$RUN/ip_forward.before"
  log "starting dockerd (data root $CACHE/data)"
  setsid dockerd --data-root "$CACHE/data" --exec-root "$RUN/exec" --pidfile "$PIDFILE" \
    -H "unix://$SOCK" --storage-driver=overlay2 --bridge=none \
    > "$RUN/dockerd.log" 2>&1 < /dev/null &
  for _ in $(seq 60); do running && { print_env; return; }; sleep 1; done
  log "dockerd did not answer in 60 s; its log:"; tail -20 "$RUN/dockerd.log" >&2; exit 1
}

stop() {
  if [ -f "$PIDFILE" ]; then
    local pid; pid=$(cat "$PIDFILE")
    log "stopping dockerd (pid $pid)"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  fi
  rm -f "$PIDFILE"
  if [ -f "$RUN/iptables.before" ]; then
    # dockerd's chains and rules go (also from tables the snapshot does not hold, which
    # iptables-restore would leave alone), then the snapshot's rules come back.
    for table in filter nat; do
      iptables -t "$table" -F && iptables -t "$table" -X
    done
    iptables -P FORWARD ACCEPT
    iptables-restore < "$RUN/iptables.before" && rm -f "$RUN/iptables.before"
  fi
  if [ -f "$RUN/ip_forward.before" ]; then
    sysctl -qw net.ipv4.ip_forward="$(cat "$RUN/ip_forward.before")" && rm -f "$RUN/ip_forward.before"
  fi
  # Bridges of compose networks a killed daemon left behind.
  for link in $(ip -o link show type bridge 2>/dev/null | awk -F': ' '/ br-/{print $2}'); do
    ip link delete "${link%@*}" 2>/dev/null || true
  done
  umount "$RUN/exec/netns/"* 2>/dev/null || true
}

case "${1:-}" in
  status) running ;;
  start) start ;;
  stop) stop ;;
  env) print_env ;;
  *) echo "usage: $0 start|stop|status|env" >&2; exit 2 ;;
esac
