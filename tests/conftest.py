"""Test setup: Triton kernels run in the interpreter on the CPU (set before triton is imported)."""
import os
import sys
import warnings

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.dirname(__file__))  # tests/openai_stub.py, tests/mutants.py
warnings.filterwarnings("ignore", message="divide by zero encountered", category=RuntimeWarning)
warnings.filterwarnings("ignore", message="invalid value encountered", category=RuntimeWarning)


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _no_test_leaves_children_refused():
    """A hard stop refuses new children process-wide while it kills; a test that left it so would fail
    every later test that starts a child, far from the cause. Name the test instead."""
    yield
    from kernel_agent.sanitizer import isolation
    if isolation._stopping.is_set():
        isolation.resume_starting()
        pytest.fail("this test left the sanitizer runner refusing new children (a stop without its release)")
