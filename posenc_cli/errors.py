"""The one exception type that means "the user asked for something impossible".

The CLI turns it into a single line on stderr and exit status 2; everything else is a bug
and keeps its traceback.
"""


class UsageError(ValueError):
    """Bad input: the message names the problem and the fix, in one line."""
