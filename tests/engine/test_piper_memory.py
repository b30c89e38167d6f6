"""The C-heap tuning Piper does for memory is safe to call anywhere (a no-op off glibc)."""

from __future__ import annotations

import platform

from voxgate.engine import piper


def test_malloc_tuning_and_trim_run_and_find_glibc_where_it_is() -> None:
    piper.tune_malloc()
    piper.release_freed_memory()
    assert (piper._LIBC is not None) == (platform.libc_ver()[0] == "glibc")
