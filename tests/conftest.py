"""Test set-up: import path, and one torch thread for the tiny models.

Tiny models are dominated by per-op overhead, and on a shared 2-core machine a
second thread only adds spin-waiting (measured: 28x slower under load). Tests
marked `real` (the 135M target) get every core back for their duration, or
SPECLENS_TEST_THREADS of them when the machine is shared.
"""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _threads_for_real_models(request):
    if request.node.get_closest_marker("real") is None:
        yield
        return
    torch.set_num_threads(int(os.environ.get("SPECLENS_TEST_THREADS", os.cpu_count() or 1)))
    try:
        yield
    finally:
        torch.set_num_threads(1)
