"""Errors a user can cause. The CLI and server print ``str(err)`` as one line, never a traceback."""


class SpecDecodeError(Exception):
    """Base class: a problem with the user's input (file, model name, option, prompt)."""


class ModelFileError(SpecDecodeError):
    """A checkpoint file is missing, truncated, corrupt, or of an unsupported kind."""


class UnsupportedModelError(SpecDecodeError):
    """The architecture or a tensor type is not supported."""


class InvalidRequestError(SpecDecodeError):
    """Invalid sampling values, an over-long prompt, or similar per-request problems."""


class OutOfMemoryBudgetError(SpecDecodeError):
    """A request or cache does not fit the configured memory budget."""
