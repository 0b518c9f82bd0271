"""Fixtures for the attack suite: a throwaway certificate authority (local_ca)."""

from __future__ import annotations

import pytest
from local_ca import LocalCA, make_test_ca


@pytest.fixture(scope="session")
def test_ca(tmp_path_factory: pytest.TempPathFactory) -> LocalCA:
    """One CA for the whole session (making keys costs a little)."""
    return make_test_ca(tmp_path_factory.mktemp("ca"))
