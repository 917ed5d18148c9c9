"""A pytester folder a gate session runs in: the kernel modules its levers name, importable, and an empty
pytest.ini (so the project's own configuration stays out of the session)."""

from __future__ import annotations

import pytest


def gate_folder(pytester: pytest.Pytester, **modules: str) -> pytest.Pytester:
    """`modules` (name: source) written into the folder and put on sys.path; the folder, ready for gates."""
    pytester.makepyfile(**modules)
    pytester.syspathinsert()
    pytester.makeini("[pytest]\n")
    return pytester
