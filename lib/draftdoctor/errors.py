"""The base of every error a user can act on: the CLI prints it on one line and exits 2.

Kept in its own module so the CLI can catch them all without importing the modules that raise them.
"""


class UserError(Exception):
    """Unusable input, arguments or environment, explained in one message."""
