"""Retrieval tests: rewrite asserts inside the shipped store conformance suite."""

from __future__ import annotations

import pytest

pytest.register_assert_rewrite("kitune.testing.store_contract")
