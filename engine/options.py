"""Declared settings: a msgspec Struct whose fields carry their help, flag and documented default.

Each engine declares its own settings Struct next to its code; ``gateway.settings`` composes them with the
gateway's own, and the ``voxgate serve`` flags and the README's configuration table are generated from these
declarations (``voxgate.cli``, ``python -m voxgate.gateway.settings``).
"""

from __future__ import annotations

import typing
from typing import Any

import msgspec

#: Every setting is read from the environment variable ``VOXGATE_<NAME>``.
ENV_PREFIX = "VOXGATE_"


def option(
    help: str, *, flag: str | bool = False, repeat: bool = False, shown: str | None = None
) -> msgspec.Meta:
    """Metadata of one setting, for ``Annotated[type, option(...)]``.

    ``help`` is the flag's help and the table's meaning; ``flag`` is True for a ``voxgate serve`` flag named
    after the field (``--max-voices``) or the flag's own name; ``repeat`` makes the flag repeatable (a list
    setting); ``shown`` is the default as the table shows it, where the value itself would mislead.
    """
    return msgspec.Meta(description=help, extra={"flag": flag, "repeat": repeat, "shown": shown})


class Option(msgspec.Struct, frozen=True, kw_only=True):
    """One declared setting, as the CLI and the docs see it."""

    name: str
    type: Any
    default: Any
    help: str
    flag: str | None
    repeat: bool
    shown: str | None
    group: str

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    def shown_default(self) -> str:
        """The default as the docs show it: blank for none, numbers without trailing zeros."""
        if self.shown is not None:
            return self.shown
        value = self.default
        if value in ("", (), None):
            return ""
        if isinstance(value, float):
            return f"{value:g}"
        if isinstance(value, str):
            return f"`{value}`"
        return str(value)


def options_of(settings: type[msgspec.Struct], group: str = "") -> list[Option]:
    """The declared settings of ``settings``, in field order; fields without ``option()`` are left out."""
    hints = typing.get_type_hints(settings, include_extras=True)
    found = []
    for field in msgspec.structs.fields(settings):
        hint = hints[field.name]
        metas = [m for m in getattr(hint, "__metadata__", ()) if isinstance(m, msgspec.Meta)]
        if not metas or metas[0].extra is None:
            continue
        meta, extra = metas[0], metas[0].extra
        flag = extra["flag"]
        default = field.default_factory() if field.default_factory is not msgspec.NODEFAULT else field.default
        found.append(
            Option(
                name=field.name,
                type=typing.get_args(hint)[0],
                default=default,
                help=meta.description or "",
                flag=("--" + field.name.replace("_", "-")) if flag is True else (flag or None),
                repeat=extra["repeat"],
                shown=extra["shown"],
                group=group,
            )
        )
    return found
