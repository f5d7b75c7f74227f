"""The infrastructure every stage shares: the configuration and its schema, errors that name the
file and line, atomic file writing, the machine's hardware, run tracking, failpoints, OpenMP's
wait policy and the composition of ``conf/`` into ``params.yaml``."""
