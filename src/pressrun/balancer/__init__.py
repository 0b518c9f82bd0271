"""The balancer: polls origin status, scores origins, answers delivery directives.

Pure parts: :mod:`events` (messages), :mod:`config`, :mod:`core` (the decision core)
and :mod:`algorithms` (the scoring algorithms, one module each). The asyncio service
lives in :mod:`aio`.
"""
