"""Errors the command line (agent/cli/) turns into one line on stderr; every command imports them through
agent/cli/common.py."""


class UsageError(Exception):
    """Bad input from the user: one line on stderr, exit code 2."""
