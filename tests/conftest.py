"""Shared fixtures."""

import pytest
from factories import PRIOR_NAMES


@pytest.fixture(params=PRIOR_NAMES)
def prior_name(request):
    return request.param
