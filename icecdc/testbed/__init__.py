"""Real change sources for the demo and the tests: a throwaway PostgreSQL cluster
(:mod:`icecdc.testbed.postgres`) and the Debezium PostgreSQL connector in its own process,
producing to Kafka as Kafka Connect would (:mod:`icecdc.testbed.connector`).

Plumbing for the commands (the demo) and the tests only: the ingester and the compactor read
Kafka topics and never know where the changes came from. Needs the ``postgres`` extra
(``pip install 'icecdc[postgres]'``, which scripts/setup.sh installs) and PostgreSQL's server
binaries (Debian's ``postgresql`` package).
"""
