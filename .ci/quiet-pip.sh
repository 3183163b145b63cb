# Sourced by .ci/run and .ci/engines: quiet_pip COMMAND... runs a pip command without the runner's
# "Location ... is ignored" lines (one per package, hundreds a step: they pushed the step times out of the
# visible log); the command's own exit status is kept (the callers set pipefail).
quiet_pip() { "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }; }
