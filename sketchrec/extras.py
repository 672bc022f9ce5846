"""The optional parts of the install, as data: which extra (``pip install 'sketchrec[EXTRA]'``)
brings which libraries, and the one line a command prints when a feature's extra is missing.

The core install (``pip install sketchrec``) holds the learners, ``replay`` and the CLI; Kafka,
the HTTP service and the DP accountant are extras, imported only where their feature runs. A
command that reaches a missing one stops with ``MissingExtra`` (exit 2, one line, no traceback):
``needs`` checks up front, and ``from_import_error`` turns an ``ImportError`` raised deeper into
the same line.

>>> print(MissingExtra("consume", "kafka"))
consume needs the kafka extra: pip install 'sketchrec[kafka]'
>>> extra_of("fastapi"), extra_of("numpy")
('serve', None)
"""

from __future__ import annotations

from importlib.util import find_spec

# extra -> the top-level modules it installs (pyproject.toml's optional dependencies)
EXTRAS: dict[str, tuple[str, ...]] = {
    "kafka": ("kafka",),
    "serve": ("fastapi", "starlette", "pydantic", "uvicorn", "prometheus_client", "orjson", "httptools"),
    "dp": ("dp_accounting", "absl"),
}


class MissingExtra(ImportError):
    """A feature whose extra is not installed: its message is the one line a command prints.

    Parameters
    ----------
    feature : what the user asked for ("consume", "--serve", "a DP run").
    extra : the extra that brings it (a key of ``EXTRAS``).

    Examples
    --------
    >>> MissingExtra("--serve", "serve").extra
    'serve'
    """

    def __init__(self, feature: str, extra: str):
        self.feature, self.extra = feature, extra
        super().__init__(f"{feature} needs the {extra} extra: pip install 'sketchrec[{extra}]'")


def extra_of(module: str | None) -> str | None:
    """The extra that installs a (dotted) module, or None for the core's and unknown ones."""
    top = (module or "").split(".")[0]
    return next((extra for extra, modules in EXTRAS.items() if top in modules), None)


def installed(extra: str) -> bool:
    """Whether every library of ``extra`` can be imported (without importing it)."""
    try:
        return all(find_spec(module) is not None for module in EXTRAS[extra])
    except (ImportError, ValueError):   # a blocked or half-installed package
        return False


def needs(feature: str, *extras: str) -> None:
    """MissingExtra for the first of ``extras`` that is not installed (before any work starts)."""
    for extra in extras:
        if not installed(extra):
            raise MissingExtra(feature, extra)


def from_import_error(feature: str, error: ImportError) -> MissingExtra | None:
    """The MissingExtra an ImportError stands for (None: not an extra's library, a real bug)."""
    if isinstance(error, MissingExtra):
        return error
    extra = extra_of(getattr(error, "name", None))
    return MissingExtra(feature, extra) if extra else None
