"""Fixtures shared by the test files."""

import pytest

import chorus


@pytest.fixture(scope="module")
def comm():
    """A one-rank communicator, for tests that need no peer."""
    uid = chorus.UniqueId.new(1)
    c = chorus.Comm(uid, 0, 1)
    yield c
    c.destroy()
