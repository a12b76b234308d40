#!/bin/sh
# The default user from RABBITMQ_DEFAULT_USER/PASS (as the official image), logs to stdout,
# then exec the server script: it traps SIGTERM and stops the node cleanly.
set -eu
cat > /etc/rabbitmq/conf.d/10-defaults.conf <<CONF
default_user = ${RABBITMQ_DEFAULT_USER:-guest}
default_pass = ${RABBITMQ_DEFAULT_PASS:-guest}
loopback_users = none
log.console = true
log.console.level = info
log.file = false
CONF
exec /usr/lib/rabbitmq/bin/rabbitmq-server
