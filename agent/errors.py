"""Errors the command line turns into one line on stderr (own module: `python -m` runs cli.py as __main__)."""


class UsageError(Exception):
    """Bad input from the user: one line on stderr, exit code 2."""
