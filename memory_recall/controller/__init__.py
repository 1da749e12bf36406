"""The recall controller: gates, input resolution, persisted replay and fresh recall (reference §2).

``run_recall(request)`` / :meth:`RecallController.run_recall` is the one recall entry used by the CLI, the
Python API and the HTTP service.
"""

from memory_recall.controller.controller import ChatEventReport, RecallController, RecordStatus, run_recall
from memory_recall.controller.gates import REASON_TEXT, REASON_TEXT_EN, Reason, RecallResponse, reason_text
from memory_recall.controller.inputs import RecallRequest, ResolvedInput, parse_request, resolve_input
from memory_recall.controller.replay import ReuseDecision, is_stale, reuse_decision

__all__ = [
    "REASON_TEXT",
    "REASON_TEXT_EN",
    "ChatEventReport",
    "Reason",
    "RecallController",
    "RecallRequest",
    "RecallResponse",
    "RecordStatus",
    "ResolvedInput",
    "ReuseDecision",
    "is_stale",
    "parse_request",
    "reason_text",
    "resolve_input",
    "reuse_decision",
    "run_recall",
]
