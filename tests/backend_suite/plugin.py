"""A pytest plugin that adds this package's Core AI flows to the backend suite's ``all_flows()``.

Loaded with ``-p backend_suite.plugin`` before the suite's ``conftest.py``
(which reads ``all_flows()`` when it is imported), so the installed wheel is
not edited.
"""

from __future__ import annotations

import backend_suite.torchvision_ops  # noqa: F401  (before the suite's models import torchvision)
import executorch.backends.test.suite.flow as suite_flow

_upstream_all_flows = suite_flow.all_flows


def all_flows() -> dict:
    from backend_suite.flows import FLOWS

    return _upstream_all_flows() | {flow.name: flow for flow in FLOWS}


suite_flow.all_flows = all_flows
