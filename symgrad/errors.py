"""The one exception type for bad user input."""

from __future__ import annotations


class SymgradError(ValueError):
    """A user-input error.

    The message is one line, ready for ``symgrad: error: ...``. For syntax errors
    ``caret`` holds the expression with a caret under the offending column, which the
    CLI prints below the message.

    >>> from symgrad import generate_source
    >>> try:
    ...     generate_source("x**", "Broken")
    ... except SymgradError as error:
    ...     print(error)
    ...     print(error.caret)
    invalid syntax at column 4: the expression ends too early (an operand is missing)
        x**
           ^

    It is a ``ValueError``, so code that already catches bad values catches it too.
    """

    def __init__(self, message: str, *, caret: str | None = None) -> None:
        # The CLI contract is one line per error, so flatten newlines here, once,
        # instead of trusting every raise site.
        super().__init__(" ".join(message.split()))
        self.caret = caret


class SymgradWarning(UserWarning):
    """Something generated that works, but not as well as it might: a given ``--domain`` on
    which the values or gradients are large, for example. The ``symgrad`` command prints it as
    one line, ``symgrad: warning: ...``, on stderr."""
