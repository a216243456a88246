"""What a caller can get wrong, as domain errors: the doors map them (HTTP 400 with OpenAI's error body,
the CLI's one line and exit status, a ValueError in Python), and nothing below the doors knows HTTP.
"""

from __future__ import annotations


class InputError(ValueError):
    """Input that cannot be served: bad audio, text, tokens or an option. The message is one line;
    ``param`` names the input it is about (an HTTP form field, which is also the Python argument and,
    with dashes, the CLI option), None when it is no single input."""

    default_param: str | None = None

    def __init__(self, message: str, param: str | None = None):
        super().__init__(" ".join(str(message).split()))
        self.param = param if param is not None else self.default_param


class OptionError(InputError):
    """An option out of its range or of the wrong kind (``param``: the option's name)."""


class AlignmentInputError(InputError):
    """Text or token ids that cannot be aligned (too long, out of vocabulary, empty), or audio that
    forced alignment cannot take; ``param`` says which, where the raiser knows."""


class NoCaptureError(InputError):
    """Word timestamps asked of an engine that captures no alignment heads (not a Whisper model, or
    tensor parallelism)."""

    default_param = "model"
