#!/usr/bin/env bash
# Installs what icecdc needs on this machine, and nothing when it is already there.
#   - Java 17 and the SQLite JDBC driver from Debian (when missing and run as root; otherwise it
#     says what to install);
#   - the PostgreSQL JDBC driver from Debian, for a JDBC catalog on PostgreSQL (Spark's JDBC
#     catalog finds it in /usr/share/java; when missing and run as root; otherwise it says so and
#     goes on: only that catalog needs it);
#   - PostgreSQL's server from Debian, for the real Debezium source (icecdc/testbed/; when missing
#     and run as root; otherwise it says so and goes on: only that source needs it);
#   - a virtualenv (the active one, $VIRTUAL_ENV, or ./.venv) with icecdc (psycopg among its
#     dependencies, pyiceberg's driver for a catalog on PostgreSQL), its test deps, the
#     benchmarks' plotting library (the suite runs the benchmarks' smoke tests) and the postgres
#     extra (the Debezium engine, a 200 MB wheel), reinstalled only when pyproject.toml or this
#     script changed since the last install.
# Idempotent: a second run prints "setup: up to date" and touches nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${VENV:-${VIRTUAL_ENV:-.venv}}"
PYTHON="${PYTHON:-python3}"
changed=0

say() { echo "setup: $*"; }

apt_install() {
  if [ "$(id -u)" -ne 0 ]; then
    say "missing: $1. Install it (as root: apt-get install -y $2) and run this again." >&2
    exit 1
  fi
  say "installing $2 with apt-get"
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null 2>&1; then
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
  fi
  changed=1
}

# What only one optional part needs: installed when run as root, otherwise named, and the set-up goes on.
apt_install_for() {
  if [ "$(id -u)" -eq 0 ]; then
    apt_install "$1" "$2"
  else
    say "note: missing $1 (as root: apt-get install -y $2); only $3 needs it" >&2
  fi
}

java_major() {
  java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1
}

if ! command -v java >/dev/null 2>&1 || [ "$(java_major)" -lt 17 ]; then
  apt_install "Java 17 (Spark 3.5 runs on it)" openjdk-17-jre-headless
fi
if [ ! -f /usr/share/java/sqlite-jdbc.jar ]; then
  apt_install "the SQLite JDBC driver (/usr/share/java/sqlite-jdbc.jar) for the embedded catalog" libxerial-sqlite-jdbc-java
fi
if [ ! -f /usr/share/java/postgresql.jar ]; then
  apt_install_for "the PostgreSQL JDBC driver (/usr/share/java/postgresql.jar)" libpostgresql-jdbc-java "a JDBC catalog on PostgreSQL"
fi

# Debian keeps initdb and pg_ctl in /usr/lib/postgresql/<major>/bin, off PATH.
postgres_server_present() {
  { [ -n "${ICECDC_PG_BINDIR:-}" ] && [ -x "$ICECDC_PG_BINDIR/initdb" ]; } ||
    command -v initdb >/dev/null 2>&1 ||
    compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null
}
if ! postgres_server_present; then
  apt_install_for "PostgreSQL's server (initdb, pg_ctl)" postgresql "the real Debezium source"
fi

if [ ! -x "$VENV/bin/python" ]; then
  if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
    say "Python 3.10 or newer is needed ($PYTHON is $("$PYTHON" --version 2>&1))" >&2
    exit 1
  fi
  say "creating virtualenv $VENV"
  "$PYTHON" -m venv "$VENV"
  changed=1
fi

stamp="$VENV/.icecdc-setup"
want="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1) $(pwd)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  say "installing icecdc and its dependencies into $VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e '.[test,bench,postgres]'
  echo "$want" > "$stamp"
  changed=1
fi

if [ "$changed" -eq 0 ]; then
  say "up to date ($VENV)"
else
  say "done ($VENV)"
fi
